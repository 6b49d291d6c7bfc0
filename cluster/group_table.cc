#include "cluster/group_table.h"

#include <utility>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace mlaserve::cluster {
namespace {

constexpr int kClaimRounds = 32;

std::string GuardKey(const std::string& cluster) {
  return absl::StrCat("/mlaserve/", cluster, "/placement-guard");
}

// The client id and group a claim's key names, from its key (prefix/<client>/<group>).
bool SplitKey(const std::string& prefix, const std::string& key, std::string& client,
              std::string& group) {
  if (!absl::StartsWith(key, prefix)) return false;
  const std::string tail = key.substr(prefix.size());
  const size_t slash = tail.find('/');
  if (slash == std::string::npos) return false;
  client = tail.substr(0, slash);
  group = tail.substr(slash + 1);
  return true;
}

// The claims under `prefix` summed per instance, leaving out `skip_group` of `skip_client`.
GroupLoads SumClaims(const std::string& prefix,
                     const std::vector<std::pair<std::string, std::string>>& pairs,
                     const std::string& skip_client, const std::string& skip_group);

}  // namespace

std::string GroupClaim::ToJson() const {
  return nlohmann::json{{"instance_id", instance_id}, {"weight", weight}, {"bytes", bytes}}.dump();
}

absl::StatusOr<GroupClaim> ParseGroupClaim(const std::string& text) {
  const nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!json.is_object()) return absl::InvalidArgumentError("group claim: not a JSON object");
  GroupClaim claim;
  if (!json.contains("instance_id") || !json["instance_id"].is_string() ||
      json["instance_id"].get<std::string>().empty()) {
    return absl::InvalidArgumentError("group claim: instance_id is missing or not a string");
  }
  claim.instance_id = json["instance_id"].get<std::string>();
  for (const char* field : {"weight", "bytes"}) {
    if (!json.contains(field) || !json[field].is_number_integer() ||
        json[field].get<int64_t>() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("group claim: ", field, " is missing or not a count >= 0"));
    }
  }
  claim.weight = json["weight"].get<int64_t>();
  claim.bytes = json["bytes"].get<int64_t>();
  return claim;
}

namespace {

GroupLoads SumClaims(const std::string& prefix,
                     const std::vector<std::pair<std::string, std::string>>& pairs,
                     const std::string& skip_client, const std::string& skip_group) {
  GroupLoads loads;
  for (const auto& [key, value] : pairs) {
    std::string client;
    std::string group;
    if (!SplitKey(prefix, key, client, group)) continue;
    if (client == skip_client && group == skip_group) continue;
    absl::StatusOr<GroupClaim> claim = ParseGroupClaim(value);
    if (!claim.ok()) continue;  // another version's or a stranger's key: not a load
    GroupClaim& load = loads[claim->instance_id];
    load.instance_id = claim->instance_id;
    load.weight += claim->weight;
    load.bytes += claim->bytes;
  }
  return loads;
}

}  // namespace

std::string GroupsPrefix(const std::string& cluster) {
  return absl::StrCat("/mlaserve/", cluster, "/groups/");
}

std::string GroupKey(const std::string& cluster, const std::string& client_id,
                     const std::string& group) {
  return absl::StrCat(GroupsPrefix(cluster), client_id, "/", group);
}

absl::StatusOr<std::unique_ptr<GroupTable>> GroupTable::Start(std::unique_ptr<EtcdClient> etcd,
                                                              std::string cluster,
                                                              absl::Duration lease_ttl) {
  lease_ttl = std::max(lease_ttl, absl::Seconds(2));
  absl::StatusOr<int64_t> lease = etcd->GrantLease(lease_ttl);
  if (!lease.ok()) {
    return absl::UnavailableError(absl::StrCat("cluster '", cluster,
                                               "': no lease for placement groups from etcd ",
                                               etcd->target(), ": ", lease.status().message()));
  }
  // Random, so that two clients of one process or host never share keys.
  const std::string client_id =
      absl::StrFormat("c%016x", absl::Uniform<uint64_t>(absl::BitGen(), 1, ~uint64_t{0}));
  return std::unique_ptr<GroupTable>(
      new GroupTable(std::move(etcd), std::move(cluster), lease_ttl, *lease, client_id));
}

GroupTable::GroupTable(std::unique_ptr<EtcdClient> etcd, std::string cluster,
                       absl::Duration lease_ttl, int64_t lease, std::string client_id)
    : cluster_(std::move(cluster)),
      lease_ttl_(lease_ttl),
      client_id_(std::move(client_id)),
      etcd_(std::move(etcd)),
      lease_(lease) {
  keep_alive_ = std::thread([this] { KeepAliveLoop(); });
}

GroupTable::~GroupTable() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  stop_.notify_all();
  keep_alive_.join();
  std::lock_guard<std::mutex> lock(mu_);
  if (lease_ != 0) etcd_->Revoke(lease_).IgnoreError();
}

void GroupTable::KeepAliveLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_.wait_for(lock, absl::ToChronoMilliseconds(lease_ttl_ / 3),
                         [this] { return stopping_; })) {
    absl::Status alive = etcd_->KeepAlive(lease_);
    if (absl::IsNotFound(alive)) alive = Renew();
    if (!alive.ok()) {
      spdlog::warn("cluster '{}': placement groups' lease: {}", cluster_,
                   std::string(alive.message()));
    }
  }
}

absl::Status GroupTable::Renew() {
  absl::StatusOr<int64_t> lease = etcd_->GrantLease(lease_ttl_);
  if (!lease.ok()) return lease.status();
  lease_ = *lease;
  spdlog::warn("cluster '{}': the placement groups' lease had expired; {} claims written again",
               cluster_, own_.size());
  for (const auto& [group, claim] : own_) {
    if (absl::Status put =
            etcd_->Put(GroupKey(cluster_, client_id_, group), claim.ToJson(), lease_);
        !put.ok()) {
      return put;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> GroupTable::Claim(const std::string& group, int64_t weight,
                                              int64_t bytes, const Chooser& choose) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string prefix = GroupsPrefix(cluster_);
  for (int round = 0; round < kClaimRounds; ++round) {
    absl::StatusOr<EtcdClient::PrefixRead> read = etcd_->ReadPrefix(prefix);
    if (!read.ok()) return read.status();
    // The group's own earlier claim is the one being replaced: not a load.
    absl::StatusOr<std::string> chosen = choose(SumClaims(prefix, read->pairs, client_id_, group));
    if (!chosen.ok()) return chosen.status();
    const GroupClaim claim{*chosen, weight, bytes};
    absl::StatusOr<bool> written = etcd_->PutIfUnchangedSince(
        GuardKey(cluster_), read->revision,
        {{GroupKey(cluster_, client_id_, group), claim.ToJson()}}, lease_);
    if (!written.ok()) return written.status();
    if (*written) {
      own_[group] = claim;
      return claim.instance_id;
    }
    ++contended_;
    // Clients that lost to the same winner would read and collide again in step.
    absl::SleepFor(absl::Microseconds(absl::Uniform(absl::BitGen(), 0, 500 * (round + 1))));
  }
  return absl::AbortedError(absl::StrCat("cluster '", cluster_, "': placing group '", group,
                                         "' lost ", kClaimRounds,
                                         " rounds to other clients placing at once"));
}

absl::Status GroupTable::Update(const std::string& group, int64_t weight, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = own_.find(group);
  if (it == own_.end()) {
    return absl::NotFoundError(absl::StrCat("placement group '", group, "' is not claimed"));
  }
  GroupClaim updated = it->second;
  updated.weight = weight;
  updated.bytes = bytes;
  if (absl::Status put =
          etcd_->Put(GroupKey(cluster_, client_id_, group), updated.ToJson(), lease_);
      !put.ok()) {
    return put;
  }
  it->second = updated;
  return absl::OkStatus();
}

absl::Status GroupTable::Drop(const std::string& group) {
  std::lock_guard<std::mutex> lock(mu_);
  if (own_.erase(group) == 0) return absl::OkStatus();
  return etcd_->Delete(GroupKey(cluster_, client_id_, group));
}

absl::StatusOr<GroupLoads> GroupTable::Loads() {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string prefix = GroupsPrefix(cluster_);
  absl::StatusOr<EtcdClient::PrefixRead> read = etcd_->ReadPrefix(prefix);
  if (!read.ok()) return read.status();
  return SumClaims(prefix, read->pairs, "", "");
}

int64_t GroupTable::contended() const {
  std::lock_guard<std::mutex> lock(mu_);
  return contended_;
}

}  // namespace mlaserve::cluster
