#include "kernels/npu/programs/attention_device_kernel.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/core/tiling.h"

namespace mlaserve::npu {

absl::Status CheckAttentionSupported(const AttentionWorkload& workload,
                                     const AttentionDeviceKernelOptions& options) {
  if (workload.HasFp8() && options.algorithm != RescaleAlgorithm::kAmla) {
    return absl::UnimplementedError(
        "FP8 keys run SnapMLA over AMLA; the emulated NPU has no Base kernel for them");
  }
  if (workload.HasFp8() && options.fp8_matrix && !workload.fp8_quantize_queries) {
    return absl::UnimplementedError(
        "an FP8 cube multiplies e4m3 queries; bf16 queries need a part without one");
  }
  return absl::OkStatus();
}

absl::StatusOr<AttentionWorkspace> AllocateAttentionWorkspace(
    GlobalMemory& gm, const AttentionWorkload& workload, int blocks,
    const AttentionDeviceKernelOptions& options, bool backed) {
  AttentionWorkspace ws;
  ws.slots = options.preload + 1;
  const int64_t slot_rows = static_cast<int64_t>(blocks) * ws.slots * kMaxGroupRows;
  auto release_on_error = [&](absl::Status status) {
    ReleaseAttentionWorkspace(gm, ws);
    return status;
  };
  auto allocate = [&](int64_t bytes, absl::string_view what) -> absl::StatusOr<GmBuffer> {
    return gm.Allocate(bytes, backed, what);
  };
  absl::StatusOr<GmBuffer> scores = allocate(slot_rows * kKvBlockTokens * 4, "scores workspace");
  if (!scores.ok()) return release_on_error(scores.status());
  ws.scores = *scores;
  absl::StatusOr<GmBuffer> probs = allocate(slot_rows * kKvBlockTokens * 2, "probs workspace");
  if (!probs.ok()) return release_on_error(probs.status());
  ws.probs = *probs;
  if (options.algorithm == RescaleAlgorithm::kBase) {
    absl::StatusOr<GmBuffer> partial = allocate(slot_rows * workload.dv * 4, "P.V workspace");
    if (!partial.ok()) return release_on_error(partial.status());
    ws.partial = *partial;
  }
  for (const RowGroup& group : workload.groups) {
    absl::StatusOr<GmBuffer> acc = allocate(
        static_cast<int64_t>(std::max(group.rows, 1)) * workload.dv * 4, "output accumulator");
    if (!acc.ok()) return release_on_error(acc.status());
    ws.acc.push_back(*acc);
  }
  if (!workload.HasFp8()) return ws;
  for (const RowGroup& group : workload.groups) {
    const auto* fp8 = std::get_if<Fp8Keys>(&group.keys);
    if (fp8 == nullptr) {
      ws.q_prep.emplace_back();
      ws.q_factor.emplace_back();
      continue;
    }
    const int64_t rows = std::max(group.rows, 1);
    const int64_t row_bytes =
        options.fp8_matrix ? AttentionWorkspace::Fp8QueryRowBytes(fp8->layout.dl, fp8->layout.dr)
                           : int64_t{workload.dk} * 2;
    absl::StatusOr<GmBuffer> q = allocate(rows * row_bytes, "FP8 queries");
    if (!q.ok()) return release_on_error(q.status());
    ws.q_prep.push_back(*q);
    absl::StatusOr<GmBuffer> f = allocate(rows * 4, "FP8 query factors");
    if (!f.ok()) return release_on_error(f.status());
    ws.q_factor.push_back(*f);
  }
  if (!options.fp8_matrix) {
    ws.key_slots = options.preload + 2;
    absl::StatusOr<GmBuffer> keys =
        allocate(int64_t{blocks} * ws.key_slots * kKvBlockTokens * workload.dk * 2, "widened keys");
    if (!keys.ok()) return release_on_error(keys.status());
    ws.keys = *keys;
  }
  return ws;
}

void ReleaseAttentionWorkspace(GlobalMemory& gm, const AttentionWorkspace& ws) {
  for (const GmBuffer& b : {ws.scores, ws.probs, ws.partial, ws.keys}) {
    if (b.bytes > 0) gm.Release(b);
  }
  for (const std::vector<GmBuffer>* list : {&ws.acc, &ws.q_prep, &ws.q_factor}) {
    for (const GmBuffer& b : *list) {
      if (b.bytes > 0) gm.Release(b);
    }
  }
}

AttentionDeviceKernel::AttentionDeviceKernel(const AttentionWorkload& workload,
                                             std::vector<std::vector<AttentionTask>> schedule,
                                             const AttentionWorkspace& workspace,
                                             AttentionDeviceKernelOptions options)
    : workload_(workload),
      schedule_(std::move(schedule)),
      workspace_(workspace),
      options_(options) {}

std::string AttentionDeviceKernel::Name() const {
  return std::string(RescaleAlgorithmName(options_.algorithm));
}

double AttentionDeviceKernel::Flops() const {
  double flops = 0;
  for (const RowGroup& g : workload_.groups) {
    for (int32_t v : g.visible) flops += 2.0 * v * (workload_.dk + workload_.dv);
  }
  return flops;
}

absl::Status AttentionDeviceKernel::Record(Program& program) const {
  if (options_.preload < 0 || options_.preload > 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("preload = ", options_.preload, " must be 0, 1 or 2"));
  }
  if (workload_.dv > kKvBlockTokens || workload_.dk > 2 * 288) {
    return absl::InvalidArgumentError(
        absl::StrCat("dk = ", workload_.dk, ", dv = ", workload_.dv,
                     " exceed the kernel's tiling (dk <= 576, dv <= 512)"));
  }
  RETURN_IF_ERROR(CheckAttentionSupported(workload_, options_));
  for (int b = 0; b < BlockDim(); ++b) {
    RETURN_IF_ERROR(RecordCube(program.Cube(b)));
    RETURN_IF_ERROR(RecordVector(program.Vector(b, 0)));
    RETURN_IF_ERROR(RecordVector(program.Vector(b, 1)));
  }
  return program.status();
}

}  // namespace mlaserve::npu
