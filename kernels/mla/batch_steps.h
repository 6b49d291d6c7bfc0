#ifndef MLASERVE_KERNELS_MLA_BATCH_STEPS_H_
#define MLASERVE_KERNELS_MLA_BATCH_STEPS_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "kernels/core/bfloat16.h"
#include "kernels/core/element_type.h"
#include "kernels/core/fp8_paged_kv_cache.h"
#include "kernels/mla/rescale_algorithm.h"
#include "kernels/mla/step_jobs.h"

namespace mlaserve {

// A decode batch as the arithmetic it needs: buffers, the copies that stage the queries into
// them, and an ordered list of steps (projections, attention passes, LSE combines). The
// engine's planner writes the list once; every device lowers it: the host runs each step
// with the host kernels (kernels/mla/host_batch_runner.h), the emulated NPU turns each step
// into one kernel launch (kernels/npu/programs/batch_launch.h). Each step's semantics below is
// the definition both follow, so a batch's answers do not depend on the device that ran it.
//
// Everything is explicit (sizes, strides, offsets), so nothing here knows about models,
// groups or sequences; a step's jobs are independent of each other and may run in any order
// or in parallel, while steps run in list order.

// A buffer of the batch.
struct StepBuffer {
  enum class Kind {
    kInput,    // caller memory, read only, alive while the device runs (mapped, not copied,
               // into an NPU's global memory): the KV pool, weights, expanded K/V
    kScratch,  // device memory, initial contents undefined unless `fill` says otherwise
    kOutput,   // device memory the caller reads after the run (answers)
  };
  // What a scratch or output buffer holds before the first step: rows that no step writes
  // must read as an empty attention part (output 0, lse -inf).
  enum class Fill { kNone, kZero, kNegInfinity };

  std::string name;  // for errors and the emulator's allocation labels
  Kind kind = Kind::kScratch;
  ElementType type = ElementType::kFp32;
  int64_t elements = 0;
  Fill fill = Fill::kNone;
  const void* input = nullptr;  // kInput only
};

// `offset` elements into buffer `buffer`; an operand extends from there as its job's sizes
// and strides say.
struct BufferRef {
  int buffer = -1;
  int64_t offset = 0;
};

// Stage: copy `rows` rows of `width` bf16 values from caller memory into a buffer (on an NPU,
// the host-to-device copy of the queries).
struct StageCopy {
  const Bf16* src = nullptr;
  int64_t src_stride = 0;  // elements between rows
  BufferRef dst;           // a bf16 buffer
  int64_t dst_stride = 0;
  int rows = 0;
  int width = 0;
};

using ProjectionJob = BasicProjectionJob<BufferRef>;

struct ProjectionStep {
  std::string name;  // "absorb_q", "project_out"
  std::vector<ProjectionJob> jobs;
  // A row's result must not depend on the other rows of its job (DecodeBatch::
  // batch_invariant): a device whose kernels sum in another order for jobs of few rows (a
  // GPU's row kernel against its tiled GEMM) runs every job of the step on one kernel.
  bool batch_invariant = false;
};

// Keys of a paged latent cache: token t of the row group is row (first_token + t) % page_size
// of page pages[(first_token + t) / page_size] in `pool` ([pages][page_size][width] bf16);
// values are the first dv columns of the keys (MLA's c_kv).
struct PagedKeysRef {
  BufferRef pool;
  int page_size = 0;
  int width = 0;
  std::span<const int32_t> pages;  // caller memory, alive while the device runs
  int32_t first_token = 0;
};

// Keys of the FP8 latent cache (kernels/core/fp8_paged_kv_cache.h): token t of the row group
// is row (first_token + t) % page_size of page pages[(first_token + t) / page_size] in `pool`
// (a byte buffer of pages in `layout`); values are the keys' e4m3 content. Always attended to
// with SnapMLA over AMLA (kernels/mla/snap_amla.h): the host whatever the step's algorithm,
// the emulated NPU only under AMLA (it refuses Base over FP8 keys before launching).
struct Fp8PagedKeysRef {
  BufferRef pool;
  Fp8PageLayout layout;
  std::span<const int32_t> pages;  // caller memory, alive while the device runs
  int32_t first_token = 0;
};

// Dense keys [length][ldk] and values [length][ldv] (one head of an expanded K/V), bf16.
struct DenseKeysRef {
  BufferRef k;
  int64_t ldk = 0;
  BufferRef v;
  int64_t ldv = 0;
};

// At most kMaxRowGroupRows query rows (bf16 [rows][dk], dense) attending over the same keys;
// row i sees keys [0, visible[i]). Output: the normalised rows (fp32, or bf16 if `out_bf16`)
// `out_stride` elements apart and natural-log LSEs `lse_stride` apart; a row that sees no key
// writes zeros and -inf. Online softmax over KV blocks of kKvBlockTokens from key 0, rescaled
// as the step's algorithm says (kernels/mla/amla.h, kernels/mla/flash_base.h).
struct AttentionRowGroup {
  BufferRef q;
  int rows = 0;
  std::vector<int32_t> visible;
  std::variant<PagedKeysRef, Fp8PagedKeysRef, DenseKeysRef> keys;
  BufferRef out;
  int64_t out_stride = 0;
  bool out_bf16 = false;
  BufferRef lse;
  int64_t lse_stride = 1;
};

inline constexpr int kMaxRowGroupRows = 256;  // the AMLA paper's task height

struct AttentionStep {
  std::string name;  // "latent", "naive"
  RescaleAlgorithm algorithm = RescaleAlgorithm::kAmla;
  bool fp8_quantize_queries = true;  // for row groups over FP8 keys (SnapAmlaOptions)
  int dk = 0;
  int dv = 0;
  float softmax_scale = 0;
  std::vector<AttentionRowGroup> groups;
};

// Merges `parts` partial results of the same rows over disjoint keys (fp32 [rows][dv] and
// lse [rows], dense, in part order) into `out` (stride out_stride, bf16 if out_bf16) and `lse`
// (stride lse_stride), as CombineLseParts (kernels/mla/lse_combine.h) defines it. `out` and
// `lse` may be the first part's own buffers (an in-place merge).
using CombineJob = BasicCombineJob<BufferRef>;

struct CombineStep {
  std::string name;  // "split_merge", "prefix_merge"
  std::vector<CombineJob> jobs;
};

using BatchStep = std::variant<ProjectionStep, AttentionStep, CombineStep>;

struct BatchSteps {
  std::vector<StepBuffer> buffers;
  std::vector<StageCopy> staging;
  std::vector<BatchStep> steps;

  int AddBuffer(StepBuffer buffer) {
    buffers.push_back(std::move(buffer));
    return static_cast<int>(buffers.size()) - 1;
  }
};

// Checks every reference against its buffer (kind, element type, bounds of the rows and
// strides a job touches), so a device never reads or writes outside a batch's memory:
// INTERNAL naming the step and job otherwise (a planner bug, never a client's).
absl::Status ValidateBatchSteps(const BatchSteps& steps);

// Checks that every input and every query to stage has memory to execute on (a model-only
// run needs neither): INVALID_ARGUMENT naming what has none.
absl::Status CheckExecutable(const BatchSteps& steps);

// A scratch or output buffer's contents before the first step, as its `fill` says.
void FillStepBuffer(StepBuffer::Fill fill, std::byte* data, int64_t bytes);

// The rows of a staging copy, into `dst` (the copy's destination buffer at its offset).
void RunStageCopy(const StageCopy& copy, Bf16* dst);

// Where a device left a run's buffers. Outputs are read through it; it keeps them alive.
class BatchBuffers {
 public:
  virtual ~BatchBuffers() = default;
  virtual std::span<const std::byte> Bytes(int buffer) const = 0;

  template <typename T>
  std::span<const T> Elements(BufferRef ref, int64_t count) const {
    const std::span<const std::byte> bytes = Bytes(ref.buffer);
    return {reinterpret_cast<const T*>(bytes.data()) + ref.offset, static_cast<size_t>(count)};
  }
};

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_MLA_BATCH_STEPS_H_
