#ifndef MLASERVE_SERVER_ENGINE_KV_EXPANDED_KV_H_
#define MLASERVE_SERVER_ENGINE_KV_EXPANDED_KV_H_

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kernels/core/bfloat16.h"
#include "kernels/core/fp8_paged_kv_cache.h"
#include "kernels/core/paged_kv_cache.h"
#include "kernels/core/up_projection.h"
#include "server/engine/kv/prefix_key.h"

namespace mlaserve::engine {

class KvStore;

// One head's expanded keys [length][ldk] (k_nope then k_pe, dqk wide) and values
// [length][ldv] (dv wide): what DenseKvSource consumes.
struct HeadKv {
  const Bf16* k = nullptr;
  int64_t ldk = 0;
  const Bf16* v = nullptr;
  int64_t ldv = 0;
  int length = 0;
};

// The naive-form K/V of a run of latent tokens, for every head of one layer (docs/numerics.md, "The
// two MLA formulations"):
//   K[h] = [bf16(c_kv . W_UK[h]^T), k_pe]   [tokens][dn + dr]
//   V[h] =  bf16(c_kv . W_UV[h]^T)          [tokens][dv]
// built with ExpandHeadKv, so it holds exactly the bits the naive kernel would compute. It
// costs H (dqk + dv) bf16 values per token: 80 KiB per token and layer for DeepSeek-V3,
// 71 times the latent row it comes from.
class ExpandedKvData {
 public:
  ExpandedKvData() = default;
  ExpandedKvData(ExpandedKvData&&) = default;  // the vectors' buffers, so k_ and v_, move along
  ExpandedKvData& operator=(ExpandedKvData&&) = default;
  ExpandedKvData(const ExpandedKvData&) = delete;
  ExpandedKvData& operator=(const ExpandedKvData&) = delete;

  // Bytes of K and V for `tokens` tokens.
  static int64_t Bytes(int heads, int64_t tokens, int dqk, int dv);

  // Expands tokens [begin, end) of the sequence whose block table in `pool` is `pages`.
  static ExpandedKvData Build(const PagedKvCache& pool, std::span<const int32_t> pages,
                              int32_t begin, int32_t end, int dr, const UpProjection& weights);
  // The same from the FP8 cache: each latent row dequantised (c_kv * scale, k_pe * scale)
  // first. TyphoonMLA's naive part then runs in bf16 over an FP8 prefix.
  static ExpandedKvData BuildFromFp8(const Fp8PagedKvCache& pool, std::span<const int32_t> pages,
                                     int32_t begin, int32_t end, int dr,
                                     const UpProjection& weights);

  // K/V held in a device's own memory (expansion_builder.h): `keys` and `values` are that
  // device's addresses, laid out as keys() and values() say, never read on the host;
  // `storage` frees them when the data goes.
  static std::unique_ptr<ExpandedKvData> OnDevice(int heads, int tokens, int dqk, int dv,
                                                  const Bf16* keys, const Bf16* values,
                                                  std::shared_ptr<void> storage);

  int heads() const { return heads_; }
  int tokens() const { return tokens_; }
  bool on_device() const { return storage_ != nullptr; }
  int64_t bytes() const { return Bytes(heads_, tokens_, dqk_, dv_); }
  HeadKv Head(int head) const;
  // All heads at once, head-major: keys [heads][tokens][dqk], values [heads][tokens][dv].
  std::span<const Bf16> keys() const { return {k_, static_cast<size_t>(heads_) * tokens_ * dqk_}; }
  std::span<const Bf16> values() const { return {v_, static_cast<size_t>(heads_) * tokens_ * dv_}; }

 private:
  // The expansion of tokens [begin, end), whose fp32 latent rows rows_of(first, n) gives in
  // chunks as (rows, row stride).
  template <typename Rows>
  static ExpandedKvData Expand(int32_t begin, int32_t end, int dr, const UpProjection& weights,
                               Rows rows_of);

  int heads_ = 0;
  int tokens_ = 0;
  int dqk_ = 0;
  int dv_ = 0;
  std::vector<Bf16> host_k_;  // [heads][tokens][dqk], when on the host
  std::vector<Bf16> host_v_;  // [heads][tokens][dv]
  const Bf16* k_ = nullptr;   // host_k_'s data, or a device's address
  const Bf16* v_ = nullptr;
  std::shared_ptr<void> storage_;  // a device's memory
};

// A pinned reference to a prefix's expanded K/V for one layer, from
// KvStore::GetOrBuildExpanded. While it lives the data is neither evicted nor freed (and its
// prefix stays alive); destroying it makes the data evictable again. Must not outlive the
// store. Move-only.
class ExpandedKv {
 public:
  ExpandedKv(ExpandedKv&& other) noexcept;
  ExpandedKv& operator=(ExpandedKv&& other) noexcept;
  ExpandedKv(const ExpandedKv&) = delete;
  ExpandedKv& operator=(const ExpandedKv&) = delete;
  ~ExpandedKv();

  PrefixKey prefix() const { return prefix_; }
  int layer() const { return layer_; }
  // The token positions covered, in the numbering of sequences started on the prefix: a
  // prefix's expansion covers only the tokens it adds to its parent.
  int32_t begin() const { return begin_; }
  int32_t end() const { return begin_ + data_->tokens(); }
  int heads() const { return data_->heads(); }
  HeadKv Head(int head) const { return data_->Head(head); }
  std::span<const Bf16> keys() const { return data_->keys(); }
  std::span<const Bf16> values() const { return data_->values(); }

 private:
  friend class KvStore;
  ExpandedKv(KvStore* store, PrefixKey prefix, int layer, int32_t begin,
             const ExpandedKvData* data);
  void Release();

  KvStore* store_ = nullptr;
  PrefixKey prefix_ = 0;
  int layer_ = 0;
  int32_t begin_ = 0;
  const ExpandedKvData* data_ = nullptr;
};

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_KV_EXPANDED_KV_H_
