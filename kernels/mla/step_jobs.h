#ifndef MLASERVE_KERNELS_MLA_STEP_JOBS_H_
#define MLASERVE_KERNELS_MLA_STEP_JOBS_H_

#include <cstdint>
#include <vector>

namespace mlaserve {

// The jobs of a batch's projection and combine steps (kernels/mla/batch_steps.h), written
// once for every place memory can be named: `Ref` is a BufferRef in the steps and a device
// address once a device has lowered them (npu::GmBuffer). Map() is that lowering.

// C [rows][n] = A [rows][k] . B, with B [k][n] or (transpose_b) [n][k]; A and B bf16, fp32
// accumulation in depth chunks of kProjectionDepthChunk in the matrix unit's order
// (kernels/core/matmul.h); C fp32, or rounded to bf16 (nearest even) if `c_bf16`. Strides
// are in elements. With `b_tiles`, B is in the matrix unit's layout (PackMatrixTiles in
// kernels/core/matmul.h, column blocks of 128 of its [k][n] or [n][k]; `ldb` unused): read in
// place, never copied.
template <typename Ref>
struct BasicProjectionJob {
  Ref a;
  int64_t lda = 0;
  Ref b;
  int64_t ldb = 0;
  bool transpose_b = false;
  bool b_tiles = false;
  Ref c;
  int64_t ldc = 0;
  bool c_bf16 = false;
  int rows = 0;
  int n = 0;
  int k = 0;

  // The same job with each reference replaced by resolve(reference).
  template <typename Resolve>
  auto Map(Resolve&& resolve) const {
    using To = decltype(resolve(a));
    return BasicProjectionJob<To>{resolve(a), lda, resolve(b), ldb,  transpose_b, b_tiles,
                                  resolve(c), ldc, c_bf16,     rows, n,           k};
  }
};

// Rows of `parts` partial attention results over disjoint keys (each dense [rows][dv] fp32
// with lse [rows] fp32) merged by LSE into `out` (rows `out_stride` elements apart, fp32 or
// rounded to bf16) and `lse` (`lse_stride` apart). The destination may be a part's own rows.
template <typename Ref>
struct BasicCombineJob {
  struct Part {
    Ref out;
    Ref lse;
  };
  std::vector<Part> parts;
  int rows = 0;
  int dv = 0;
  Ref out;
  int64_t out_stride = 0;
  bool out_bf16 = false;
  Ref lse;
  int64_t lse_stride = 1;

  template <typename Resolve>
  auto Map(Resolve&& resolve) const {
    using To = decltype(resolve(out));
    BasicCombineJob<To> mapped{{},         rows,     dv,           resolve(out),
                               out_stride, out_bf16, resolve(lse), lse_stride};
    for (const Part& p : parts) mapped.parts.push_back({resolve(p.out), resolve(p.lse)});
    return mapped;
  }
};

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_MLA_STEP_JOBS_H_
