#ifndef MLASERVE_SERVER_ENGINE_PLAN_DECODE_BATCH_LOWERING_H_
#define MLASERVE_SERVER_ENGINE_PLAN_DECODE_BATCH_LOWERING_H_

#include "kernels/mla/decode_batch.h"
#include "server/engine/engine_types.h"
#include "server/engine/model/model_weights.h"
#include "server/engine/plan/batch_plan.h"

namespace mlaserve::engine {

// A prepared plan (expansions built) in the kernels' terms: pointers into its snapshots'
// page pool and block tables, the queries' memory, the weights and the expanded K/V. Group g
// of the result is the plan's group g, its member m the plan's query groups[g].members[m];
// passes that lost all their groups in preparation are left out. Valid while the plan, the
// queries and the weights live. The batch's calls share `key`: the softmax scale, their heads
// (`heads` of them from `first_head`; head space: a range of the model's, whose W_UK/W_UV and
// expanded K/V it reads; latent space: any count from 0) and the batch-invariant mode.
// `device` says how its attention steps are split (DecodeBatch::parallel_units, unit_rows,
// split_block_tokens) and how the mode cuts projections (invariant_projection_rows).
DecodeBatch ToDecodeBatch(const BatchPlan& plan, const ModelWeights& weights, const BatchKey& key,
                          const DeviceInfo& device);

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_PLAN_DECODE_BATCH_LOWERING_H_
