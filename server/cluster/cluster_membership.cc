#include "server/cluster/cluster_membership.h"

#include <algorithm>
#include <utility>

#include "spdlog/spdlog.h"

namespace mlaserve::cluster {

absl::StatusOr<std::unique_ptr<ClusterMembership>> ClusterMembership::Start(
    std::unique_ptr<EtcdClient> etcd, MembershipOptions options,
    std::function<MemberRecord()> describe) {
  if (options.cluster.empty() || options.cluster.find('/') != std::string::npos) {
    return absl::InvalidArgumentError(
        "cluster: must be a non-empty name without '/' (it is a key segment in etcd)");
  }
  if (options.lease_ttl < absl::Seconds(2)) {
    return absl::InvalidArgumentError("etcd_lease_ttl_s: must be at least 2 s");
  }
  options.refresh_interval = std::min(options.refresh_interval, options.lease_ttl / 3);
  std::unique_ptr<ClusterMembership> membership(
      new ClusterMembership(std::move(etcd), std::move(options), std::move(describe)));
  membership->Refresh();
  membership->thread_ = std::thread([raw = membership.get()] { raw->Run(); });
  return membership;
}

ClusterMembership::ClusterMembership(std::unique_ptr<EtcdClient> etcd, MembershipOptions options,
                                     std::function<MemberRecord()> describe)
    : etcd_(std::move(etcd)), options_(std::move(options)), describe_(std::move(describe)) {}

ClusterMembership::~ClusterMembership() { Leave(); }

bool ClusterMembership::registered() const {
  absl::MutexLock lock(&mu_);
  return lease_ != 0;
}

void ClusterMembership::Run() {
  absl::MutexLock lock(&mu_);
  while (!leaving_) {
    const bool woken = mu_.AwaitWithTimeout(absl::Condition(&leaving_), options_.refresh_interval);
    if (woken) break;
    mu_.Unlock();
    Refresh();
    mu_.Lock();
  }
}

void ClusterMembership::Refresh() {
  const MemberRecord record = describe_();
  if (key_.empty()) key_ = MemberKey(options_.cluster, record.instance_id);
  int64_t lease;
  {
    absl::MutexLock lock(&mu_);
    if (leaving_) return;
    lease = lease_;
  }
  absl::Status status;
  if (lease != 0) {
    status = etcd_->KeepAlive(lease);
    if (absl::IsNotFound(status)) {
      spdlog::warn("cluster: lease {} expired while etcd was out of reach; registering again",
                   lease);
      lease = 0;
    }
  }
  bool fresh = false;
  if (lease == 0) {
    absl::StatusOr<int64_t> granted = etcd_->GrantLease(options_.lease_ttl);
    status = granted.status();
    if (granted.ok()) {
      lease = *granted;
      fresh = true;
    }
  }
  if (status.ok()) status = etcd_->Put(key_, record.ToJson(), lease);

  absl::MutexLock lock(&mu_);
  // The lease to renew next time: the same after an outage, 0 once it expired, or one just
  // granted (whose record a failed put leaves for the next refresh to write).
  lease_ = lease;
  // Left while the call ran: a lease granted now must not outlive the server.
  if (leaving_ && fresh) etcd_->Revoke(lease).IgnoreError();
  if (status.ok()) {
    if (fresh || warned_) {
      spdlog::info("cluster: registered in {} as {} ({} at etcd {}, lease {} of {} s)",
                   options_.cluster, record.instance_id, record.address, etcd_->target(), lease,
                   absl::ToInt64Seconds(options_.lease_ttl));
    }
    warned_ = false;
    return;
  }
  if (!warned_) {
    spdlog::warn(
        "cluster: etcd {} unreachable ({}); serving on, the record is written once it answers",
        etcd_->target(), std::string(status.message()));
    warned_ = true;
  }
}

void ClusterMembership::Leave(bool moving_out) {
  int64_t lease;
  {
    absl::MutexLock lock(&mu_);
    if (leaving_) return;
    leaving_ = true;
    lease = lease_;
    lease_ = 0;
  }
  if (thread_.joinable()) thread_.join();
  if (lease == 0) return;
  if (moving_out) {
    MemberRecord record = describe_();
    record.state = kMemberMovingOut;
    if (absl::Status put = etcd_->Put(key_, record.ToJson(), lease); !put.ok()) {
      spdlog::warn("cluster: could not mark the record moving-out ({})",
                   std::string(put.message()));
    }
  }
  if (absl::Status revoked = etcd_->Revoke(lease); revoked.ok()) {
    spdlog::info("cluster: left {} (lease {} revoked)", options_.cluster, lease);
  } else {
    spdlog::warn("cluster: could not revoke lease {} ({}); the record expires within {} s", lease,
                 std::string(revoked.message()), absl::ToInt64Seconds(options_.lease_ttl));
  }
}

}  // namespace mlaserve::cluster
