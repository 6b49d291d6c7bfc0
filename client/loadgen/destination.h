#ifndef MLASERVE_CLIENT_LOADGEN_DESTINATION_H_
#define MLASERVE_CLIENT_LOADGEN_DESTINATION_H_

// Where mlaserve-loadgen sends its load: one server, a list of them (MultiTarget), or a
// cluster on etcd through the cluster client (docs/loadgen.md, "Several servers"; docs/
// cluster.md), with what the reports say of it.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/loadgen/load_target.h"
#include "client/mlaserve_client.h"
#include "nlohmann/json.hpp"

namespace mlaserve::loadgen {

struct Destination {
  std::unique_ptr<LoadTarget> target;
  nlohmann::json servers;  // GetServerInfo's facts, and the servers' addresses
  std::string name;        // for the report's heading
  int default_ranks = 0;   // --workers=auto's ranks for these servers (default_ranks.h)
};

// The load generator's flags for a cluster (--etcd-endpoints and the rest).
struct ClusterFlags {
  std::string etcd_endpoints;  // comma-separated
  std::string cluster;
  std::string etcd_ca, etcd_cert, etcd_key;
  int spread_group = -1;
  int64_t context_part_tokens = 0;
  bool client_per_rank = false;
  bool placement_groups = true;
  double rebalance_interval_s = 0;
};

// GetServerInfo's facts a plot or a table names, flat, then its whole answer.
nlohmann::json ServerJson(client::ServingClient& client);

// The cluster through the cluster client; with client_per_rank and several workers, one
// client per rank (0 workers: the servers' default ranks). `packed`: each step as one packed
// call (GrpcLoadTarget::Create).
absl::StatusOr<Destination> ClusterDestination(const client::ClientOptions& options,
                                               const ClusterFlags& flags, int workers, bool packed);

// The servers of --target (`names`, connected as `clients`), spread by "prefix" or
// "sequence" (INVALID_ARGUMENT naming --spread otherwise).
absl::StatusOr<Destination> TargetDestination(
    std::vector<std::unique_ptr<client::MlaServeClient>> clients,
    const std::vector<std::string>& names, const std::string& target, const std::string& spread,
    bool packed);

}  // namespace mlaserve::loadgen

#endif  // MLASERVE_CLIENT_LOADGEN_DESTINATION_H_
