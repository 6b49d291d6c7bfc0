#ifndef MLASERVE_KERNELS_NPU_PROGRAMS_COMBINE_KERNEL_H_
#define MLASERVE_KERNELS_NPU_PROGRAMS_COMBINE_KERNEL_H_

#include <string>
#include <vector>

#include "kernels/npu/device_kernel.h"
#include "kernels/npu/global_memory.h"

namespace mlaserve::npu {

// Rows of two partial attention results over disjoint keys, and where their merge goes.
// Rows are dense ([rows][dv] fp32, lse [rows] fp32); the destination may be either source.
struct CombineJob {
  GmBuffer a_out, a_lse;
  GmBuffer b_out, b_lse;
  GmBuffer out, lse;
  int rows = 0;
  int dv = 0;
};

// The LSE combine of design §2.3 on the vector cores (CombineLse per row, as on the host):
// rows are dealt in chunks of 8 to every AIV of the grid. AIV-only.
class CombineKernel final : public DeviceKernel {
 public:
  CombineKernel(std::vector<CombineJob> jobs, int max_blocks);

  std::string Name() const override { return "lse_combine"; }
  int BlockDim() const override { return blocks_; }
  double Flops() const override { return 0; }
  absl::Status Record(Program& program) const override;

 private:
  struct Chunk {
    int job;
    int row0;
    int rows;
  };
  std::vector<CombineJob> jobs_;
  int blocks_ = 0;
  std::vector<std::vector<Chunk>> chunks_;  // per AIV: block * 2 + sub_block
};

}  // namespace mlaserve::npu

#endif  // MLASERVE_KERNELS_NPU_PROGRAMS_COMBINE_KERNEL_H_
