#ifndef MLASERVE_CLUSTER_ETCD_CLIENT_H_
#define MLASERVE_CLUSTER_ETCD_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "grpcpp/channel.h"
#include "grpcpp/security/credentials.h"

namespace mlaserve::cluster {

// The calls of etcd's v3 API that cluster membership and placement make (leases, puts,
// prefix reads, one guarded transaction),
// over etcd's own gRPC messages (compiled from Debian's golang-etcd-server-dev). Each call is
// bounded by `call_timeout`; an unreachable etcd is UNAVAILABLE or DEADLINE_EXCEEDED, never a
// hang. Thread-compatible: one caller at a time, or one client per thread.
class EtcdClient {
 public:
  // `endpoints`: host:port of etcd members (the first that answers serves the calls: gRPC's
  // pick_first over them when they are IP addresses, else the first name).
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Connect(
      const std::vector<std::string>& endpoints,
      std::shared_ptr<grpc::ChannelCredentials> credentials,
      absl::Duration call_timeout = absl::Seconds(2));

  // A lease of `ttl` (etcd may round it); its id.
  absl::StatusOr<int64_t> GrantLease(absl::Duration ttl);
  // Renews the lease once: NOT_FOUND when it has expired or was revoked (its keys are gone).
  absl::Status KeepAlive(int64_t lease);
  absl::Status Revoke(int64_t lease);
  // Writes `key` = `value`, attached to `lease` (0: none; the key then outlives the writer).
  absl::Status Put(const std::string& key, const std::string& value, int64_t lease);
  // Deletes `key` (OK when it is absent).
  absl::Status Delete(const std::string& key);
  // Writes `puts` (key, value, all attached to `lease`) in one transaction, only if `guard`
  // has not been written since `revision` (a store revision from ReadPrefix; an absent guard
  // counts as unwritten), and then writes `guard` too, so that two writers that read the same
  // revision cannot both succeed. False when the guard had moved: read again and retry.
  absl::StatusOr<bool> PutIfUnchangedSince(
      const std::string& guard, int64_t revision,
      const std::vector<std::pair<std::string, std::string>>& puts, int64_t lease);
  // Every key under `prefix`, in key order, with its value.
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> GetPrefix(
      const std::string& prefix);

  // The keys under `prefix` and the store's revision they are as of (a watch from
  // revision + 1 then misses no change).
  struct PrefixRead {
    int64_t revision = 0;
    std::vector<std::pair<std::string, std::string>> pairs;
  };
  absl::StatusOr<PrefixRead> ReadPrefix(const std::string& prefix);

  // One change under a watched prefix: a put (value set) or a delete (a lease that expired or
  // was revoked deletes its keys).
  struct WatchEvent {
    bool deleted = false;
    std::string key;
    std::string value;
  };
  // Watches `prefix` from `start_revision`, calling `on_event` for each change in order,
  // until `context` is cancelled (then CANCELLED) or the stream breaks (etcd gone, the
  // revision compacted: the caller reads again and watches on). No call deadline: the
  // channel's keepalive notices a silent etcd. Blocks; one watch per context.
  absl::Status WatchPrefix(const std::string& prefix, int64_t start_revision,
                           grpc::ClientContext& context,
                           const std::function<void(const WatchEvent&)>& on_event);

  // The gRPC target the endpoints became (for logs).
  const std::string& target() const { return target_; }

 private:
  EtcdClient(std::string target, std::shared_ptr<grpc::Channel> channel,
             absl::Duration call_timeout);
  void Prepare(grpc::ClientContext& context) const;

  std::string target_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<etcdserverpb::KV::Stub> kv_;
  std::unique_ptr<etcdserverpb::Lease::Stub> lease_;
  std::unique_ptr<etcdserverpb::Watch::Stub> watch_;
  absl::Duration call_timeout_;
};

// Credentials for etcd's client port: plaintext without `ca_file`; TLS trusting `ca_file`'s
// certificates, and with `cert_file` and `key_file` a client certificate for an etcd that
// requires one (--client-cert-auth). INVALID_ARGUMENT naming the flag (--etcd_ca,
// --etcd_cert, --etcd_key) whose file cannot be read, or a certificate without its key.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> EtcdChannelCredentials(
    const std::string& ca_file, const std::string& cert_file, const std::string& key_file);

// The key range [prefix, end) etcd reads for a prefix: the prefix with its last byte that is
// not 0xff raised by one ("\0" for an empty prefix: every key).
std::string PrefixRangeEnd(const std::string& prefix);

}  // namespace mlaserve::cluster

#endif  // MLASERVE_CLUSTER_ETCD_CLIENT_H_
