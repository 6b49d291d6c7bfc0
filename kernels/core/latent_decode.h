#ifndef MLASERVE_KERNELS_CORE_LATENT_DECODE_H_
#define MLASERVE_KERNELS_CORE_LATENT_DECODE_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/core/attention_rows.h"
#include "kernels/core/bfloat16.h"
#include "kernels/core/kv_block_source.h"
#include "kernels/core/paged_kv_cache.h"
#include "kernels/core/tensor_view.h"

namespace mlaserve {

// A batch of decode queries in latent (absorbed) form against a paged latent cache: the
// FlashMLA `flash_mla_with_kvcache` problem. Query row order inside a request is (token, head),
// so a request contributes sq * heads rows.
struct LatentDecodeProblem {
  TensorView<const Bf16, 4> q;  // [batch][sq][heads][dk]; dk == cache width
  PagedKvCache cache;
  PagedSequences seqs;
  int dv = 512;                // V = the first dv columns of each latent key row
  float softmax_scale = 0.0f;  // always the caller's (model config); never defaulted
  bool causal = true;          // MTP tokens see only keys up to their own position

  int batch() const { return static_cast<int>(q.dim(0)); }
  int sq() const { return static_cast<int>(q.dim(1)); }
  int heads() const { return static_cast<int>(q.dim(2)); }
  int dk() const { return static_cast<int>(q.dim(3)); }
};

absl::Status ValidateLatentDecodeProblem(const LatentDecodeProblem& p);

// Keys visible to query token s (0-based among the sq new tokens) of a sequence of `seqlen`
// cached tokens, the new ones included (FlashMLA's bottom-right aligned causal mask).
constexpr int VisibleKeys(int seqlen, int sq, int s, bool causal) {
  if (!causal) return seqlen;
  return std::clamp(seqlen - sq + s + 1, 0, seqlen);
}

// Normalised fp32 outputs and natural-log LSEs of a decode batch.
struct AttentionOutput {
  std::vector<float> out;  // [batch][sq][heads][dv]
  std::vector<float> lse;  // [batch][sq][heads]; -inf where a row saw no key
};

// Attention kernel over rows: what Base and AMLA implement.
using RowKernel = absl::FunctionRef<void(const QueryRows&, KvBlockSource&, float, RowOutputs)>;

// Validates the problem and runs `kernel` once per request over its paged latent keys.
absl::StatusOr<AttentionOutput> RunLatentDecode(const LatentDecodeProblem& p, RowKernel kernel);

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_CORE_LATENT_DECODE_H_
