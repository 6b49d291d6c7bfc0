#include "client/loadgen/destination.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/cluster/cluster_client.h"
#include "client/loadgen/default_ranks.h"
#include "client/loadgen/grpc_load_target.h"
#include "client/loadgen/multi_target.h"
#include "client/loadgen/rank_target.h"
#include "cluster/etcd_client.h"
#include "google/protobuf/util/json_util.h"

namespace mlaserve::loadgen {
namespace {

// One LoadTarget for every server of --target: the server itself, or, for a list, a
// MultiTarget over them (docs/loadgen.md, "Several servers").
absl::StatusOr<std::unique_ptr<LoadTarget>> LoadTargetFor(
    std::vector<std::unique_ptr<client::MlaServeClient>> clients,
    const std::vector<std::string>& names, MultiTarget::Spread spread, bool packed) {
  std::vector<std::unique_ptr<LoadTarget>> targets;
  for (auto& client : clients) {
    auto target = GrpcLoadTarget::Create(std::move(client), packed);
    if (!target.ok()) return target.status();
    targets.push_back(*std::move(target));
  }
  if (targets.size() == 1) return std::move(targets[0]);
  auto multi = MultiTarget::Create(std::move(targets), names, spread);
  if (!multi.ok()) return multi.status();
  return std::unique_ptr<LoadTarget>(*std::move(multi));
}

}  // namespace

nlohmann::json ServerJson(client::ServingClient& client) {
  absl::StatusOr<v1::GetServerInfoResponse> info = client.GetServerInfo();
  if (!info.ok()) return {{"error", std::string(info.status().message())}};
  std::string text;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  if (!google::protobuf::util::MessageToJsonString(*info, &text, options).ok()) return nullptr;
  // The facts a plot or a table names, flat, then GetServerInfo's whole answer.
  return {{"model", info->model().name()},
          {"layers", info->model().layers()},
          {"heads", info->model().heads()},
          {"devices", info->devices_size()},
          {"device", info->devices_size() > 0 ? info->devices(0).profile() : ""},
          {"version", info->server_version()},
          {"cpu", info->host().cpu_model()},
          {"matrix_unit", info->host().matrix_unit()},
          {"info", nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false)}};
}

// The cluster of --etcd-endpoints through the cluster client (docs/cluster.md).
absl::StatusOr<Destination> ClusterDestination(const client::ClientOptions& options,
                                               const ClusterFlags& flags, int workers,
                                               bool packed) {
  client::ClusterOptions cluster;
  cluster.etcd_endpoints = absl::StrSplit(flags.etcd_endpoints, ',');
  cluster.cluster = flags.cluster;
  cluster.server_options = options;
  cluster.spread_group = flags.spread_group;
  cluster.context_part_tokens = flags.context_part_tokens;
  cluster.placement_groups = flags.placement_groups;
  cluster.rebalance_interval = absl::Seconds(flags.rebalance_interval_s);
  if (flags.placement_groups) {
    // A rank's sequences are decoded together: its group (docs/cluster.md).
    cluster.placement_group_of = [](absl::string_view sequence_id) {
      const std::optional<int> rank = RankTarget::RankIn(std::string(sequence_id));
      return rank.has_value() ? absl::StrCat("rank", *rank) : std::string();
    };
  }
  if (!flags.etcd_ca.empty() || !flags.etcd_cert.empty()) {
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
        cluster::EtcdChannelCredentials(flags.etcd_ca, flags.etcd_cert, flags.etcd_key);
    if (!credentials.ok()) return credentials.status();
    cluster.etcd_credentials = *std::move(credentials);
  }
  absl::StatusOr<std::unique_ptr<client::ClusterClient>> client =
      client::ClusterClient::Connect(cluster);
  if (!client.ok()) return client.status();
  Destination destination;
  destination.servers = ServerJson(**client);
  std::vector<std::string> addresses;
  for (const cluster::MemberRecord& member : (*client)->membership().Members()) {
    addresses.push_back(member.address);
  }
  // The members are taken to be alike: the one the client asked, times their number.
  absl::StatusOr<v1::GetServerInfoResponse> info = (*client)->GetServerInfo();
  if (!info.ok()) return info.status();
  destination.default_ranks =
      DefaultRanks(*info) * std::max<int>(1, static_cast<int>(addresses.size()));
  if (workers == 0) workers = destination.default_ranks;
  destination.servers["cluster"] = flags.cluster;
  destination.servers["etcd"] = flags.etcd_endpoints;
  destination.servers["targets"] = addresses;
  destination.servers["servers"] = static_cast<int>(addresses.size());
  destination.name = absl::StrCat("cluster '", flags.cluster, "' (", addresses.size(),
                                  " servers: ", absl::StrJoin(addresses, ","), ")");
  absl::StatusOr<std::unique_ptr<GrpcLoadTarget>> target =
      GrpcLoadTarget::Create(*std::move(client), packed);
  if (!target.ok()) return target.status();
  if (!flags.client_per_rank || workers <= 1) {
    destination.target = *std::move(target);
    return destination;
  }
  std::vector<std::unique_ptr<LoadTarget>> ranks;
  ranks.push_back(*std::move(target));
  for (int rank = 1; rank < workers; ++rank) {
    absl::StatusOr<std::unique_ptr<client::ClusterClient>> own =
        client::ClusterClient::Connect(cluster);
    if (!own.ok()) return own.status();
    absl::StatusOr<std::unique_ptr<GrpcLoadTarget>> rank_target =
        GrpcLoadTarget::Create(*std::move(own), packed);
    if (!rank_target.ok()) return rank_target.status();
    ranks.push_back(*std::move(rank_target));
  }
  destination.name += absl::StrCat(", one client per rank");
  destination.target = std::make_unique<RankTarget>(std::move(ranks));
  return destination;
}

// The servers of --target.
absl::StatusOr<Destination> TargetDestination(
    std::vector<std::unique_ptr<client::MlaServeClient>> clients,
    const std::vector<std::string>& names, const std::string& target, const std::string& spread,
    bool packed) {
  if (spread != "prefix" && spread != "sequence") {
    return absl::InvalidArgumentError(
        absl::StrCat("--spread: '", spread, "' is neither prefix nor sequence"));
  }
  Destination destination;
  destination.servers = ServerJson(*clients.front());
  for (const auto& client : clients) {
    absl::StatusOr<v1::GetServerInfoResponse> info = client->GetServerInfo();
    if (!info.ok()) return info.status();
    destination.default_ranks += DefaultRanks(*info);
  }
  if (clients.size() > 1) {
    destination.servers["targets"] = names;
    destination.servers["servers"] = static_cast<int>(clients.size());
  }
  destination.name = target;
  absl::StatusOr<std::unique_ptr<LoadTarget>> load_target = LoadTargetFor(
      std::move(clients), names,
      spread == "sequence" ? MultiTarget::Spread::kSequenceHash : MultiTarget::Spread::kPrefixHash,
      packed);
  if (!load_target.ok()) return load_target.status();
  destination.target = *std::move(load_target);
  return destination;
}

}  // namespace mlaserve::loadgen
