#ifndef MLASERVE_CLIENT_CLUSTER_CLUSTER_CLIENT_H_
#define MLASERVE_CLIENT_CLUSTER_CLUSTER_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/cluster/context_parallel.h"
#include "client/mlaserve_client.h"
#include "client/serving_client.h"
#include "cluster/group_table.h"
#include "cluster/membership_view.h"
#include "cluster/placement.h"
#include "grpcpp/security/credentials.h"

namespace mlaserve::client {

struct ClusterOptions {
  // etcd's client endpoints (host:port) and the cluster's name (the servers' --cluster).
  std::vector<std::string> etcd_endpoints;
  std::string cluster = "default";
  // Towards etcd (cluster::EtcdChannelCredentials); null: plaintext.
  std::shared_ptr<grpc::ChannelCredentials> etcd_credentials;
  // Towards each server: TLS, tenant token, retries, deadlines.
  ClientOptions server_options;
  // The KV a new sequence is expected to grow to, in tokens: the room placement asks of a
  // server (its record's load catches up within its refresh interval).
  int64_t expected_sequence_tokens = 2048;
  // A prefix's sequences on one server beyond which new ones go to another server, the prefix
  // registered there too (ClusterClient places by cluster::PlaceSequence). -1: twice the
  // servers' TyphoonMLA B_theta for one query token (rounded up): a group stays above B_theta,
  // and so hybrid, while its sequences come and go; 0: never spread while the prefix's server
  // has room.
  int spread_group = -1;
  // Context parallelism: a sequence holds at most this many positions per server (its
  // prefix's tokens on top for the first part); past that, its next positions go to a part on
  // another server and its decodes fan out to every part, merged by LSE. 0: one server.
  int64_t context_part_tokens = 0;
  // Placement groups (docs/cluster.md, "Placement groups"): a new sequence on a prefix, or
  // with a placement group, joins its group's server; a new group is claimed in etcd with a
  // compare-and-swap against every client's claims, on the server rendezvous hashing picks
  // within the load bound. false: each client places alone on the servers' records, as before
  // (etcd then needs no writes from clients).
  bool placement_groups = true;
  // The load bound: no server above (1 + load_slack) of the mean claimed load once a group
  // is placed on it.
  double load_slack = 0.15;
  // The placement group of a sequence created without one, from its id (a serving framework's
  // data-parallel rank, say: the load generator passes the rank its ids carry). Null, or an
  // empty answer: its prefix is its group.
  std::function<std::string(absl::string_view sequence_id)> placement_group_of;
  // The etcd lease of this client's group claims: a client that dies loses them this long after.
  absl::Duration group_lease_ttl = absl::Seconds(10);
  // How often a thread of the client calls Rebalance (zero: never; the caller may still call it).
  absl::Duration rebalance_interval = absl::ZeroDuration();
};

// What one Rebalance did.
struct RebalanceReport {
  int groups_moved = 0;
  int sequences_moved = 0;
  int64_t bytes_moved = 0;
  double seconds = 0;
};

// The client of a cluster of mlaserve servers on etcd (docs/cluster.md): watches the
// membership, places each new sequence (prefix affinity, then capacity), remembers where it
// put it, and sends each later call straight to that server, with no proxy in between. A
// Decode carrying sequences of several servers becomes one call per server, in parallel.
// A call for a sequence whose server has left the cluster (drained, or its lease expired
// after a kill -9) fails at once with UNAVAILABLE naming the server; other sequences are
// unaffected. A sequence moved to another server (mlaserve-ctl drain) is followed there. Sequences
// and prefixes are this client's: another client's are not seen, but every client's placement
// groups are (their claims in etcd), so that clients placing at once spread. Thread-safe.
class ClusterClient final : public ServingClient {
 public:
  // Reads the membership from etcd (UNAVAILABLE if etcd does not answer within 5 s, or no
  // server has registered) and keeps watching it.
  static absl::StatusOr<std::unique_ptr<ClusterClient>> Connect(ClusterOptions options);
  // Over an existing view (tests, or a process that shares one); `groups`: the table of
  // placement groups, null for each client alone.
  static absl::StatusOr<std::unique_ptr<ClusterClient>> Create(
      std::unique_ptr<cluster::MembershipView> view, ClusterOptions options,
      std::unique_ptr<cluster::GroupTable> groups = nullptr);

  ~ClusterClient() override;
  ClusterClient(const ClusterClient&) = delete;
  ClusterClient& operator=(const ClusterClient&) = delete;

  absl::StatusOr<v1::GetServerInfoResponse> GetServerInfo() override;
  // Registers the prefix on the server with the most room; the client keeps `latent` to
  // register it on more servers as its sequences spread. A child prefix goes where its parent
  // is first placed and follows it.
  absl::Status RegisterPrefix(absl::string_view prefix_id, absl::string_view parent_id,
                              const v1::Tensor& latent,
                              v1::KvDtype kv_dtype = v1::KV_DTYPE_UNSPECIFIED) override;
  // Releases the prefix on every server that holds it.
  absl::Status ReleasePrefix(absl::string_view prefix_id) override;
  absl::StatusOr<v1::Sequence> CreateSequence(
      absl::string_view sequence_id, absl::string_view prefix_id = "",
      v1::KvDtype kv_dtype = v1::KV_DTYPE_UNSPECIFIED) override;
  // In `placement_group` (a serving framework's rank: the sequences its calls carry
  // together), kept on one server with the group's other sequences on the same prefix up to
  // the spread size (twice B_theta), past which a second group of them is placed.
  absl::StatusOr<v1::Sequence> CreateSequence(absl::string_view sequence_id,
                                              absl::string_view prefix_id, v1::KvDtype kv_dtype,
                                              absl::string_view placement_group);
  // The fork lives where its source does (every part forked on its server).
  absl::StatusOr<v1::Sequence> ForkSequence(absl::string_view source_id, absl::string_view new_id);
  // Releases every part; a part on a server that has left is forgotten.
  absl::Status ReleaseSequence(absl::string_view sequence_id) override;
  absl::Status AppendKv(std::span<const KvAppend> appends) override;
  absl::Status AppendKv(absl::string_view sequence_id, int layer, int64_t start_position,
                        const v1::Tensor& rows);
  absl::StatusOr<v1::DecodeResponse> DecodeRaw(const v1::DecodeRequest& request) override;
  absl::StatusOr<std::vector<DecodeOutput>> Decode(std::vector<v1::DecodeQuery> queries,
                                                   v1::DType output_dtype = v1::DTYPE_BF16);

  // Moves this client's placement groups that sit on a server past the load bound (a server
  // joined, groups grew or others left) to servers within it, one group at a time: the new
  // server claimed in etcd as a new group would be, then the group's sequences moved there by
  // their server (MigrateSequences; calls naming them are held for the last rows, none
  // fails). A group whose move fails stays where it was (its claim too); the first such
  // error is returned after the others were tried. FAILED_PRECONDITION without placement
  // groups. Context-parallel sequences stay.
  absl::StatusOr<RebalanceReport> Rebalance();

  // The servers (addresses) a sequence's parts are on, first part first; NOT_FOUND for a
  // sequence this client does not hold.
  absl::StatusOr<std::vector<std::string>> ServersOf(absl::string_view sequence_id) const;
  // The servers a prefix is registered on.
  std::vector<std::string> PrefixServers(absl::string_view prefix_id) const;
  // The placement group a sequence is in (its name in etcd, under this client's id), and the
  // server that group is on; NOT_FOUND for a sequence in none.
  absl::StatusOr<std::pair<std::string, std::string>> GroupOf(absl::string_view sequence_id) const;
  // The table of every client's group claims; null without placement groups.
  cluster::GroupTable* group_table() const { return groups_table_.get(); }
  const cluster::MembershipView& membership() const { return *view_; }

 private:
  struct Part {
    std::string instance_id;
    std::string address;
    std::string sequence_id;  // its id on that server
    int64_t start = 0;        // first position of the whole sequence it holds
  };
  struct SequenceState {
    std::string prefix_id;
    v1::KvDtype kv_dtype = v1::KV_DTYPE_UNSPECIFIED;
    int64_t prefix_tokens = 0;
    std::vector<Part> parts;
    std::vector<int64_t> layer_lengths;  // whole-sequence lengths, tracked with parts > 1
    std::string group;                   // its placement group; empty for none
  };
  // A placement group of this client: its server and its live sequences.
  struct GroupState {
    std::string instance_id;
    bool has_prefix = false;
    int sequences = 0;
    int64_t claimed_weight = 0;  // as etcd holds it
  };
  struct PrefixState {
    std::string parent_id;
    v1::Tensor latent;
    v1::KvDtype kv_dtype = v1::KV_DTYPE_UNSPECIFIED;
    int64_t tokens = 0;
    // instance id -> live sequences this client placed on the prefix there
    absl::flat_hash_map<std::string, int> groups;
  };
  struct Reservation {
    int64_t bytes = 0;
    int sequences = 0;                   // placements (a prefix's too: it adds its own load)
    int64_t record_updated_unix_ms = 0;  // the record's load these bytes come on top of
  };
  // A server's client and what a call on it says when it fails.
  struct Route {
    std::shared_ptr<MlaServeClient> client;
    std::string instance_id;
    std::string address;
  };

  ClusterClient(std::unique_ptr<cluster::MembershipView> view, ClusterOptions options,
                v1::GetServerInfoResponse info, std::unique_ptr<cluster::GroupTable> groups);

  absl::StatusOr<Route> RouteTo(const std::string& instance_id, const std::string& address,
                                absl::string_view sequence_id);
  // The channel to `address`, one per server for the client's life.
  std::shared_ptr<MlaServeClient> ClientFor(const std::string& address);
  // A failed call's status, naming the server (and that it left, if it has).
  absl::Status Annotate(const absl::Status& status, const Route& route) const;
  int64_t SequenceBytes() const;
  int64_t PrefixBytes(int64_t tokens) const;
  absl::StatusOr<cluster::Placement> Place(const std::string& prefix_id, int64_t sequence_bytes,
                                           std::vector<std::string> exclude)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(placement_mu_);
  // The servers placement may choose for a sequence on `prefix_id` (with room and the
  // client's reservations), and the request for it.
  absl::StatusOr<std::vector<cluster::PlacementCandidate>> Candidates(
      const std::string& prefix_id, int64_t sequence_bytes, std::vector<std::string> exclude,
      cluster::PlacementRequest& request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(placement_mu_);
  // Where the next sequence of (`prefix_id`, `hint`) goes: its open group's server while the
  // group is below the spread size, has room and was not `refused`; else a new group claimed
  // in etcd. Sets `group` to the group's name.
  absl::StatusOr<cluster::Placement> PlaceInGroup(const std::string& prefix_id,
                                                  const std::string& hint,
                                                  const std::vector<std::string>& refused,
                                                  std::string& group)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(placement_mu_);
  // The weight a group of `sequences` claims: queries per step, at least B_theta for a prefix
  // group (it is placed to become hybrid).
  int64_t GroupWeight(bool has_prefix, int sequences) const;
  // A group gained (+1) or lost (-1) a sequence: its claim follows.
  void CountInGroup(const std::string& group, int delta) ABSL_LOCKS_EXCLUDED(claims_mu_, mu_);
  void Reserve(const std::string& instance_id, int64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status EnsurePrefixOn(const std::string& prefix_id, const std::string& instance_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(placement_mu_);
  // The part holding `position` of the sequence, opened on a new server when it is past the
  // last; its index.
  absl::StatusOr<size_t> PartFor(const std::string& sequence_id, int64_t position);
  absl::StatusOr<SequenceState> SequenceCopy(absl::string_view sequence_id) const;
  // For a call refused because a sequence moved (FAILED_PRECONDITION "sequence 'ID' moved to
  // server ADDRESS", MigrateSequences): points the part that is ID at that server. For one
  // refused while it moves (UNAVAILABLE "... is moving to server ..."): waits a moment. True
  // if the call is worth repeating.
  bool FollowMove(const absl::Status& status);
  // After a call to `address` failed UNAVAILABLE: if it is a drained server (moved out) that
  // has stopped, finds its sequences on the other members and points them there. True if
  // any moved.
  bool Relocate(const std::string& address);
  // Points the part whose server-side id is `part_id` at `member` (it moved there); true if
  // one was found.
  bool Repoint(const std::string& part_id, const cluster::MemberRecord& member)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves one group (Rebalance's step): its new server, or its own when it stays.
  absl::StatusOr<std::string> RebalanceGroup(const std::string& group, const GroupState& state,
                                             RebalanceReport& report)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(placement_mu_);
  void RebalanceLoop();
  absl::StatusOr<v1::DecodeResponse> DecodeOnce(const v1::DecodeRequest& request);
  absl::Status AppendOnce(std::span<const KvAppend> appends);
  absl::Status ReleaseOnce(absl::string_view sequence_id);
  absl::StatusOr<v1::Sequence> ForkOnce(absl::string_view source_id, absl::string_view new_id);

  std::unique_ptr<cluster::MembershipView> view_;
  std::unique_ptr<cluster::GroupTable> groups_table_;
  const ClusterOptions options_;
  const v1::GetServerInfoResponse info_;  // the first member's, at connect
  int spread_group_ = 0;
  // This client's order among equally roomy servers (random: clients started together spread).
  const uint64_t tie_break_;

  // Placement (and opening parts) one at a time, so two new sequences see each other's room.
  absl::Mutex placement_mu_ ABSL_ACQUIRED_BEFORE(claims_mu_, mu_);
  // A group's count and the write of its claim, one group change at a time.
  absl::Mutex claims_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<MlaServeClient>> clients_
      ABSL_GUARDED_BY(mu_);  // by address
  absl::flat_hash_map<std::string, SequenceState> sequences_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, PrefixState> prefixes_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Reservation> reservations_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> relocated_ ABSL_GUARDED_BY(mu_);  // stopped drained servers
  absl::flat_hash_map<std::string, GroupState> groups_ ABSL_GUARDED_BY(mu_);  // by name
  // (prefix, hint) -> the number of its group that takes new sequences (0, 1, ...).
  absl::flat_hash_map<std::string, int> open_group_ ABSL_GUARDED_BY(mu_);

  // The rebalancing thread (options_.rebalance_interval > 0), stopped by the destructor.
  absl::Mutex rebalance_mu_;
  bool stopping_ ABSL_GUARDED_BY(rebalance_mu_) = false;
  std::thread rebalancer_;
};

}  // namespace mlaserve::client

#endif  // MLASERVE_CLIENT_CLUSTER_CLUSTER_CLIENT_H_
