#include "server/engine/plan/decode_batch_lowering.h"

#include <vector>

namespace mlaserve::engine {

DecodeBatch ToDecodeBatch(const BatchPlan& plan, const ModelWeights& weights, const BatchKey& key,
                          const DeviceInfo& device) {
  const ModelConfig& m = weights.config();
  const int first_head = key.first_head;
  DecodeBatch batch;
  batch.dims = m.dims();
  batch.dims.softmax_scale = key.softmax_scale;
  batch.dims.heads = key.heads;
  batch.batch_invariant = key.batch_invariant;
  batch.invariant_projection_rows = device.invariant_projection_rows;
  batch.parallel_units = device.parallel_units;
  batch.unit_rows = device.unit_rows;
  batch.dense_unit_rows = device.dense_unit_rows;
  batch.split_block_tokens = device.split_block_tokens;
  batch.balance_waves = device.balance_waves;
  batch.split_part_overhead_blocks = device.split_part_overhead_blocks;
  if (!plan.snapshots.empty()) {
    const PagedKvCache& pool =
        plan.snapshots.front().cache();  // every snapshot views the same pool
    batch.pool = pool.pages.data();
    batch.pool_pages = pool.num_pages();
    batch.page_size = pool.page_size();
    const Fp8PagedKvCache& fp8 = plan.snapshots.front().fp8_cache();  // the same pool's slots
    batch.fp8_pool = {fp8.base, fp8.num_pages, fp8.layout};
  }
  std::vector<int> pass_index(plan.passes.size(), -1);
  for (size_t p = 0; p < plan.passes.size(); ++p) {
    const NaivePassPlan& pass = plan.passes[p];
    if (pass.groups.empty() || !pass.expanded.has_value()) continue;
    pass_index[p] = static_cast<int>(batch.passes.size());
    // Expanded K/V are [heads][tokens][width]: a head range starts first_head heads in.
    const size_t skipped = static_cast<size_t>(first_head) *
                           static_cast<size_t>(pass.expanded->end() - pass.expanded->begin());
    batch.passes.push_back(DecodeBatch::NaivePass{pass.expanded->keys().data() + skipped * m.dqk(),
                                                  pass.expanded->values().data() + skipped * m.dv,
                                                  pass.expanded->begin(), pass.expanded->end(),
                                                  pass.groups});
  }
  for (const GroupPlan& group : plan.groups) {
    DecodeBatch::Group g;
    g.kv_dtype = group.kv_dtype;
    g.head_space = group.space == QuerySpace::kHead;
    g.sq = group.sq;
    // kv_b_proj is [heads][dn + dv][dl]: a head range starts first_head heads in.
    const std::span<const Bf16> tiles = weights.KvBProjTiles(group.layer);
    g.kv_b_tiles = g.head_space && !tiles.empty();
    g.kv_b = g.head_space ? (g.kv_b_tiles ? tiles : weights.KvBProj(group.layer)).data() +
                                static_cast<size_t>(first_head) * (m.dn + m.dv) * m.dl
                          : nullptr;
    g.absorb_from = group.absorb_from;
    g.out_bf16 = group.output == ElementType::kBf16;
    for (int p : group.naive_passes) g.naive_passes.push_back(pass_index[p]);
    for (int index : group.members) {
      const PlannedQuery& pq = plan.queries[index];
      const DecodeQuery& q = *pq.query;
      const SequenceSnapshot& seq = plan.sequence(pq);
      g.members.push_back(DecodeBatch::Member{seq.pages, seq.length, q.q_nope.data(), q.q_pe.data(),
                                              q.q_latent.data()});
    }
    batch.groups.push_back(std::move(g));
  }
  return batch;
}

}  // namespace mlaserve::engine
