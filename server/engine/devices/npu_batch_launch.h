#ifndef MLASERVE_SERVER_ENGINE_DEVICES_NPU_BATCH_LAUNCH_H_
#define MLASERVE_SERVER_ENGINE_DEVICES_NPU_BATCH_LAUNCH_H_

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/core/bfloat16.h"
#include "kernels/npu/device.h"
#include "kernels/npu/launch_report.h"
#include "kernels/npu/programs/attention_device_kernel.h"
#include "server/engine/engine_types.h"
#include "server/engine/model/model_config.h"

namespace mlaserve::engine {

// One prefix level's naive-form K/V in device memory (ExpandedKvData's layout).
struct NpuLevel {
  int32_t begin = 0;
  int32_t end = 0;
  npu::GmBuffer keys;    // [heads][end - begin][dqk] bf16
  npu::GmBuffer values;  // [heads][end - begin][dv] bf16
};

// One planned group (GroupPlan) in device terms: where its keys, levels and weights live in
// global memory, and, to execute, the host queries to stage. Model-only launches give
// unbacked buffers and no queries.
struct NpuGroup {
  QuerySpace space = QuerySpace::kHead;
  int members = 0;
  int sq = 1;
  npu::GmBuffer kv_b;  // head space: the layer's kv_b_proj [heads (dn + dv)][dl] bf16
  npu::GmBuffer pool;  // the latent pages [pages][page_size][dk] bf16
  int page_size = 0;
  std::vector<std::vector<int32_t>> pages;  // per member, token order
  std::vector<int32_t> lengths;             // per member
  std::vector<int32_t> visible;             // [members][sq]: keys each token sees (causal)
  int32_t absorb_from = 0;                  // GroupPlan::AbsorbFrom()
  std::vector<NpuLevel> levels;             // hybrid only, root first
  // Execution only, GroupInputs' layouts: [members][sq][heads][dn | dr | dk].
  const Bf16* q_nope = nullptr;
  const Bf16* q_pe = nullptr;
  const Bf16* q_latent = nullptr;
};

struct NpuBatchReport {
  std::vector<npu::LaunchReport> launches;  // in stream order
  double modeled_us = 0;                    // their sum: one stream runs them back to back
};

// A planned batch as the kernel launches one device stream runs, in order:
//   1. absorb_q     (projection) q_lat = bf16(q_nope . W_UK) per head, head-space groups
//   2. amla latent  (attention)  every group's absorb part over its paged latent keys
//   3. amla naive   (attention)  hybrid groups: every level x head over the expanded K/V
//   4. project_out  (projection) out = bf16(o_lat) . W_UV^T per head, head-space groups
//   5. lse_combine  (combine)    hybrid groups: the levels in order, then the absorb part
// (launches with nothing to do are skipped). Each launch computes exactly what
// HostAttentionDevice computes for that step, so the answers agree bit for bit.
//
// Owns every device buffer it allocates and releases them on destruction; the buffers the
// groups name (pool, weights, levels) stay the caller's.
class NpuBatchLaunch {
 public:
  static absl::StatusOr<std::unique_ptr<NpuBatchLaunch>> Create(
      npu::Device& device, const ModelConfig& model, std::vector<NpuGroup> groups,
      const npu::AttentionDeviceKernelOptions& options, bool backed);
  ~NpuBatchLaunch();
  NpuBatchLaunch(const NpuBatchLaunch&) = delete;
  NpuBatchLaunch& operator=(const NpuBatchLaunch&) = delete;

  absl::StatusOr<NpuBatchReport> Run(npu::ExecutionMode mode);

  // After an executed Run: group g's answer, out [members][sq][heads][width] fp32 (width dv
  // in head space, dl in latent space) and lse [members][sq][heads].
  std::span<const float> out(int group) const;
  std::span<const float> lse(int group) const;
  int width(int group) const;

 private:
  struct GroupBuffers;
  struct AttentionLaunch;

  NpuBatchLaunch(npu::Device& device, const ModelConfig& model, bool backed);
  absl::StatusOr<npu::GmBuffer> Allocate(int64_t bytes, const char* what);
  absl::Status StageGroup(const NpuGroup& group, GroupBuffers& buffers);
  absl::Status BuildLaunches(const npu::AttentionDeviceKernelOptions& options);
  absl::Status AddAttention(npu::AttentionWorkload workload,
                            const npu::AttentionDeviceKernelOptions& options);

  npu::Device& device_;
  const ModelConfig model_;
  const bool backed_;
  std::vector<NpuGroup> groups_;
  std::vector<GroupBuffers> buffers_;
  std::vector<npu::GmBuffer> owned_;
  std::vector<std::unique_ptr<AttentionLaunch>> attention_;
  std::vector<std::unique_ptr<npu::DeviceKernel>> kernels_;  // in stream order
};

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_DEVICES_NPU_BATCH_LAUNCH_H_
