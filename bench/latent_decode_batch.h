#ifndef MLASERVE_BENCH_LATENT_DECODE_BATCH_H_
#define MLASERVE_BENCH_LATENT_DECODE_BATCH_H_

#include <cstdint>
#include <span>

#include "kernels/core/bfloat16.h"
#include "kernels/core/fp8_paged_kv_cache.h"
#include "kernels/mla/decode_batch.h"

namespace mlaserve::bench {

// FlashMLA's dense-decode problem (DeepSeek-V3's latent cache, queries already absorbed) as the
// GPU benchmarks build it.
inline constexpr int kLatentWidth = 512;
inline constexpr int kRopeWidth = 64;
inline constexpr int kKeyWidth = kLatentWidth + kRopeWidth;
// Random pages a benchmark's pool repeats (ResidentInputs::AddRepeated).
inline constexpr int kDistinctPoolPages = 256;
inline constexpr float kDeepSeekScale = 0.07216878f;  // 1 / sqrt(192): MLA's unabsorbed width

// A pool on the device that `name` stands for (ResidentInputs::AddRepeated).
struct NamedPool {
  const void* name = nullptr;
  int64_t pages = 0;
  int page_size = 64;
  bool fp8 = false;  // SnapMLA's FP8 pages in `fp8_layout`, else bf16 [page][kKeyWidth]
  Fp8PageLayout fp8_layout{};
};

// One latent-space group of `batch` members, member b on pages
// table[b * pages_per_seq, (b + 1) * pages_per_seq) with `sk` keys and its queries
// q[b][sq][heads][kKeyWidth]; bf16 answers; split over `parallel_units`.
DecodeBatch MakeLatentBatch(int batch, int heads, int sq, int sk, std::span<const int32_t> table,
                            int pages_per_seq, const Bf16* q, const NamedPool& pool,
                            int parallel_units);

}  // namespace mlaserve::bench

#endif  // MLASERVE_BENCH_LATENT_DECODE_BATCH_H_
