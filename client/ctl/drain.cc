#include "client/ctl/drain.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace mlaserve::ctl {

absl::StatusOr<std::map<std::string, std::vector<std::string>>> PlanDrain(
    const std::vector<DrainedSequence>& sequences,
    const std::vector<cluster::MemberRecord>& targets) {
  if (targets.empty() && !sequences.empty()) {
    return absl::FailedPreconditionError("no other server in the cluster to move the sequences to");
  }
  // Groups by prefix; sequences without one are groups of their own.
  struct Group {
    std::vector<std::string> ids;
    int64_t bytes = 0;
  };
  absl::flat_hash_map<std::string, Group> by_prefix;
  std::vector<Group> groups;
  for (const DrainedSequence& s : sequences) {
    if (s.prefix_id.empty()) {
      groups.push_back({{s.id}, s.bytes});
      continue;
    }
    Group& group = by_prefix[s.prefix_id];
    group.ids.push_back(s.id);
    group.bytes += s.bytes;
  }
  for (auto& [prefix, group] : by_prefix) groups.push_back(std::move(group));
  std::sort(groups.begin(), groups.end(), [](const Group& a, const Group& b) {
    return a.bytes != b.bytes ? a.bytes > b.bytes : a.ids.front() < b.ids.front();
  });
  std::vector<int64_t> free(targets.size());
  for (size_t t = 0; t < targets.size(); ++t) {
    free[t] = targets[t].kv_budget_bytes - targets[t].kv_used_bytes;
  }
  std::map<std::string, std::vector<std::string>> plan;
  for (const Group& group : groups) {
    const size_t best =
        static_cast<size_t>(std::max_element(free.begin(), free.end()) - free.begin());
    if (free[best] < group.bytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("no server has room for ", group.ids.size(), " sequences of ", group.bytes,
                       " bytes (starting with '", group.ids.front(), "'); the most free is ",
                       free[best], " bytes on ", targets[best].address));
    }
    free[best] -= group.bytes;
    std::vector<std::string>& ids = plan[targets[best].address];
    ids.insert(ids.end(), group.ids.begin(), group.ids.end());
  }
  return plan;
}

namespace {

absl::StatusOr<std::vector<DrainedSequence>> ListAll(client::MlaServeClient& source,
                                                     int64_t row_bytes) {
  ASSIGN_OR_RETURN(std::vector<v1::SequenceSummary> listed, source.ListAllSequences());
  std::vector<DrainedSequence> sequences;
  for (const v1::SequenceSummary& summary : listed) {
    DrainedSequence s{summary.sequence().sequence_id(), summary.sequence().prefix_id(), 0};
    for (int32_t length : summary.sequence().layer_lengths()) s.bytes += length * row_bytes;
    sequences.push_back(std::move(s));
  }
  return sequences;
}

}  // namespace

absl::StatusOr<std::vector<DrainStep>> DrainServer(
    client::MlaServeClient& source, const std::vector<cluster::MemberRecord>& targets,
    absl::Duration move_timeout) {
  if (targets.empty()) {
    return absl::FailedPreconditionError("no other server in the cluster to move sequences to");
  }
  ASSIGN_OR_RETURN(v1::GetServerInfoResponse info, source.GetServerInfo());
  const int64_t row_bytes = int64_t{2} * info.model().kv_row_width();
  std::vector<DrainStep> steps;
  auto move = [&](const std::string& target, std::vector<std::string> ids, bool leave,
                  bool stop) -> absl::Status {
    // A sequence its client released since the listing is NOT_FOUND: list again and move
    // the others (a few times at most; clients release all the time).
    for (int attempt = 0;; ++attempt) {
      v1::MigrateSequencesRequest request;
      request.set_target(target);
      for (const std::string& id : ids) request.add_sequence_ids(id);
      request.set_leave_cluster(leave);
      request.set_stop_after(stop);
      absl::StatusOr<v1::MigrateSequencesResponse> moved =
          source.MigrateSequences(request, move_timeout);
      if (moved.ok()) {
        if (moved->sequences() > 0) steps.push_back({target, *std::move(moved)});
        return absl::OkStatus();
      }
      if (!absl::IsNotFound(moved.status()) || ids.empty() || attempt >= 4) {
        return moved.status();
      }
      ASSIGN_OR_RETURN(std::vector<DrainedSequence> now, ListAll(source, row_bytes));
      absl::flat_hash_set<std::string> present;
      for (const DrainedSequence& s : now) present.insert(s.id);
      std::erase_if(ids, [&](const std::string& id) { return !present.contains(id); });
      if (ids.empty()) return absl::OkStatus();
    }
  };
  // Leaves the cluster with the first move, so clients place nothing new here; the groups
  // listed now go where PlanDrain puts them.
  ASSIGN_OR_RETURN(std::vector<DrainedSequence> sequences, ListAll(source, row_bytes));
  ASSIGN_OR_RETURN(auto plan, PlanDrain(sequences, targets));
  bool left = false;
  for (const auto& [target, ids] : plan) {
    RETURN_IF_ERROR(move(target, ids, !left, false));
    left = true;
  }
  // What clients created before they saw it leave, if anything, goes with the last call (an
  // empty list: every sequence left), which also stops the server.
  RETURN_IF_ERROR(move(targets.front().address, {}, !left, true));
  return steps;
}

}  // namespace mlaserve::ctl
