#ifndef MLASERVE_KERNELS_NPU_PROGRAMS_ATTENTION_WORKLOAD_H_
#define MLASERVE_KERNELS_NPU_PROGRAMS_ATTENTION_WORKLOAD_H_

#include <algorithm>
#include <cstdint>
#include <variant>
#include <vector>

#include "kernels/core/fp8_paged_kv_cache.h"
#include "kernels/npu/global_memory.h"

namespace mlaserve::npu {

// The paper's task height: up to 256 query rows (heads x Sq) share one pass over the keys.
inline constexpr int kMaxGroupRows = 256;

// Keys of a latent (absorb-form) group: one request's pages of the paged latent cache.
// Values are the first dv columns of each key row (MLA's c_kv).
struct PagedKeys {
  GmBuffer pool;  // [num_pages][page_size][width] bf16
  int page_size = 0;
  int width = 0;               // = dk
  std::vector<int32_t> pages;  // the group's pages in token order
  int first_token = 0;         // key 0 of the group is this token of the pages (a suffix)
};

// Keys of a latent group in the FP8 cache (kernels/core/fp8_paged_kv_cache.h): one
// request's pages of the pool, token 0 of the group at `first_token`. Values are the keys'
// e4m3 content. Such a group runs SnapMLA over AMLA (kernels/mla/snap_amla.h).
struct Fp8Keys {
  GmBuffer pool;  // pages layout.stride() bytes apart
  Fp8PageLayout layout;
  std::vector<int32_t> pages;
  int first_token = 0;
};

// Keys of a naive-form group: one head of an expanded K/V, dense rows.
struct DenseKeys {
  GmBuffer k;  // [length][ldk] bf16, the first dk columns used
  int64_t ldk = 0;
  GmBuffer v;  // [length][ldv] bf16, the first dv columns used
  int64_t ldv = 0;
};

// Up to kMaxGroupRows query rows that attend over the same keys.
struct RowGroup {
  GmBuffer q;  // [rows][dk] bf16
  int rows = 0;
  std::vector<int32_t> visible;  // row i sees keys [0, visible[i])
  std::variant<PagedKeys, Fp8Keys, DenseKeys> keys;
  GmBuffer out;            // normalised rows, `out_stride` elements apart
  GmBuffer lse;            // fp32, natural log, `lse_stride` elements apart
  int64_t out_stride = 0;  // 0: dv (dense rows)
  int64_t lse_stride = 1;
  bool out_bf16 = false;  // rows rounded to bf16 (the input of an up-projection)

  int length() const {
    return visible.empty() ? 0 : *std::max_element(visible.begin(), visible.end());
  }
};

struct AttentionWorkload {
  int dk = 0;
  int dv = 0;
  float softmax_scale = 0;
  bool fp8_quantize_queries = true;  // SnapAmlaOptions, for Fp8Keys groups
  std::vector<RowGroup> groups;

  bool HasFp8() const {
    return std::any_of(groups.begin(), groups.end(),
                       [](const RowGroup& g) { return std::holds_alternative<Fp8Keys>(g.keys); });
  }
};

}  // namespace mlaserve::npu

#endif  // MLASERVE_KERNELS_NPU_PROGRAMS_ATTENTION_WORKLOAD_H_
