#include "server/engine/devices/host_attention_device.h"

#include <algorithm>
#include <chrono>

#include "kernels/core/kv_block_source.h"
#include "kernels/core/vector_ops.h"
#include "kernels/mla/absorb.h"
#include "kernels/mla/amla.h"
#include "kernels/mla/lse_combine.h"
#include "server/engine/devices/group_inputs.h"

namespace mlaserve::engine {
namespace {

// Step 2: the absorb part, member by member: o_lat [G][sq][H][dl] and lse [G][sq][H].
void AbsorbPart(const BatchPlan& plan, const GroupPlan& group, const GroupInputs& in,
                const std::vector<Bf16>& q_lat, const ModelConfig& m, std::vector<float>& o_lat,
                std::vector<float>& lse) {
  const int dk = m.dk_latent();
  const int rows = group.sq * m.heads;
  const int32_t from = group.AbsorbFrom();
  o_lat.assign(static_cast<size_t>(in.members) * rows * m.dl, 0.0f);
  lse.assign(static_cast<size_t>(in.members) * rows, 0.0f);
  std::vector<float> q(static_cast<size_t>(rows) * dk);
  std::vector<int32_t> visible(rows);
  for (int g = 0; g < in.members; ++g) {
    const PlannedQuery& pq = plan.queries[group.members[g]];
    const KvSnapshot& snapshot = plan.snapshots[pq.snapshot];
    const int32_t length = in.lengths[g];
    for (int s = 0; s < group.sq; ++s) {
      const int32_t keys = std::clamp(in.visible[g * group.sq + s] - from, 0, std::max(0, length - from));
      std::fill_n(visible.begin() + s * m.heads, m.heads, keys);
    }
    WidenBf16(q_lat.data() + static_cast<int64_t>(g) * rows * dk, static_cast<int64_t>(rows) * dk, q.data());
    const PagedSequences tables = snapshot.tables();
    PagedLatentSource source(snapshot.cache(), tables, pq.sequence, m.dl, from);
    AmlaRows(QueryRows{q.data(), dk, rows, dk, visible}, source, m.softmax_scale, AmlaOptions{},
             RowOutputs{o_lat.data() + static_cast<int64_t>(g) * rows * m.dl, m.dl,
                        lse.data() + static_cast<int64_t>(g) * rows});
  }
}

// Step 4: one prefix level's naive part: out [G][sq][H][dv] and lse [G][sq][H].
void NaivePart(const GroupPlan& group, const GroupInputs& in, const ExpandedKv& level,
               const ModelConfig& m, std::vector<float>& out, std::vector<float>& lse) {
  const int rows = in.members * group.sq;  // per head
  const int dqk = m.dqk();
  out.assign(static_cast<size_t>(rows) * m.heads * m.dv, 0.0f);
  lse.assign(static_cast<size_t>(rows) * m.heads, 0.0f);
  std::vector<float> q(static_cast<size_t>(rows) * dqk);
  std::vector<int32_t> visible(rows);
  std::vector<float> head_out(static_cast<size_t>(rows) * m.dv), head_lse(rows);
  const int32_t span = level.end() - level.begin();
  for (int r = 0; r < rows; ++r) visible[r] = std::clamp(in.visible[r] - level.begin(), 0, span);
  for (int h = 0; h < m.heads; ++h) {
    for (int r = 0; r < rows; ++r) {
      const int64_t row = static_cast<int64_t>(r) * m.heads + h;
      WidenBf16(in.q_nope.data() + row * m.dn, m.dn, q.data() + static_cast<int64_t>(r) * dqk);
      WidenBf16(in.q_pe.data() + row * m.dr, m.dr, q.data() + static_cast<int64_t>(r) * dqk + m.dn);
    }
    const HeadKv kv = level.Head(h);
    DenseKvSource source(kv.k, kv.ldk, dqk, kv.v, kv.ldv, m.dv, kv.length);
    AmlaRows(QueryRows{q.data(), dqk, rows, dqk, visible}, source, m.softmax_scale, AmlaOptions{},
             RowOutputs{head_out.data(), m.dv, head_lse.data()});
    for (int r = 0; r < rows; ++r) {
      const int64_t row = static_cast<int64_t>(r) * m.heads + h;
      std::copy_n(head_out.data() + static_cast<int64_t>(r) * m.dv, m.dv, out.data() + row * m.dv);
      lse[row] = head_lse[r];
    }
  }
}

}  // namespace

HostAttentionDevice::HostAttentionDevice() { info_.profile = "host"; }

absl::StatusOr<DeviceRun> HostAttentionDevice::Run(const BatchPlan& plan,
                                                   const ModelWeights& weights) {
  const auto start = std::chrono::steady_clock::now();
  const ModelConfig& m = weights.config();
  DeviceRun run;
  run.outputs.resize(plan.queries.size());
  for (const GroupPlan& group : plan.groups) {
    const GroupInputs in = GatherGroupInputs(plan, group, m);
    const UpProjection w = weights.Layer(group.layer);
    const std::vector<Bf16> q_lat =
        group.space == QuerySpace::kHead ? AbsorbQueries(in.QNope(m), in.QPe(m), w) : in.q_latent;
    std::vector<float> o_lat, lse;
    AbsorbPart(plan, group, in, q_lat, m, o_lat, lse);
    if (group.space == QuerySpace::kLatent) {
      ScatterGroupOutputs(group, m.heads, m.dl, o_lat, lse, run);
      continue;
    }
    std::vector<float> out(static_cast<size_t>(in.members) * group.sq * m.heads * m.dv);
    ProjectLatentOutputs(w, in.members * group.sq, o_lat.data(), out.data());
    if (group.formulation == Formulation::kHybrid) {
      std::vector<float> merged, merged_lse, part, part_lse;
      for (size_t level = 0; level < group.levels.size(); ++level) {
        NaivePart(group, in, group.levels[level], m, part, part_lse);
        if (level == 0) {
          merged = std::move(part);
          merged_lse = std::move(part_lse);
          continue;
        }
        CombineLseRows(static_cast<int>(merged_lse.size()), m.dv, merged.data(), merged_lse.data(),
                       part.data(), part_lse.data(), m.dv, merged.data(), merged_lse.data());
      }
      CombineLseRows(static_cast<int>(lse.size()), m.dv, merged.data(), merged_lse.data(), out.data(),
                     lse.data(), m.dv, out.data(), lse.data());
    }
    ScatterGroupOutputs(group, m.heads, m.dv, out, lse, run);
  }
  run.host_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return run;
}

}  // namespace mlaserve::engine
