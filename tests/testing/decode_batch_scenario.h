#ifndef MLASERVE_TESTS_TESTING_DECODE_BATCH_SCENARIO_H_
#define MLASERVE_TESTS_TESTING_DECODE_BATCH_SCENARIO_H_

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "kernels/core/kv_dtype.h"
#include "kernels/core/random_fill.h"
#include "kernels/core/up_projection.h"
#include "kernels/mla/batch_step_builder.h"
#include "kernels/mla/decode_batch.h"
#include "kernels/reference/golden_attention.h"

namespace mlaserve::testing {

// A random decode batch at the kernels' level (kernels/mla/decode_batch.h), with the real
// MLA widths and few heads: one layer's kv_b_proj, a tree of shared prefixes, sequences on
// them in a paged pool (each in its own shuffled pages, every unused row NaN, so a kernel
// that reads past a sequence poisons its answer), every prefix level's expanded K/V, and the
// queries; plus the fp64 golden of every answer from the same inputs.
struct BatchScenarioSpec {
  struct Prefix {
    int parent = -1;  // index of the prefix it extends, or -1
    int tokens = 0;   // tokens it adds
  };
  struct Group {
    bool head_space = true;
    int sq = 1;
    int prefix = -1;              // the deepest prefix its sequences start on, or -1
    std::vector<int> own_tokens;  // per member: tokens after the prefix chain
    bool hybrid = false;          // naive passes over the prefix chain, absorb after it
    bool out_bf16 = false;
    // fp8: its sequences are read from the FP8 copy of the pool, and its prefix levels'
    // expanded K/V come from the dequantised rows (as the store expands an FP8 prefix).
    KvDtype kv_dtype = KvDtype::kBf16;
  };
  int heads = 8;
  int page_size = 64;
  std::vector<Prefix> prefixes;
  std::vector<Group> groups;
  // Hybrid groups share one naive pass per prefix level (tree-aware) or take their own.
  bool shared_passes = true;
  int parallel_units = 1;
  int split_block_tokens = 0;  // DecodeBatch's (0: the NPU kernels' 512)
  // Every latent row and query is drawn N(0, data_scale^2); 0.1 is FlashMLA's test recipe.
  double data_scale = 1.0;
  // Head-space groups read kv_b_proj in the matrix unit's tile layout, as the engine's CPU
  // devices do (DecodeBatch::Group::kv_b_tiles).
  bool weight_tiles = false;
  // DecodeBatch's batch-invariant mode and its projection cut.
  bool batch_invariant = false;
  int invariant_projection_rows = 0;
};

class BatchScenario {
 public:
  static std::unique_ptr<BatchScenario> Make(const BatchScenarioSpec& spec, uint64_t seed);

  const DecodeBatch& batch() const { return batch_; }
  // The fp64 golden of group g, member m: out [sq][heads][width], lse [sq][heads].
  GoldenOutput Golden(int g, int m) const;

 private:
  BatchScenario() = default;
  UpProjection Weights() const;

  BatchScenarioSpec spec_;
  DecodeBatch batch_;
  std::vector<Bf16> kv_b_;                                    // [heads][dn + dv][dl]
  std::vector<Bf16> kv_b_tiles_;                              // the same, tiled, or empty
  std::vector<Bf16> pool_;                                    // [pages][page_size][dk]
  std::vector<std::byte> fp8_pool_;                           // the same pages in FP8
  std::vector<std::vector<std::vector<int32_t>>> pages_;      // [group][member]
  std::vector<std::vector<std::vector<Bf16>>> queries_;       // [group][member]: q_nope | q_latent
  std::vector<std::vector<std::vector<Bf16>>> rope_queries_;  // [group][member]: q_pe
  std::vector<std::vector<Bf16>> level_keys_, level_values_;  // [prefix]
};

// The batches every device is held to (tests of the builder, the host runner and the NPU
// lowering share them): absorb-only in both spaces, MTP, bf16 answers, one-level and
// two-level TyphoonMLA with shared and with per-group passes, split-KV in both attention
// steps, and a mixed batch.
struct NamedScenario {
  std::string name;
  BatchScenarioSpec spec;
};
// Parameterised tests name a scenario by its name (not its bytes) in their listings.
inline void PrintTo(const NamedScenario& scenario, std::ostream* os) { *os << scenario.name; }
std::vector<NamedScenario> StandardBatchScenarios();

// The absorb-only standard batches in the batch-invariant mode (DecodeBatch::batch_invariant):
// fixed-length split parts and projection jobs cut to a few rows, held to the same golden.
std::vector<NamedScenario> InvariantBatchScenarios();

// The same batches with every group on the FP8 cache, at FlashMLA's data scale (0.1), where
// SnapMLA's accuracy bounds are defined (docs/numerics.md, "FP8 accuracy").
std::vector<NamedScenario> Fp8BatchScenarios();

// Reads one answer of a run out of its buffers as fp32 (bf16 answers widened).
struct AnswerValues {
  std::vector<float> out;
  std::vector<float> lse;
};
AnswerValues ReadAnswer(const BatchBuffers& buffers, const AnswerRef& ref);

}  // namespace mlaserve::testing

#endif  // MLASERVE_TESTS_TESTING_DECODE_BATCH_SCENARIO_H_
