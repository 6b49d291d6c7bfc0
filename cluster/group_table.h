#ifndef MLASERVE_CLUSTER_GROUP_TABLE_H_
#define MLASERVE_CLUSTER_GROUP_TABLE_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cluster/etcd_client.h"

namespace mlaserve::cluster {

// One placement group's claim on a server, as etcd holds it for every client to see.
struct GroupClaim {
  std::string instance_id;
  int64_t weight = 0;  // queries per step it is expected to bring
  int64_t bytes = 0;   // KV bytes it is expected to hold

  std::string ToJson() const;
};
// INVALID_ARGUMENT naming the field for a value that is not a claim.
absl::StatusOr<GroupClaim> ParseGroupClaim(const std::string& json);

// The etcd key prefix of a cluster's group claims, and one claim's key: a client's own
// groups under its id, so that clients never write each other's keys.
std::string GroupsPrefix(const std::string& cluster);
std::string GroupKey(const std::string& cluster, const std::string& client_id,
                     const std::string& group);

// What every client's groups claim of each server (instance id -> summed claims).
using GroupLoads = absl::flat_hash_map<std::string, GroupClaim>;

// The placement groups of every client of a cluster, in etcd (docs/cluster.md, "Placement
// groups"). A new group is claimed with a compare-and-swap: the chooser sees every claim as of
// one revision, and the claim is written only if no other client claimed a group since; else
// the table reads again and asks the chooser again. So clients placing at once see each
// other's choices, which the servers' records (refreshed every 2 s) cannot show. Claims hang
// on this client's lease: a client that dies loses them within the lease's TTL, one that
// closes at once. A claim's weight is updated as its group grows or shrinks, without the
// guard (a new claim racing an update sees the weight before it). Thread-safe.
class GroupTable {
 public:
  // Grants the lease (UNAVAILABLE if etcd does not answer) and keeps it alive on a thread.
  static absl::StatusOr<std::unique_ptr<GroupTable>> Start(
      std::unique_ptr<EtcdClient> etcd, std::string cluster,
      absl::Duration lease_ttl = absl::Seconds(10));
  ~GroupTable();  // revokes the lease: this client's claims disappear
  GroupTable(const GroupTable&) = delete;
  GroupTable& operator=(const GroupTable&) = delete;

  // Chooses an instance for a group given the loads every other group claims.
  using Chooser = std::function<absl::StatusOr<std::string>(const GroupLoads& loads)>;
  // Claims `group` (this client's name for it) with `weight` and `bytes` on the instance
  // `choose` picks; `group`'s own earlier claim, if any, is left out of the loads it sees.
  // ABORTED after 32 rounds lost to other clients; the chooser's error as it is.
  absl::StatusOr<std::string> Claim(const std::string& group, int64_t weight, int64_t bytes,
                                    const Chooser& choose);
  // Rewrites a claimed group's weight and bytes (its instance unchanged).
  absl::Status Update(const std::string& group, int64_t weight, int64_t bytes);
  // Removes a group's claim (its last sequence released).
  absl::Status Drop(const std::string& group);

  // Every claim's loads, as of now (tests and benches).
  absl::StatusOr<GroupLoads> Loads();
  const std::string& client_id() const { return client_id_; }
  // Rounds Claim lost to another client and read again (tests).
  int64_t contended() const;

 private:
  GroupTable(std::unique_ptr<EtcdClient> etcd, std::string cluster, absl::Duration lease_ttl,
             int64_t lease, std::string client_id);
  void KeepAliveLoop();
  // Under mu_: a new lease when the old one expired, with every claim written again on it.
  absl::Status Renew();

  const std::string cluster_;
  const absl::Duration lease_ttl_;
  const std::string client_id_;

  // EtcdClient takes one caller at a time; the lock covers it and the claims. std::mutex:
  // the keep-alive thread waits on a condition variable with a timeout.
  mutable std::mutex mu_;
  std::unique_ptr<EtcdClient> etcd_;
  int64_t lease_ = 0;
  absl::flat_hash_map<std::string, GroupClaim> own_;  // by group
  int64_t contended_ = 0;
  bool stopping_ = false;
  std::condition_variable stop_;
  std::thread keep_alive_;
};

}  // namespace mlaserve::cluster

#endif  // MLASERVE_CLUSTER_GROUP_TABLE_H_
