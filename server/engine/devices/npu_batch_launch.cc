#include "server/engine/devices/npu_batch_launch.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/npu/programs/attention_schedule.h"
#include "kernels/npu/programs/combine_kernel.h"
#include "kernels/npu/programs/projection_kernel.h"

namespace mlaserve::engine {
namespace {

using npu::GmBuffer;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The rest of `buffer` from `offset` bytes on: a strided operand starts there.
GmBuffer From(const GmBuffer& buffer, int64_t offset) {
  return buffer.Slice(offset, buffer.bytes - offset);
}

}  // namespace

// A group's device buffers. Rows are (member, token, head) as in GroupInputs: R = members x
// sq query rows, R x heads attention rows.
struct NpuBatchLaunch::GroupBuffers {
  GmBuffer q_nope;   // head space: [R][heads][dn] bf16
  GmBuffer q_lat;    // [R][heads][dk] bf16
  GmBuffer o_lat;    // head space: [R][heads][dl] bf16, the up-projection's input
  GmBuffer out;      // [R][heads][width] fp32, the answer
  GmBuffer lse;      // [R][heads] fp32
  GmBuffer q_naive;  // hybrid: [heads][R][dqk] bf16, one dense row block per head
  std::vector<GmBuffer> naive_out;  // hybrid, per level: [R][heads][dv] fp32
  std::vector<GmBuffer> naive_lse;  // hybrid, per level: [R][heads] fp32
  int width = 0;
};

// An attention launch's workload and workspace, which its kernel refers to.
struct NpuBatchLaunch::AttentionLaunch {
  npu::AttentionWorkload workload;
  npu::AttentionWorkspace workspace;
};

NpuBatchLaunch::NpuBatchLaunch(npu::Device& device, const ModelConfig& model, bool backed)
    : device_(device), model_(model), backed_(backed) {}

NpuBatchLaunch::~NpuBatchLaunch() {
  kernels_.clear();
  for (const auto& launch : attention_) npu::ReleaseAttentionWorkspace(device_.gm(), launch->workspace);
  for (const GmBuffer& b : owned_) device_.gm().Release(b);
}

absl::StatusOr<GmBuffer> NpuBatchLaunch::Allocate(int64_t bytes, const char* what) {
  ASSIGN_OR_RETURN(GmBuffer b, device_.gm().Allocate(std::max<int64_t>(bytes, 1), backed_, what));
  owned_.push_back(b);
  return b;
}

absl::StatusOr<std::unique_ptr<NpuBatchLaunch>> NpuBatchLaunch::Create(
    npu::Device& device, const ModelConfig& model, std::vector<NpuGroup> groups,
    const npu::AttentionDeviceKernelOptions& options, bool backed) {
  std::unique_ptr<NpuBatchLaunch> launch(new NpuBatchLaunch(device, model, backed));
  launch->groups_ = std::move(groups);
  launch->buffers_.resize(launch->groups_.size());
  for (size_t g = 0; g < launch->groups_.size(); ++g) {
    const NpuGroup& group = launch->groups_[g];
    if (group.members <= 0 || group.sq <= 0 ||
        static_cast<int>(group.pages.size()) != group.members ||
        static_cast<int>(group.lengths.size()) != group.members ||
        static_cast<int64_t>(group.visible.size()) != int64_t{group.members} * group.sq) {
      return absl::InvalidArgumentError(absl::StrCat("npu batch group ", g, ": members, pages, lengths and visible disagree"));
    }
    RETURN_IF_ERROR(launch->StageGroup(group, launch->buffers_[g]));
  }
  RETURN_IF_ERROR(launch->BuildLaunches(options));
  return launch;
}

absl::Status NpuBatchLaunch::StageGroup(const NpuGroup& group, GroupBuffers& b) {
  const ModelConfig& m = model_;
  const int H = m.heads, dk = m.dk_latent(), dqk = m.dqk();
  const int64_t rows = int64_t{group.members} * group.sq;  // R
  const int64_t attention_rows = rows * H;
  const bool head_space = group.space == QuerySpace::kHead;
  b.width = head_space ? m.dv : m.dl;
  ASSIGN_OR_RETURN(b.q_lat, Allocate(attention_rows * dk * 2, "q_lat"));
  ASSIGN_OR_RETURN(b.out, Allocate(attention_rows * b.width * 4, "out"));
  ASSIGN_OR_RETURN(b.lse, Allocate(attention_rows * 4, "lse"));
  if (head_space) {
    ASSIGN_OR_RETURN(b.q_nope, Allocate(attention_rows * m.dn * 2, "q_nope"));
    ASSIGN_OR_RETURN(b.o_lat, Allocate(attention_rows * m.dl * 2, "o_lat"));
  }
  if (!group.levels.empty()) {
    if (!head_space) return absl::InvalidArgumentError("npu batch: a hybrid group must be in head space");
    ASSIGN_OR_RETURN(b.q_naive, Allocate(attention_rows * dqk * 2, "q_naive"));
    for (size_t l = 0; l < group.levels.size(); ++l) {
      ASSIGN_OR_RETURN(GmBuffer out, Allocate(attention_rows * m.dv * 4, "naive out"));
      ASSIGN_OR_RETURN(GmBuffer lse, Allocate(attention_rows * 4, "naive lse"));
      b.naive_out.push_back(out);
      b.naive_lse.push_back(lse);
    }
  }
  if (!backed_) return absl::OkStatus();

  // Parts no launch writes read as a kernel's early exit (zeros, -inf): rows of a member
  // whose part has no key never get a task.
  auto clear = [](const GmBuffer& out, const GmBuffer& lse) {
    std::memset(out.host, 0, out.bytes);
    std::fill_n(lse.as<float>(), lse.bytes / 4, kNegInf);
  };
  clear(b.out, b.lse);
  for (size_t l = 0; l < b.naive_out.size(); ++l) clear(b.naive_out[l], b.naive_lse[l]);
  if (head_space) {
    if (group.q_nope == nullptr || group.q_pe == nullptr) {
      return absl::InvalidArgumentError("npu batch: executing a head-space group needs q_nope and q_pe");
    }
    std::memset(b.o_lat.host, 0, b.o_lat.bytes);
    std::memcpy(b.q_nope.host, group.q_nope, attention_rows * m.dn * 2);
    // absorb_q writes the first dl columns of q_lat; the rope part is the query's own.
    Bf16* q_lat = b.q_lat.as<Bf16>();
    for (int64_t r = 0; r < attention_rows; ++r) {
      std::copy_n(group.q_pe + r * m.dr, m.dr, q_lat + r * dk + m.dl);
    }
    if (!group.levels.empty()) {
      Bf16* q_naive = b.q_naive.as<Bf16>();
      for (int h = 0; h < H; ++h) {
        for (int64_t r = 0; r < rows; ++r) {
          Bf16* dst = q_naive + (h * rows + r) * dqk;
          std::copy_n(group.q_nope + (r * H + h) * m.dn, m.dn, dst);
          std::copy_n(group.q_pe + (r * H + h) * m.dr, m.dr, dst + m.dn);
        }
      }
    }
  } else {
    if (group.q_latent == nullptr) {
      return absl::InvalidArgumentError("npu batch: executing a latent-space group needs q_latent");
    }
    std::memcpy(b.q_lat.host, group.q_latent, attention_rows * dk * 2);
  }
  return absl::OkStatus();
}

absl::Status NpuBatchLaunch::AddAttention(npu::AttentionWorkload workload,
                                          const npu::AttentionDeviceKernelOptions& options) {
  auto launch = std::make_unique<AttentionLaunch>();
  launch->workload = std::move(workload);
  auto schedule = npu::ScheduleAttention(launch->workload, device_.profile().cube_cores);
  if (schedule.empty()) return absl::OkStatus();  // no row sees a key
  ASSIGN_OR_RETURN(launch->workspace,
                   npu::AllocateAttentionWorkspace(device_.gm(), launch->workload,
                                                   static_cast<int>(schedule.size()), options, backed_));
  kernels_.push_back(std::make_unique<npu::AttentionDeviceKernel>(launch->workload, std::move(schedule),
                                                            launch->workspace, options));
  attention_.push_back(std::move(launch));
  return absl::OkStatus();
}

absl::Status NpuBatchLaunch::BuildLaunches(const npu::AttentionDeviceKernelOptions& options) {
  const ModelConfig& m = model_;
  const int H = m.heads, dk = m.dk_latent(), dqk = m.dqk();
  const int max_blocks = device_.profile().cube_cores;
  const int64_t w_head_rows = int64_t{m.dn} + m.dv;  // kv_b_proj rows per head

  // 1. absorb_q: q_lat[:, h, :dl] = bf16(q_nope[:, h] . W_UK[h]).
  std::vector<npu::ProjectionJob> absorb_q, project_out;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const NpuGroup& group = groups_[g];
    if (group.space != QuerySpace::kHead) continue;
    const GroupBuffers& b = buffers_[g];
    const int rows = group.members * group.sq;
    for (int h = 0; h < H; ++h) {
      const int64_t w_uk = h * w_head_rows * m.dl;
      const int64_t w_uv = w_uk + int64_t{m.dn} * m.dl;
      absorb_q.push_back({.a = From(b.q_nope, int64_t{h} * m.dn * 2),
                          .lda = int64_t{H} * m.dn,
                          .b = group.kv_b.Slice(w_uk * 2, int64_t{m.dn} * m.dl * 2),
                          .ldb = m.dl,
                          .transpose_b = false,
                          .c = From(b.q_lat, int64_t{h} * dk * 2),
                          .ldc = int64_t{H} * dk,
                          .c_bf16 = true,
                          .rows = rows,
                          .n = m.dl,
                          .k = m.dn});
      project_out.push_back({.a = From(b.o_lat, int64_t{h} * m.dl * 2),
                             .lda = int64_t{H} * m.dl,
                             .b = group.kv_b.Slice(w_uv * 2, int64_t{m.dv} * m.dl * 2),
                             .ldb = m.dl,
                             .transpose_b = true,
                             .c = From(b.out, int64_t{h} * m.dv * 4),
                             .ldc = int64_t{H} * m.dv,
                             .c_bf16 = false,
                             .rows = rows,
                             .n = m.dv,
                             .k = m.dl});
    }
  }
  if (!absorb_q.empty()) {
    kernels_.push_back(std::make_unique<npu::ProjectionKernel>(std::move(absorb_q), max_blocks));
  }

  // 2. The absorb part: each member's (sq x heads) rows, 256 at a time, over its latent keys
  // from absorb_from on.
  npu::AttentionWorkload latent{.dk = dk, .dv = m.dl, .softmax_scale = m.softmax_scale, .groups = {}};
  for (size_t g = 0; g < groups_.size(); ++g) {
    const NpuGroup& group = groups_[g];
    const GroupBuffers& b = buffers_[g];
    const bool head_space = group.space == QuerySpace::kHead;
    const int member_rows = group.sq * H;
    for (int member = 0; member < group.members; ++member) {
      const int32_t keys = std::max(0, group.lengths[member] - group.absorb_from);
      for (int r0 = 0; r0 < member_rows; r0 += npu::kMaxGroupRows) {
        npu::RowGroup rg;
        rg.rows = std::min(npu::kMaxGroupRows, member_rows - r0);
        const int64_t first = int64_t{member} * member_rows + r0;
        rg.q = b.q_lat.Slice(first * dk * 2, int64_t{rg.rows} * dk * 2);
        for (int r = r0; r < r0 + rg.rows; ++r) {
          const int32_t visible = group.visible[member * group.sq + r / H];
          rg.visible.push_back(std::clamp(visible - group.absorb_from, 0, keys));
        }
        rg.keys = npu::PagedKeys{group.pool, group.page_size, dk, group.pages[member], group.absorb_from};
        if (head_space) {
          rg.out = b.o_lat.Slice(first * m.dl * 2, int64_t{rg.rows} * m.dl * 2);
          rg.out_bf16 = true;
        } else {
          rg.out = b.out.Slice(first * m.dl * 4, int64_t{rg.rows} * m.dl * 4);
        }
        rg.lse = b.lse.Slice(first * 4, int64_t{rg.rows} * 4);
        latent.groups.push_back(std::move(rg));
      }
    }
  }
  RETURN_IF_ERROR(AddAttention(std::move(latent), options));

  // 3. The naive part: every level x head of the hybrid groups, its R rows 256 at a time,
  // written straight into the [R][heads][dv] layout.
  npu::AttentionWorkload naive{.dk = dqk, .dv = m.dv, .softmax_scale = m.softmax_scale, .groups = {}};
  size_t max_levels = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const NpuGroup& group = groups_[g];
    const GroupBuffers& b = buffers_[g];
    const int rows = group.members * group.sq;
    max_levels = std::max(max_levels, group.levels.size());
    for (size_t l = 0; l < group.levels.size(); ++l) {
      const NpuLevel& level = group.levels[l];
      const int64_t tokens = level.end - level.begin;
      for (int h = 0; h < H; ++h) {
        const npu::DenseKeys keys{level.keys.Slice(h * tokens * dqk * 2, tokens * dqk * 2), dqk,
                                  level.values.Slice(h * tokens * m.dv * 2, tokens * m.dv * 2), m.dv};
        for (int r0 = 0; r0 < rows; r0 += npu::kMaxGroupRows) {
          npu::RowGroup rg;
          rg.rows = std::min(npu::kMaxGroupRows, rows - r0);
          rg.q = b.q_naive.Slice((int64_t{h} * rows + r0) * dqk * 2, int64_t{rg.rows} * dqk * 2);
          for (int r = r0; r < r0 + rg.rows; ++r) {
            rg.visible.push_back(std::clamp(group.visible[r] - level.begin, 0, static_cast<int32_t>(tokens)));
          }
          rg.keys = keys;
          rg.out = From(b.naive_out[l], (int64_t{r0} * H + h) * m.dv * 4);
          rg.out_stride = int64_t{H} * m.dv;
          rg.lse = From(b.naive_lse[l], (int64_t{r0} * H + h) * 4);
          rg.lse_stride = H;
          naive.groups.push_back(std::move(rg));
        }
      }
    }
  }
  RETURN_IF_ERROR(AddAttention(std::move(naive), options));

  // 4. project_out.
  if (!project_out.empty()) {
    kernels_.push_back(std::make_unique<npu::ProjectionKernel>(std::move(project_out), max_blocks));
  }

  // 5. Combines: a group with L levels folds level k into level 0 in launch k (k < L) and
  // the absorb part into the merged levels in launch L, the host's order.
  for (size_t step = 1; step <= max_levels; ++step) {
    std::vector<npu::CombineJob> jobs;
    for (size_t g = 0; g < groups_.size(); ++g) {
      const NpuGroup& group = groups_[g];
      const GroupBuffers& b = buffers_[g];
      const int rows = group.members * group.sq * H;
      if (step < group.levels.size()) {
        jobs.push_back({b.naive_out[0], b.naive_lse[0], b.naive_out[step], b.naive_lse[step],
                        b.naive_out[0], b.naive_lse[0], rows, m.dv});
      } else if (step == group.levels.size()) {
        jobs.push_back({b.naive_out[0], b.naive_lse[0], b.out, b.lse, b.out, b.lse, rows, m.dv});
      }
    }
    if (!jobs.empty()) kernels_.push_back(std::make_unique<npu::CombineKernel>(std::move(jobs), max_blocks));
  }
  return absl::OkStatus();
}

absl::StatusOr<NpuBatchReport> NpuBatchLaunch::Run(npu::ExecutionMode mode) {
  if (mode == npu::ExecutionMode::kExecute && !backed_) {
    return absl::FailedPreconditionError("npu batch: a model-only launch cannot execute");
  }
  NpuBatchReport report;
  for (const auto& kernel : kernels_) {
    ASSIGN_OR_RETURN(npu::LaunchReport launch, device_.Launch(*kernel, mode));
    report.modeled_us += launch.modeled_us;
    report.launches.push_back(std::move(launch));
  }
  return report;
}

std::span<const float> NpuBatchLaunch::out(int group) const {
  const GmBuffer& b = buffers_[group].out;
  return {b.as<const float>(), static_cast<size_t>(b.bytes / 4)};
}

std::span<const float> NpuBatchLaunch::lse(int group) const {
  const GmBuffer& b = buffers_[group].lse;
  return {b.as<const float>(), static_cast<size_t>(b.bytes / 4)};
}

int NpuBatchLaunch::width(int group) const { return buffers_[group].width; }

}  // namespace mlaserve::engine
