#ifndef MLASERVE_KERNELS_MLA_DECODE_BATCH_H_
#define MLASERVE_KERNELS_MLA_DECODE_BATCH_H_

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/core/bfloat16.h"
#include "kernels/core/fp8_paged_kv_cache.h"
#include "kernels/core/kv_dtype.h"
#include "kernels/mla/rescale_algorithm.h"

namespace mlaserve {

// The shapes of one MLA model's attention (docs/numerics.md, "The two MLA formulations"), as the
// kernels need them.
struct MlaDims {
  int heads = 0;
  int dn = 0;  // q/k "nope" head width
  int dr = 0;  // RoPE width
  int dl = 0;  // latent (KV LoRA) width
  int dv = 0;  // value head width
  float softmax_scale = 0;

  int dk() const { return dl + dr; }   // absorbed key width
  int dqk() const { return dn + dr; }  // naive key width
};

// A planned decode batch in kernel terms: the groups of queries that attend the same way,
// where their keys, queries and weights are, and which naive-form passes over shared prefixes
// they take part in (TyphoonMLA). BuildBatchSteps (batch_step_builder.h) turns it into the
// steps every device runs. All memory is the caller's and must outlive the steps; every
// pointer may be null to model a launch without executing it.
struct DecodeBatch {
  MlaDims dims;
  // The paged latent cache the bf16 groups' members read: [pool_pages][page_size][dk] bf16.
  const Bf16* pool = nullptr;
  int64_t pool_pages = 0;
  int page_size = 0;
  // The FP8 cache the fp8 groups' members read (kernels/core/fp8_paged_kv_cache.h); its
  // layout's dl and dr are the dims'.
  struct Fp8Pool {
    const std::byte* pages = nullptr;
    int64_t num_pages = 0;
    Fp8PageLayout layout;
  };
  Fp8Pool fp8_pool;
  // SnapMLA quantises the queries of fp8 groups (SnapAmlaOptions::quantize_queries).
  bool fp8_quantize_queries = true;

  // One query: sq tokens of one sequence, causal among themselves (token s sees keys
  // [0, length - sq + s + 1)) unless its group says otherwise.
  struct Member {
    std::span<const int32_t> pages;  // the sequence's block table, token order
    int32_t length = 0;              // keys it holds
    // Head space: q_nope [sq][heads][dn] and q_pe [sq][heads][dr]; latent space: q_latent
    // [sq][heads][dk].
    const Bf16* q_nope = nullptr;
    const Bf16* q_pe = nullptr;
    const Bf16* q_latent = nullptr;
  };

  // Queries of one layer, one sq and one q space. Answers: out [member][sq][heads][width]
  // (width dv in head space, dl in latent space) and lse [member][sq][heads].
  struct Group {
    // Which cache its members' pages are in. The naive passes read expanded bf16 K/V either
    // way; an fp8 group's absorb part runs SnapMLA over AMLA (kernels/mla/snap_amla.h).
    KvDtype kv_dtype = KvDtype::kBf16;
    bool head_space = true;
    int sq = 1;
    std::vector<Member> members;
    // Head space: the layer's kv_b_proj, [heads][dn + dv][dl] bf16 (W_UK[h] then W_UV[h]);
    // with `kv_b_tiles`, each head's W_UK ([dn][dl]) and W_UV^T ([dl][dv]) in the matrix
    // unit's tile layout (PackMatrixTiles, kernels/core/matmul.h) where W_UK and W_UV are in
    // kv_b_proj, which the projections then read in place.
    const Bf16* kv_b = nullptr;
    bool kv_b_tiles = false;
    // The absorb (latent) part reads each member's keys [absorb_from, length); the keys
    // before it are covered by `naive_passes` (root first), which must tile [0, absorb_from).
    int32_t absorb_from = 0;
    std::vector<int> naive_passes;
    bool out_bf16 = false;  // the answer rounded to bf16 (nearest even) instead of fp32
    bool causal = true;     // false: every token sees all `length` keys
  };

  // A naive-form pass over one prefix level's expanded K/V (keys [begin, end) of every
  // sequence on it), shared by the groups listed: its query rows are theirs, in list order.
  struct NaivePass {
    const Bf16* keys = nullptr;    // [heads][end - begin][dqk]
    const Bf16* values = nullptr;  // [heads][end - begin][dv]
    int32_t begin = 0;
    int32_t end = 0;
    std::vector<int> groups;
  };

  std::vector<Group> groups;
  std::vector<NaivePass> passes;
  // The attention steps' rescaling: AMLA serves; Base exists to compare against it.
  RescaleAlgorithm algorithm = RescaleAlgorithm::kAmla;
  // How many cores one attention launch can keep busy (an NPU's AIC blocks, the host's
  // threads). An attention step with fewer row groups splits their keys (split-KV) so each
  // core gets about the same number of KV blocks; the parts are merged by LSE.
  int parallel_units = 1;
  // Query rows one unit takes at a time (a GPU thread block's 64 rows), so that a row group
  // of more rows counts as that many in the balance; 0: a row group is one unit's (an NPU's
  // AIC block takes 256).
  int unit_rows = 0;
  // The same for a pass over expanded heads (dense keys), where a unit may take more rows at a
  // time (a Hopper thread block runs two tiles of one row group: 128); 0: unit_rows.
  int dense_unit_rows = 0;
  // Split parts are multiples of this many keys: the block a unit's kernel steps by (a GPU's
  // 64); 0: kKvBlockTokens (512, the AMLA kernels' block).
  int split_block_tokens = 0;
  // Split even when the row groups already fill the units, if the parts end sooner
  // (SplitPartBlocks): a GPU's thread blocks run in waves.
  bool balance_waves = false;
  // What a split part costs beyond its keys, in split blocks (SplitPartBlocks); 0: one.
  int split_part_overhead_blocks = 0;

  // The batch-invariant mode (docs/numerics.md, "Batch-invariant answers"): every answer bit
  // for bit what its query would get alone, whatever else is in the batch. What the batch
  // would otherwise change is fixed per query: a row group of r rows has its keys split into
  // ceil(length / (invariant_part_tokens x max(1, r / 128))) equal parts of whole split blocks
  // (0: kBatchInvariantPartTokens) instead of parts balanced over the units, and projection jobs
  // take at most `invariant_projection_rows` rows (a CPU's row kernel, whose sums are defined
  // row by row), or one row where B is [n][k], which that kernel does not take; 0: whole
  // groups, for a device that runs every row of a job alike and marks such steps so. Naive
  // passes are the planner's to leave out.
  bool batch_invariant = false;
  int invariant_part_tokens = 0;
  int invariant_projection_rows = 0;
};

// Keys in a batch-invariant split part of a row group of up to kBatchInvariantPartRows rows
// (DecodeBatch::invariant_part_tokens' default): long enough that a full batch's parts cost
// little more than balanced ones (within 1.07x on an H200 at 96 queries of 128 heads, 1K to
// 16K keys; 2,048 cost up to 1.2x), short enough that a lone long sequence still spreads over
// several units. A row group of more rows takes parts as many times longer.
inline constexpr int kBatchInvariantPartTokens = 4096;
inline constexpr int kBatchInvariantPartRows = 128;

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_MLA_DECODE_BATCH_H_
