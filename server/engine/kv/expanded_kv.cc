#include "server/engine/kv/expanded_kv.h"

#include <algorithm>
#include <utility>

#include "kernels/core/fp8_latent_row.h"
#include "kernels/core/kv_block_source.h"
#include "kernels/core/tensor_view.h"
#include "kernels/mla/naive.h"
#include "server/engine/kv/kv_store.h"

namespace mlaserve::engine {
namespace {

// Tokens widened to fp32 at a time: bounds the scratch (4.5 MiB of 576-wide rows) for long
// prefixes while keeping each GEMM large enough to run at full rate.
constexpr int32_t kExpandChunkTokens = 2048;

}  // namespace

int64_t ExpandedKvData::Bytes(int heads, int64_t tokens, int dqk, int dv) {
  return static_cast<int64_t>(heads) * tokens * (dqk + dv) * static_cast<int64_t>(sizeof(Bf16));
}

template <typename Rows>
ExpandedKvData ExpandedKvData::Expand(int32_t begin, int32_t end, int dr,
                                      const UpProjection& weights, Rows rows_of) {
  ExpandedKvData data;
  data.heads_ = weights.heads();
  data.tokens_ = end - begin;
  data.dqk_ = weights.dn() + dr;
  data.dv_ = weights.dv();
  data.host_k_.resize(static_cast<size_t>(data.heads_) * data.tokens_ * data.dqk_);
  data.host_v_.resize(static_cast<size_t>(data.heads_) * data.tokens_ * data.dv_);
  data.k_ = data.host_k_.data();
  data.v_ = data.host_v_.data();
  for (int32_t chunk = begin; chunk < end; chunk += kExpandChunkTokens) {
    const int n = std::min(kExpandChunkTokens, end - chunk);
    const auto [latent, ld] = rows_of(chunk, n);
    const int64_t first = chunk - begin;
    for (int h = 0; h < data.heads_; ++h) {
      const int64_t head_row = static_cast<int64_t>(h) * data.tokens_ + first;
      ExpandHeadKv(latent, ld, n, dr, weights, h, data.host_k_.data() + head_row * data.dqk_,
                   data.host_v_.data() + head_row * data.dv_);
    }
  }
  return data;
}

ExpandedKvData ExpandedKvData::Build(const PagedKvCache& pool, std::span<const int32_t> pages,
                                     int32_t begin, int32_t end, int dr,
                                     const UpProjection& weights) {
  // The prefix's tokens as one request of a paged batch, read in fp32 blocks the way the
  // kernels read them.
  const std::vector<int32_t> seqlens = {end};
  const PagedSequences table{
      *TensorView<const int32_t, 2>::Create(pages, {1, static_cast<int64_t>(pages.size())}),
      seqlens};
  PagedLatentSource source(pool, table, /*request=*/0, weights.dl());
  return Expand(begin, end, dr, weights, [&](int32_t first, int n) {
    const KvBlock latent = source.Load(first, n);
    return std::pair{latent.k, latent.ldk};
  });
}

ExpandedKvData ExpandedKvData::BuildFromFp8(const Fp8PagedKvCache& pool,
                                            std::span<const int32_t> pages, int32_t begin,
                                            int32_t end, int dr, const UpProjection& weights) {
  const Fp8PageLayout& layout = pool.layout;
  const int width = layout.dl + layout.dr;
  std::vector<float> rows(static_cast<size_t>(kExpandChunkTokens) * width);
  return Expand(begin, end, dr, weights, [&](int32_t first, int n) {
    for (int t = 0; t < n; ++t) {
      const int32_t token = first + t;
      const int32_t page = pages[token / layout.page_size];
      const int row = token % layout.page_size;
      DequantizeLatentRow(pool.content(page, row), pool.scale(page, row), pool.rope(page, row),
                          layout.dl, layout.dr, rows.data() + static_cast<int64_t>(t) * width);
    }
    return std::pair<const float*, int64_t>{rows.data(), width};
  });
}

std::unique_ptr<ExpandedKvData> ExpandedKvData::OnDevice(int heads, int tokens, int dqk, int dv,
                                                         const Bf16* keys, const Bf16* values,
                                                         std::shared_ptr<void> storage) {
  auto data = std::make_unique<ExpandedKvData>();
  data->heads_ = heads;
  data->tokens_ = tokens;
  data->dqk_ = dqk;
  data->dv_ = dv;
  data->k_ = keys;
  data->v_ = values;
  data->storage_ = std::move(storage);
  return data;
}

HeadKv ExpandedKvData::Head(int head) const {
  const int64_t row = static_cast<int64_t>(head) * tokens_;
  return HeadKv{k_ + row * dqk_, dqk_, v_ + row * dv_, dv_, tokens_};
}

ExpandedKv::ExpandedKv(KvStore* store, PrefixKey prefix, int layer, int32_t begin,
                       const ExpandedKvData* data)
    : store_(store), prefix_(prefix), layer_(layer), begin_(begin), data_(data) {}

ExpandedKv::ExpandedKv(ExpandedKv&& other) noexcept
    : store_(std::exchange(other.store_, nullptr)),
      prefix_(other.prefix_),
      layer_(other.layer_),
      begin_(other.begin_),
      data_(other.data_) {}

ExpandedKv& ExpandedKv::operator=(ExpandedKv&& other) noexcept {
  if (this != &other) {
    Release();
    store_ = std::exchange(other.store_, nullptr);
    prefix_ = other.prefix_;
    layer_ = other.layer_;
    begin_ = other.begin_;
    data_ = other.data_;
  }
  return *this;
}

ExpandedKv::~ExpandedKv() { Release(); }

void ExpandedKv::Release() {
  if (store_ != nullptr) std::exchange(store_, nullptr)->ReleaseExpanded(prefix_, layer_);
}

}  // namespace mlaserve::engine
