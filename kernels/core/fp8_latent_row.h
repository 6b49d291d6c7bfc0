#ifndef MLASERVE_KERNELS_CORE_FP8_LATENT_ROW_H_
#define MLASERVE_KERNELS_CORE_FP8_LATENT_ROW_H_

#include <cstddef>

#include "kernels/core/bfloat16.h"
#include "kernels/core/float8_e4m3.h"

namespace mlaserve {

// SnapMLA's RoPE-aware per-token FP8 form of one latent row [content (dl) | rope (dr)]
// (SnapMLA §3.1, Eq. 6; docs/numerics.md, "FP8 latent cache"). The cache stores keys in it,
// and the FP8 kernels put each query row (one token, one head) in it the same way:
//
//     scale   = max(amax |content|, kFp8AmaxFloor) / 448            fp32
//     content = e4m3(content / scale)                                nearest even, saturating
//     rope    = bf16(rope / scale)                                   nearest even
//
// The RoPE part stays in bf16 but lives in the content's scaled domain, so one product
// q_scale * k_scale turns the whole dot product back into real units. One corner differs
// from SnapMLA's formula: a row whose RoPE would overflow bf16 after the division (content
// all but zero beside a large RoPE) takes the smallest larger scale that keeps it finite
// (amax |rope| / 2^120); every stored row is then finite.
//
// The divisions are real divisions (not products with a reciprocal), so a client that
// quantises on its side with the formula above produces the same bytes.
inline constexpr float kFp8AmaxFloor = 1e-26f;  // SGLang-FluentLLM's clamp

struct Fp8LatentRow {
  Fp8E4m3* content = nullptr;  // [dl]
  float* scale = nullptr;
  Bf16* rope = nullptr;  // [dr]
};

// Quantises `row` ([dl + dr], finite) into `out`.
void QuantizeLatentRow(const float* row, int dl, int dr, Fp8LatentRow out);
void QuantizeLatentRow(const Bf16* row, int dl, int dr, Fp8LatentRow out);

// The same row as one record of the wire's FP8 form (AppendKvChunk.fp8_rows): dl e4m3 bytes,
// the fp32 scale (host byte order: little-endian on every supported host), dr bf16;
// dl + 4 + 2 dr bytes at `record`.
void QuantizeLatentRowToRecord(const Bf16* row, int dl, int dr, std::byte* record);

// The row the quantised form stands for: content * scale, rope * scale (fp32).
void DequantizeLatentRow(const Fp8E4m3* content, float scale, const Bf16* rope, int dl, int dr,
                         float* row);

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_CORE_FP8_LATENT_ROW_H_
