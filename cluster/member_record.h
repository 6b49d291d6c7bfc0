#ifndef MLASERVE_CLUSTER_MEMBER_RECORD_H_
#define MLASERVE_CLUSTER_MEMBER_RECORD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace mlaserve::cluster {

// What a server says of itself in etcd, under MemberKey(cluster, instance_id), as JSON: what
// placement needs to choose it (address, model, KV formats, devices, budget) and its load,
// refreshed while it serves. The schema is docs/cluster.md's; readers ignore fields they do
// not know, so a newer server can add some.
struct MemberRecord {
  std::string instance_id;
  std::string address;  // host:port clients dial
  std::string version;
  std::string model;
  int layers = 0;
  int heads = 0;
  std::vector<std::string> kv_formats;  // "bf16", "fp8"
  std::string default_kv_format;
  int devices = 0;
  std::string device_profile;
  int64_t kv_budget_bytes = 0;
  // Load, as of `updated_unix_ms`.
  int64_t kv_used_bytes = 0;
  int32_t sequences = 0;
  int32_t prefixes = 0;
  int32_t queued_queries = 0;
  double queries_per_s = 0;  // decode queries answered per second since the last update
  int64_t updated_unix_ms = 0;
  // "serving", or "moving-out" from when a drain takes the server out of the cluster until
  // its key goes: clients keep calling it for the sequences it still holds (they move and
  // are redirected) instead of failing them as a lost server's. Optional in the JSON.
  std::string state = "serving";

  std::string ToJson() const;
  friend bool operator==(const MemberRecord&, const MemberRecord&) = default;
};

// INVALID_ARGUMENT naming the field for a value that is not a record.
absl::StatusOr<MemberRecord> ParseMemberRecord(const std::string& json);

inline constexpr char kMemberMovingOut[] = "moving-out";

// The etcd key prefix of a cluster's members, and one member's key.
std::string MembersPrefix(const std::string& cluster);
std::string MemberKey(const std::string& cluster, const std::string& instance_id);

}  // namespace mlaserve::cluster

#endif  // MLASERVE_CLUSTER_MEMBER_RECORD_H_
