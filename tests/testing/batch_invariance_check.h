#ifndef MLASERVE_TESTS_TESTING_BATCH_INVARIANCE_CHECK_H_
#define MLASERVE_TESTS_TESTING_BATCH_INVARIANCE_CHECK_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/mla/batch_step_builder.h"
#include "kernels/mla/batch_steps.h"
#include "kernels/mla/decode_batch.h"
#include "tests/testing/decode_batch_scenario.h"

namespace mlaserve::testing {

// The batch-invariant mode's check, the same on every device (DecodeBatch::batch_invariant):
// a query's answer, bit for bit, is what it gets alone, whatever batch it is in.

// One answer's bytes: its output (in its own element type), then its LSEs.
using AnswerBytes = std::vector<std::byte>;
// Every answer of a run, [group][member].
using BatchAnswerBytes = std::vector<std::vector<AnswerBytes>>;
BatchAnswerBytes ReadAnswerBytes(const BuiltBatch& built, const BatchBuffers& buffers);

// A device under test: builds and runs a batch (setting its own split knobs, as its engine
// device would: parallel units, block and part sizes, the mode's projection cut) and returns
// every answer's bytes.
using BatchRunner = std::function<absl::StatusOr<BatchAnswerBytes>(const DecodeBatch&)>;

// What the check draws from: absorb-only groups in both spaces, MTP, bf16 and fp32 answers,
// the bf16 and the FP8 cache, lengths from one key to several split parts (page-straddling
// and block-straddling ones among them). `heads` query heads; the head-space groups read
// kv_b_proj in the matrix unit's tile layout when `weight_tiles` (as the CPU devices do).
BatchScenarioSpec InvarianceScenario(int heads, bool weight_tiles);

struct InvarianceOptions {
  int trials = 6;       // random batches, besides one of two members and one of max_batch
  int max_batch = 256;  // members, drawn with repeats from the scenario's
  // The same batches out of the mode must change some answer: proof that the batches do
  // vary what the mode pins on this device (split counts), so the check can fail.
  bool expect_default_varies = true;
};

// Runs every member of the scenario alone in the mode, then random batches of 2 to
// max_batch members (which members, how many, their order and their neighbours' groups
// drawn from `seed`) in the mode: every answer must equal its member's alone, byte for byte.
void ExpectBatchInvariant(const BatchRunner& run, const BatchScenarioSpec& spec, uint64_t seed,
                          InvarianceOptions options = {});

}  // namespace mlaserve::testing

#endif  // MLASERVE_TESTS_TESTING_BATCH_INVARIANCE_CHECK_H_
