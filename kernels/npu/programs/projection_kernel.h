#ifndef MLASERVE_KERNELS_NPU_PROGRAMS_PROJECTION_KERNEL_H_
#define MLASERVE_KERNELS_NPU_PROGRAMS_PROJECTION_KERNEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/mla/step_jobs.h"
#include "kernels/npu/device_kernel.h"
#include "kernels/npu/global_memory.h"

namespace mlaserve::npu {

// One GEMM of a batched up-projection (one head), its operands in GM
// (kernels/mla/step_jobs.h): FIX writes C as fp32 or rounded to bf16 on the way out.
using ProjectionJob = mlaserve::BasicProjectionJob<GmBuffer>;

// The absorb form's up-projections on the cube (q_nope . W_UK and bf16(o_lat) . W_UV^T): each
// job is cut into 128 x 128 output tiles dealt to the AIC blocks; a tile streams its A and B
// depth chunks GM -> L1 and accumulates them in L0C (weights in the matrix unit's tile layout,
// `b_tiles`, are read by the MMAD where they lie: the DMA is modelled, no host copy made). The
// matrix unit's summation order does
// not depend on that chunking (kernels/core/matmul.h), so the result equals MatmulNN /
// MatmulNT on the host bit for bit. AIC-only.
class ProjectionKernel final : public DeviceKernel {
 public:
  ProjectionKernel(std::vector<ProjectionJob> jobs, int max_blocks);

  std::string Name() const override { return "projection"; }
  int BlockDim() const override { return static_cast<int>(tiles_.size()); }
  double Flops() const override;
  absl::Status Record(Program& program) const override;

 private:
  struct OutputTile {
    int job;
    int m0;
    int n0;
  };
  std::vector<ProjectionJob> jobs_;
  std::vector<std::vector<OutputTile>> tiles_;  // per block
};

}  // namespace mlaserve::npu

#endif  // MLASERVE_KERNELS_NPU_PROGRAMS_PROJECTION_KERNEL_H_
