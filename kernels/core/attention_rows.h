#ifndef MLASERVE_KERNELS_CORE_ATTENTION_ROWS_H_
#define MLASERVE_KERNELS_CORE_ATTENTION_ROWS_H_

#include <cstdint>
#include <span>

namespace mlaserve {

// The unit every attention kernel here works on: `count` query rows against one stream of
// keys. A row is one (query token, head) pair; row i may see keys [0, visible[i]), which
// expresses variable lengths, causal masking among MTP tokens and empty sequences alike.
struct QueryRows {
  const float* q = nullptr;  // [count][dk], bf16-representable values
  int64_t ldq = 0;
  int count = 0;
  int dk = 0;
  std::span<const int32_t> visible;  // [count]
};

// Where a kernel writes: normalised fp32 outputs (the cast to the wire dtype is the caller's)
// and natural-log LSEs; a row with no visible key gets zeros and -inf.
struct RowOutputs {
  float* out = nullptr;  // [count][dv]
  int64_t ldo = 0;
  float* lse = nullptr;  // [count]
};

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_CORE_ATTENTION_ROWS_H_
