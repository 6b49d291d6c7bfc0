#ifndef MLASERVE_CLIENT_LOADGEN_LOAD_TARGET_H_
#define MLASERVE_CLIENT_LOADGEN_LOAD_TARGET_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/core/bfloat16.h"
#include "kernels/core/kv_dtype.h"

namespace mlaserve::loadgen {

// The model as the target serves it.
struct TargetModel {
  std::string name;
  int layers = 0;
  int heads = 0;
  int dn = 0;
  int dr = 0;
  int dl = 0;
  int max_batch = 0;
  // The format a sequence created without one is held in (GetServerInfo's default_kv_dtype);
  // unset where the server does not say.
  std::optional<KvDtype> default_kv_dtype;
  // The width of a head-space answer; 0 where the target does not say (then dn, as in every
  // preset).
  int dv = 0;
  int dk() const { return dl + dr; }
  int head_width() const { return dv > 0 ? dv : dn; }
};

// One decode query of a load step: head space (q_nope, q_pe) or latent (q_latent), with the
// step's new KV row appended first. The spans point into the workload's pre-generated data.
struct LoadQuery {
  std::string sequence_id;
  int layer = 0;
  int sq = 1;
  bool head_space = true;
  std::span<const Bf16> q_nope;    // [sq][heads][dn]
  std::span<const Bf16> q_pe;      // [sq][heads][dr]
  std::span<const Bf16> q_latent;  // [sq][heads][dk]
  std::span<const Bf16> append;    // [1][dk]
  int64_t append_position = 0;
};

// What the load generator keeps of an answer: how the server ran it.
struct LoadAnswer {
  bool hybrid = false;
  int group_size = 0;
  int batch_size = 0;
  double queue_us = 0;
  double device_modeled_us = 0;
  double device_host_us = 0;
  bool fp8 = false;  // the absorb part read the FP8 cache
};

// Where the load goes: a server over gRPC, or (for the overhead benchmark) an engine in the
// same process. Thread-safe: workers call it concurrently.
class LoadTarget {
 public:
  virtual ~LoadTarget() = default;
  virtual absl::StatusOr<TargetModel> Model() = 0;
  // `latent` is [layers][tokens][dk]. `kv_dtype` unset: the server's default (a sequence on a
  // prefix holds the prefix's).
  virtual absl::Status RegisterPrefix(const std::string& id, std::span<const Bf16> latent,
                                      int tokens, std::optional<KvDtype> kv_dtype) = 0;
  virtual absl::Status ReleasePrefix(const std::string& id) = 0;
  virtual absl::Status CreateSequence(const std::string& id, const std::string& prefix_id,
                                      std::optional<KvDtype> kv_dtype) = 0;
  virtual absl::Status ReleaseSequence(const std::string& id) = 0;
  // `rows` is [n][dk] for one layer.
  virtual absl::Status AppendKv(const std::string& id, int layer, int64_t position,
                                std::span<const Bf16> rows) = 0;
  virtual absl::StatusOr<std::vector<LoadAnswer>> Decode(const std::vector<LoadQuery>& queries) = 0;
};

// A prefix every target holds (their sequences are spread over them all): registered on each
// in turn, stopping at the first failure.
inline absl::Status RegisterPrefixOnEvery(std::span<const std::unique_ptr<LoadTarget>> targets,
                                          const std::string& id, std::span<const Bf16> latent,
                                          int tokens, std::optional<KvDtype> kv_dtype) {
  for (const auto& target : targets) {
    if (absl::Status status = target->RegisterPrefix(id, latent, tokens, kv_dtype); !status.ok()) {
      return status;
    }
  }
  return absl::OkStatus();
}

// Its release from every target, each tried; the first failure.
inline absl::Status ReleasePrefixOnEvery(std::span<const std::unique_ptr<LoadTarget>> targets,
                                         const std::string& id) {
  absl::Status first = absl::OkStatus();
  for (const auto& target : targets) first.Update(target->ReleasePrefix(id));
  return first;
}

}  // namespace mlaserve::loadgen

#endif  // MLASERVE_CLIENT_LOADGEN_LOAD_TARGET_H_
