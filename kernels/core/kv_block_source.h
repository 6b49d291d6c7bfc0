#ifndef MLASERVE_KERNELS_CORE_KV_BLOCK_SOURCE_H_
#define MLASERVE_KERNELS_CORE_KV_BLOCK_SOURCE_H_

#include <cstdint>
#include <vector>

#include "kernels/core/bfloat16.h"
#include "kernels/core/paged_kv_cache.h"

namespace mlaserve {

// Keys and values for a block of consecutive tokens, widened to fp32.
struct KvBlock {
  const float* k = nullptr;  // [count][key_width]
  int64_t ldk = 0;
  const float* v = nullptr;  // [count][value_width]
  int64_t ldv = 0;
};

// A stream of keys/values that kernels walk block by block, whatever the storage: paged
// latent cache (absorb form) or expanded per-head K/V (naive form).
class KvBlockSource {
 public:
  virtual ~KvBlockSource() = default;
  virtual int length() const = 0;
  virtual int key_width() const = 0;
  virtual int value_width() const = 0;
  // Tokens [begin, begin + count); the block stays valid until the next Load.
  virtual KvBlock Load(int begin, int count) = 0;
  // The same tokens' rows in place, bf16, nothing copied: keys[t] (key_width values) and
  // values[t] (value_width values) for t < count, valid while the source's memory is.
  virtual void Rows(int begin, int count, const Bf16** keys, const Bf16** values) const = 0;
};

// One request's tokens in a paged latent cache, from `first_token` on (a suffix after a
// shared prefix starts mid-sequence). MLA's values are the first `value_width` columns of
// the latent keys (c_kv), so V aliases K and nothing is copied twice.
class PagedLatentSource final : public KvBlockSource {
 public:
  PagedLatentSource(const PagedKvCache& cache, const PagedSequences& seqs, int request,
                    int value_width, int first_token = 0);

  int length() const override { return length_; }
  int key_width() const override { return cache_.width(); }
  int value_width() const override { return value_width_; }
  KvBlock Load(int begin, int count) override;
  void Rows(int begin, int count, const Bf16** keys, const Bf16** values) const override;

 private:
  PagedKvCache cache_;
  PagedSequences seqs_;
  int request_;
  int first_token_;
  int length_;
  int value_width_;
  std::vector<float> buffer_;
};

// Keys [length][key_width] and values [length][value_width] in contiguous bf16 arrays (one
// head of an expanded naive-form cache).
class DenseKvSource final : public KvBlockSource {
 public:
  DenseKvSource(const Bf16* keys, int64_t ldk, int key_width, const Bf16* values, int64_t ldv,
                int value_width, int length);

  int length() const override { return length_; }
  int key_width() const override { return key_width_; }
  int value_width() const override { return value_width_; }
  KvBlock Load(int begin, int count) override;
  void Rows(int begin, int count, const Bf16** keys, const Bf16** values) const override;

 private:
  const Bf16* keys_;
  int64_t ldk_;
  int key_width_;
  const Bf16* values_;
  int64_t ldv_;
  int value_width_;
  int length_;
  std::vector<float> k_buffer_;
  std::vector<float> v_buffer_;
};

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_CORE_KV_BLOCK_SOURCE_H_
