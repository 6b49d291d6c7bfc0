#ifndef MLASERVE_KERNELS_NPU_PROGRAMS_COMBINE_KERNEL_H_
#define MLASERVE_KERNELS_NPU_PROGRAMS_COMBINE_KERNEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/mla/step_jobs.h"
#include "kernels/npu/device_kernel.h"
#include "kernels/npu/global_memory.h"

namespace mlaserve::npu {

// The rows of partial results to merge, and where, in GM (kernels/mla/step_jobs.h).
using CombineJob = mlaserve::BasicCombineJob<GmBuffer>;

// At most this many parts per job (what one row of each fits in a UB slot).
inline constexpr int kMaxCombineParts = 32;

// The LSE merge (docs/numerics.md, "LSE combine") generalised to n parts (CombineLseParts, as on
// the host) on the vector cores: rows are dealt in chunks of up to 8 to every AIV of the grid.
// AIV-only.
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
  // Rows per chunk of a job: as many as fit its parts in one UB slot, at most 8.
  static int ChunkRows(const CombineJob& job);
  std::vector<CombineJob> jobs_;
  int blocks_ = 0;
  std::vector<std::vector<Chunk>> chunks_;  // per AIV: block * 2 + sub_block
};

}  // namespace mlaserve::npu

#endif  // MLASERVE_KERNELS_NPU_PROGRAMS_COMBINE_KERNEL_H_
