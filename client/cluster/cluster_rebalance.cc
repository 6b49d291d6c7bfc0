// ClusterClient's rebalancing (docs/cluster.md, "Rebalancing"): a placement group on a server
// past the load bound moves, claim first, then its sequences by their server.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cluster/cluster_client.h"
#include "cluster/placement.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace mlaserve::client {

absl::StatusOr<RebalanceReport> ClusterClient::Rebalance() {
  if (groups_table_ == nullptr) {
    return absl::FailedPreconditionError(
        "rebalancing moves placement groups: this client places without them "
        "(placement_groups=false)");
  }
  const absl::Time start = absl::Now();
  absl::MutexLock placing(&placement_mu_);
  std::vector<std::pair<std::string, GroupState>> groups;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, state] : groups_) {
      if (state.sequences > 0) groups.emplace_back(name, state);
    }
  }
  // The heaviest first: it frees the most of an overloaded server in one move.
  std::sort(groups.begin(), groups.end(), [](const auto& a, const auto& b) {
    return a.second.claimed_weight != b.second.claimed_weight
               ? a.second.claimed_weight > b.second.claimed_weight
               : a.first < b.first;
  });
  RebalanceReport report;
  absl::Status first_error = absl::OkStatus();
  for (const auto& [name, state] : groups) {
    absl::StatusOr<std::string> where = RebalanceGroup(name, state, report);
    if (!where.ok() && first_error.ok()) first_error = where.status();
  }
  report.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (!first_error.ok()) return first_error;
  return report;
}

absl::StatusOr<std::string> ClusterClient::RebalanceGroup(const std::string& group,
                                                          const GroupState& state,
                                                          RebalanceReport& report) {
  // Its sequences that sit whole on its server (context-parallel ones stay).
  std::vector<std::string> parts;
  std::string prefix_id;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, sequence] : sequences_) {
      if (sequence.group != group || sequence.parts.size() != 1 ||
          sequence.parts[0].instance_id != state.instance_id) {
        continue;
      }
      parts.push_back(sequence.parts[0].sequence_id);
      prefix_id = sequence.prefix_id;
    }
  }
  // A group on a server that left has nobody to move it (a drain moves its own).
  if (parts.empty() || !view_->Contains(state.instance_id)) return state.instance_id;
  cluster::PlacementRequest request;
  ASSIGN_OR_RETURN(std::vector<cluster::PlacementCandidate> candidates,
                   Candidates(prefix_id, SequenceBytes(), {}, request));
  cluster::GroupRequest wanted;
  wanted.group = absl::StrCat(groups_table_->client_id(), "/", group);
  wanted.weight = state.claimed_weight;
  wanted.bytes = state.claimed_weight * SequenceBytes();
  wanted.load_slack = options_.load_slack;
  // Stays while its server is within the bound with the group on it; else where a new group
  // of its weight would go, if that is another server within the bound.
  auto choose = [&](const cluster::GroupLoads& loads) -> absl::StatusOr<std::string> {
    int64_t total = wanted.weight;
    const cluster::PlacementCandidate* here = nullptr;
    for (cluster::PlacementCandidate& c : candidates) {
      auto load = loads.find(c.member.instance_id);
      c.group_load = load == loads.end() ? 0 : load->second.weight;
      c.group_bytes = load == loads.end() ? 0 : load->second.bytes;
      total += c.group_load;
      if (c.member.instance_id == state.instance_id) here = &c;
    }
    const int64_t cap =
        cluster::LoadBound(total, static_cast<int64_t>(candidates.size()), wanted.load_slack);
    if (here != nullptr && here->group_load + wanted.weight <= cap) return state.instance_id;
    ASSIGN_OR_RETURN(cluster::Placement placed, cluster::PlaceGroup(candidates, request, wanted));
    for (const cluster::PlacementCandidate& c : candidates) {
      if (c.member.instance_id != placed.instance_id) continue;
      const bool better = here == nullptr || c.group_load < here->group_load;
      if (c.group_load + wanted.weight <= cap && better) return placed.instance_id;
    }
    return state.instance_id;
  };
  // Decided on a fresh read first, so that a group that stays writes nothing.
  ASSIGN_OR_RETURN(cluster::GroupLoads loads, groups_table_->Loads());
  {
    auto own = loads.find(state.instance_id);
    if (own != loads.end()) {
      own->second.weight -= std::min(own->second.weight, wanted.weight);
      own->second.bytes -= std::min(own->second.bytes, wanted.bytes);
    }
  }
  ASSIGN_OR_RETURN(const std::string decided, choose(loads));
  if (decided == state.instance_id) return decided;
  // Claimed with the compare-and-swap: another client's move meanwhile is seen.
  ASSIGN_OR_RETURN(const std::string target,
                   groups_table_->Claim(group, wanted.weight, wanted.bytes, choose));
  if (target == state.instance_id) return target;
  const std::optional<cluster::MemberRecord> to = view_->Find(target);
  const std::optional<cluster::MemberRecord> from = view_->Find(state.instance_id);
  auto claim_back = [&] {
    auto here = [&](const cluster::GroupLoads&) -> absl::StatusOr<std::string> {
      return state.instance_id;
    };
    groups_table_->Claim(group, wanted.weight, wanted.bytes, here).IgnoreError();
  };
  if (!to.has_value() || !from.has_value()) {
    claim_back();
    return absl::UnavailableError(absl::StrCat("group '", group,
                                               "': a server left the cluster "
                                               "while it was rebalanced"));
  }
  v1::MigrateSequencesRequest move;
  move.set_target(to->address);
  for (const std::string& part : parts) move.add_sequence_ids(part);
  absl::StatusOr<v1::MigrateSequencesResponse> moved =
      ClientFor(from->address)->MigrateSequences(move, absl::Seconds(120));
  if (!moved.ok()) {
    claim_back();
    return absl::Status(moved.status().code(),
                        absl::StrCat("group '", group, "' not moved from ", from->address, " to ",
                                     to->address, ": ", moved.status().message()));
  }
  {
    absl::MutexLock lock(&mu_);
    for (const std::string& part : parts) Repoint(part, *to);
    auto it = groups_.find(group);
    if (it != groups_.end()) it->second.instance_id = target;
  }
  ++report.groups_moved;
  report.sequences_moved += moved->sequences();
  report.bytes_moved += moved->bytes();
  spdlog::info("cluster '{}': group '{}' ({} sequences) moved from {} to {} in {:.2f} s",
               view_->cluster(), group, moved->sequences(), from->address, to->address,
               moved->seconds());
  return target;
}

void ClusterClient::RebalanceLoop() {
  while (true) {
    {
      absl::MutexLock lock(&rebalance_mu_);
      auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(rebalance_mu_) { return stopping_; };
      if (rebalance_mu_.AwaitWithTimeout(absl::Condition(&stop), options_.rebalance_interval)) {
        return;
      }
    }
    absl::StatusOr<RebalanceReport> report = Rebalance();
    if (!report.ok()) {
      spdlog::warn("cluster '{}': rebalancing: {}", view_->cluster(),
                   std::string(report.status().message()));
    }
  }
}

}  // namespace mlaserve::client
