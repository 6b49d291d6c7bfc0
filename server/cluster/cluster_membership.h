#ifndef MLASERVE_SERVER_CLUSTER_CLUSTER_MEMBERSHIP_H_
#define MLASERVE_SERVER_CLUSTER_CLUSTER_MEMBERSHIP_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cluster/etcd_client.h"
#include "cluster/member_record.h"

namespace mlaserve::cluster {

struct MembershipOptions {
  std::string cluster = "default";
  // The member's key lives as long as its lease: a server that dies (kill -9) leaves the
  // membership at most this long after its last renewal.
  absl::Duration lease_ttl = absl::Seconds(10);
  // How often the lease is renewed and the record's load rewritten (at most lease_ttl / 3).
  absl::Duration refresh_interval = absl::Seconds(2);
};

// A server's membership in a cluster: its record under MemberKey(cluster, instance id),
// attached to a lease it renews, with the load rewritten at every renewal. An unreachable
// etcd never stops the server: the membership logs one warning, keeps trying, and registers
// again (with a new lease) once etcd answers, also after its old lease expired meanwhile.
class ClusterMembership {
 public:
  // `describe` gives the record as of now (load included); called from the membership's
  // thread. Returns once the first registration was tried (its outcome is logged).
  static absl::StatusOr<std::unique_ptr<ClusterMembership>> Start(
      std::unique_ptr<EtcdClient> etcd, MembershipOptions options,
      std::function<MemberRecord()> describe);
  ~ClusterMembership();

  // Leaves the cluster: the renewals stop and the lease is revoked, so the key disappears at
  // once (a drain calls this first, so clients stop placing work here). `moving_out` (the
  // drain of mlaserve-ctl drain, whose sequences move to other servers): the record says so
  // before it goes, so clients keep calling this server for them until they are moved.
  // Later calls do nothing.
  void Leave(bool moving_out = false);

  // Whether the record is in etcd as of the last renewal (for tests and logs).
  bool registered() const;

 private:
  ClusterMembership(std::unique_ptr<EtcdClient> etcd, MembershipOptions options,
                    std::function<MemberRecord()> describe);
  // One renewal: register if needed, else renew the lease and rewrite the record.
  void Refresh();
  void Run();

  std::unique_ptr<EtcdClient> etcd_;
  const MembershipOptions options_;
  const std::function<MemberRecord()> describe_;
  std::string key_;

  mutable absl::Mutex mu_;
  bool leaving_ ABSL_GUARDED_BY(mu_) = false;
  int64_t lease_ ABSL_GUARDED_BY(mu_) = 0;  // 0: not registered
  bool warned_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace mlaserve::cluster

#endif  // MLASERVE_SERVER_CLUSTER_CLUSTER_MEMBERSHIP_H_
