#ifndef MLASERVE_KERNELS_MLA_BATCH_STEP_BUILDER_H_
#define MLASERVE_KERNELS_MLA_BATCH_STEP_BUILDER_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/mla/batch_steps.h"
#include "kernels/mla/decode_batch.h"

namespace mlaserve {

// Where one query's answer lies in a run's buffers.
struct AnswerRef {
  BufferRef out;  // [sq][heads][width], `out_type`
  ElementType out_type = ElementType::kFp32;
  int64_t out_elements = 0;
  BufferRef lse;  // [sq][heads] fp32
  int64_t lse_elements = 0;
};

struct BuiltBatch {
  BatchSteps steps;
  std::vector<std::vector<AnswerRef>> answers;  // [group][member]
};

// The arithmetic of a planned decode batch, written once for every device, as these steps
// (each skipped when it has nothing to do); rows of a group are (member, token, head):
//
//   absorb_q     projection  q_lat[:, h, :dl] = bf16(q_nope[:, h] . W_UK[h])   head-space groups
//   latent       attention   every group's absorb part: each member's rows, 256 at a time,
//                            over its latent keys [absorb_from, length)
//   naive        attention   every naive pass: each head's rows, 256 at a time, over the
//                            level's expanded K[h], V[h]
//   split_merge  combine     split-KV: the parts of every split row group, merged into its
//                            destination
//   project_out  projection  out[:, h] = bf16(o_lat[:, h]) . W_UV[h]^T       head-space groups
//   prefix_merge combine     hybrid groups: the naive passes in order, then the absorb part
//
// Split-KV: an attention step with fewer row groups than `parallel_units` cuts each row
// group's keys at KV-block boundaries into parts of about SplitPartBlocks blocks, so that the
// parts fill the units in as few waves as possible (FlashMLA's get_mla_metadata balances the
// same way: equal KV work per unit rather than equal parts per sequence).
//
// INVALID_ARGUMENT for a batch that does not hold together (a pass that does not tile a
// group's prefix, a member without pages for its length, a missing weight).
absl::StatusOr<BuiltBatch> BuildBatchSteps(const DecodeBatch& batch);

// The length in KV blocks of the parts a split attention step cuts its row groups into, for
// row groups of `group_blocks` blocks on `parallel_units` cores: a group of b blocks becomes
// ceil(b / result) parts. The choice minimises the modelled makespan, waves x (part length +
// one block for a part's pipeline fill and drain); the longest group's length means no split.
// With at least as many groups as cores nothing is split, unless `balance_waves`: a GPU runs
// its thread blocks in waves, and 192 tiles on 132 SMs finish sooner as 384 half as long.
// `part_overhead_blocks` is what a part costs beyond its keys, in blocks (its pipeline's fill
// and drain; on a GPU also its queries' load, its partial output and its merge).
int SplitPartBlocks(std::span<const int> group_blocks, int parallel_units,
                    bool balance_waves = false, int part_overhead_blocks = 1);

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_MLA_BATCH_STEP_BUILDER_H_
