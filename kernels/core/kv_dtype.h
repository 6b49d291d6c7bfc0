#ifndef MLASERVE_KERNELS_CORE_KV_DTYPE_H_
#define MLASERVE_KERNELS_CORE_KV_DTYPE_H_

#include <cstdint>

#include "kernels/core/fp8_paged_kv_cache.h"

namespace mlaserve {

// How a latent KV cache holds its rows: bf16 (c_kv then k_pe, 2 (dl + dr) bytes a token) or
// SnapMLA's RoPE-aware per-token FP8 (kernels/core/fp8_paged_kv_cache.h, dl + 4 + 2 dr).
enum class KvDtype { kBf16, kFp8 };

constexpr const char* KvDtypeName(KvDtype dtype) {
  return dtype == KvDtype::kBf16 ? "bf16" : "fp8";
}

constexpr int64_t LatentBytesPerToken(KvDtype dtype, int dl, int dr) {
  return dtype == KvDtype::kBf16 ? 2 * static_cast<int64_t>(dl + dr)
                                 : Fp8PageLayout::BytesPerToken(dl, dr);
}

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_CORE_KV_DTYPE_H_
