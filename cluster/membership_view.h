#ifndef MLASERVE_CLUSTER_MEMBERSHIP_VIEW_H_
#define MLASERVE_CLUSTER_MEMBERSHIP_VIEW_H_

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cluster/etcd_client.h"
#include "cluster/member_record.h"

namespace mlaserve::cluster {

// The members of a cluster as a client sees them: read from etcd once, then kept current by
// a watch on MembersPrefix(cluster) (a server that registers, refreshes its load, drains or
// whose lease expires shows here within the watch's delay). When etcd cannot be reached the
// view keeps the last membership it had, logs one warning, says so in stale(), and keeps
// trying; it reads everything again once etcd answers. Thread-safe.
class MembershipView {
 public:
  // Reads the membership before returning: UNAVAILABLE naming the endpoints when etcd did not
  // answer within `first_read_timeout` (a client has nothing to place on without it).
  static absl::StatusOr<std::unique_ptr<MembershipView>> Start(
      std::unique_ptr<EtcdClient> etcd, std::string cluster,
      absl::Duration first_read_timeout = absl::Seconds(5));
  ~MembershipView();

  // Every member, in instance id order.
  std::vector<MemberRecord> Members() const;
  // One member by instance id; nullopt once it has left (or never was).
  std::optional<MemberRecord> Find(const std::string& instance_id) const;
  // Whether it is a member, without copying its record (every routed call asks).
  bool Contains(const std::string& instance_id) const;
  // Whether `instance_id` left with its record saying "moving-out" (a drain that moves its
  // sequences to other servers): it still answers for them until they have moved.
  bool MovedOut(const std::string& instance_id) const;
  // True while etcd is unreachable and the members are the last ones seen.
  bool stale() const;
  // How many times the membership changed (puts and deletes seen); for tests that wait.
  int64_t changes() const;
  const std::string& cluster() const { return cluster_; }

 private:
  MembershipView(std::unique_ptr<EtcdClient> etcd, std::string cluster);
  absl::Status ReadAll();
  void Apply(const EtcdClient::WatchEvent& event);
  void Run();

  std::unique_ptr<EtcdClient> etcd_;
  const std::string cluster_;
  const std::string prefix_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, MemberRecord> members_ ABSL_GUARDED_BY(mu_);  // by key
  int64_t revision_ ABSL_GUARDED_BY(mu_) = 0;
  bool stale_ ABSL_GUARDED_BY(mu_) = false;
  int64_t changes_ ABSL_GUARDED_BY(mu_) = 0;
  // Instances that left moving out, the latest few (a drain's sequences are moved within
  // seconds; older ones no longer matter).
  std::deque<std::string> moved_out_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* watch_context_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::thread thread_;
};

}  // namespace mlaserve::cluster

#endif  // MLASERVE_CLUSTER_MEMBERSHIP_VIEW_H_
