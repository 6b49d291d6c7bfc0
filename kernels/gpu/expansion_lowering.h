#ifndef MLASERVE_KERNELS_GPU_EXPANSION_LOWERING_H_
#define MLASERVE_KERNELS_GPU_EXPANSION_LOWERING_H_

#include <cstddef>
#include <cstdint>
#include <span>

#include "absl/status/statusor.h"
#include "kernels/gpu/gpu_program.h"

namespace mlaserve::gpu {

// A prefix level's naive-form K/V computed on the device from its copy of the latent cache
// (the store's expansions, docs/numerics.md "The two MLA formulations"), for every head:
//   K[h] = [bf16(c_kv . W_UK[h]^T), k_pe]   [tokens][dn + dr]
//   V[h] =  bf16(c_kv . W_UV[h]^T)          [tokens][dv]
// over tokens [begin, end) of the sequence whose block table is `pages` in a bf16 page pool.
struct ExpansionSpec {
  DevicePtr pool = 0;       // the bf16 pages: page p at pool + p * page_stride
  int64_t page_stride = 0;  // bytes
  int page_size = 0;        // tokens a page
  std::span<const int32_t> pages;
  int32_t begin = 0;
  int32_t end = 0;
  DevicePtr kv_b = 0;  // the layer's kv_b_proj [heads][dn + dv][dl] bf16 on the device
  int heads = 0;
  int dn = 0;
  int dr = 0;
  int dl = 0;
  int dv = 0;
  DevicePtr keys = 0;    // out: [heads][end - begin][dn + dr] bf16
  DevicePtr values = 0;  // out: [heads][end - begin][dv] bf16
};

// The program (gpu_program.h): one grouped GEMM launch, a job per (page, head, K or V), and
// one copy launch for the RoPE columns. With `upload` empty it only counts the upload's
// bytes (into the returned program's upload_bytes); then again with room for them.
absl::StatusOr<Program> LowerExpansion(const ExpansionSpec& spec, DevicePtr upload_to,
                                       std::span<std::byte> upload);

}  // namespace mlaserve::gpu

#endif  // MLASERVE_KERNELS_GPU_EXPANSION_LOWERING_H_
