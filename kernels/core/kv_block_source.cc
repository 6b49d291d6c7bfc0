#include "kernels/core/kv_block_source.h"

#include <algorithm>

#include "kernels/core/vector_ops.h"

namespace mlaserve {
PagedLatentSource::PagedLatentSource(const PagedKvCache& cache, const PagedSequences& seqs,
                                     int request, int value_width, int first_token)
    : cache_(cache),
      seqs_(seqs),
      request_(request),
      first_token_(first_token),
      length_(std::max(0, seqs.seqlens[request] - first_token)),
      value_width_(value_width) {}

KvBlock PagedLatentSource::Load(int begin, int count) {
  const int width = cache_.width();
  buffer_.resize(static_cast<size_t>(count) * width);
  const int page_size = cache_.page_size();
  // Copy page runs: within a page the token rows are consecutive.
  const int first = first_token_ + begin;
  const int last = first + count;
  for (int t = first; t < last;) {
    const int in_page = t % page_size;
    const int run = std::min(page_size - in_page, last - t);
    const Bf16* src = TokenRow(cache_, seqs_, request_, t);
    const int64_t row_stride = cache_.pages.stride(1);
    float* dst = buffer_.data() + static_cast<int64_t>(t - first) * width;
    if (row_stride == width) {
      WidenBf16(src, static_cast<int64_t>(run) * width, dst);
    } else {
      for (int r = 0; r < run; ++r) WidenBf16(src + r * row_stride, width, dst + r * width);
    }
    t += run;
  }
  return KvBlock{buffer_.data(), width, buffer_.data(), width};
}

void PagedLatentSource::Rows(int begin, int count, const Bf16** keys, const Bf16** values) const {
  for (int t = 0; t < count; ++t) {
    keys[t] = values[t] =
        TokenRow(cache_, seqs_, request_, first_token_ + begin + t);  // V = c_kv, K's head
  }
}

DenseKvSource::DenseKvSource(const Bf16* keys, int64_t ldk, int key_width, const Bf16* values,
                             int64_t ldv, int value_width, int length)
    : keys_(keys),
      ldk_(ldk),
      key_width_(key_width),
      values_(values),
      ldv_(ldv),
      value_width_(value_width),
      length_(length) {}

KvBlock DenseKvSource::Load(int begin, int count) {
  k_buffer_.resize(static_cast<size_t>(count) * key_width_);
  v_buffer_.resize(static_cast<size_t>(count) * value_width_);
  for (int r = 0; r < count; ++r) {
    WidenBf16(keys_ + (begin + r) * ldk_, key_width_, k_buffer_.data() + r * key_width_);
    WidenBf16(values_ + (begin + r) * ldv_, value_width_, v_buffer_.data() + r * value_width_);
  }
  return KvBlock{k_buffer_.data(), key_width_, v_buffer_.data(), value_width_};
}

void DenseKvSource::Rows(int begin, int count, const Bf16** keys, const Bf16** values) const {
  for (int t = 0; t < count; ++t) {
    keys[t] = keys_ + (begin + t) * ldk_;
    values[t] = values_ + (begin + t) * ldv_;
  }
}

}  // namespace mlaserve
