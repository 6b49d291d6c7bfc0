// ClusterClient's placement: where prefixes and new sequences go (docs/cluster.md,
// "Placement" and "Placement groups"), and the bookkeeping that follows a sequence's life
// (forks, releases, context-parallel parts) so that later placements see it.
#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/cluster/cluster_client.h"
#include "cluster/placement.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace mlaserve::client {
namespace {

std::string PartId(absl::string_view sequence_id, size_t part) {
  return part == 0 ? std::string(sequence_id) : absl::StrCat(sequence_id, "@p", part);
}

}  // namespace

int64_t ClusterClient::SequenceBytes() const {
  const v1::ModelInfo& m = info_.model();
  return options_.expected_sequence_tokens * m.layers() * m.kv_row_width() * 2;
}

int64_t ClusterClient::PrefixBytes(int64_t tokens) const {
  const v1::ModelInfo& m = info_.model();
  // The latent rows and the naive form's expanded K (dn + dr) and V (dv) per head, bf16.
  return tokens * m.layers() *
         (int64_t{m.kv_row_width()} * 2 + int64_t{m.heads()} * (m.dn() + m.dr() + m.dv()) * 2);
}

void ClusterClient::Reserve(const std::string& instance_id, int64_t bytes) {
  const std::optional<cluster::MemberRecord> record = view_->Find(instance_id);
  if (!record.has_value()) return;
  absl::MutexLock lock(&mu_);
  Reservation& reservation = reservations_[instance_id];
  if (reservation.record_updated_unix_ms != record->updated_unix_ms) {
    reservation = {0, 0, record->updated_unix_ms};
  }
  reservation.bytes += bytes;
  ++reservation.sequences;
}

absl::StatusOr<std::vector<cluster::PlacementCandidate>> ClusterClient::Candidates(
    const std::string& prefix_id, int64_t sequence_bytes, std::vector<std::string> exclude,
    cluster::PlacementRequest& request) {
  if (view_->stale()) {
    spdlog::warn("cluster '{}': etcd is unreachable; placing on the last membership seen",
                 view_->cluster());
  }
  std::vector<cluster::PlacementCandidate> candidates;
  request.sequence_bytes = sequence_bytes;
  request.has_prefix = !prefix_id.empty();
  request.spread_group = spread_group_;
  request.exclude = std::move(exclude);
  request.tie_break = tie_break_;
  absl::MutexLock lock(&mu_);
  const PrefixState* prefix = nullptr;
  if (request.has_prefix) {
    auto it = prefixes_.find(prefix_id);
    if (it == prefixes_.end()) {
      return absl::NotFoundError(
          absl::StrCat("prefix_id: '", prefix_id, "' is not a prefix of this cluster client"));
    }
    prefix = &it->second;
    request.prefix_bytes = PrefixBytes(prefix->tokens);
  }
  for (cluster::MemberRecord& member : view_->Members()) {
    // Every server of the cluster must serve the model the client connected for.
    if (member.model != info_.model().name() || member.layers != info_.model().layers() ||
        member.state == cluster::kMemberMovingOut) {
      continue;
    }
    cluster::PlacementCandidate candidate;
    auto reserved = reservations_.find(member.instance_id);
    if (reserved != reservations_.end() &&
        reserved->second.record_updated_unix_ms == member.updated_unix_ms) {
      candidate.reserved_bytes = reserved->second.bytes;
      candidate.reserved_sequences = reserved->second.sequences;
    }
    if (prefix != nullptr) {
      auto group = prefix->groups.find(member.instance_id);
      if (group != prefix->groups.end()) candidate.prefix_group = group->second;
    }
    candidate.member = std::move(member);
    candidates.push_back(std::move(candidate));
  }
  return candidates;
}

absl::StatusOr<cluster::Placement> ClusterClient::Place(const std::string& prefix_id,
                                                        int64_t sequence_bytes,
                                                        std::vector<std::string> exclude) {
  cluster::PlacementRequest request;
  ASSIGN_OR_RETURN(std::vector<cluster::PlacementCandidate> candidates,
                   Candidates(prefix_id, sequence_bytes, std::move(exclude), request));
  return cluster::PlaceSequence(candidates, request);
}

int64_t ClusterClient::GroupWeight(bool has_prefix, int sequences) const {
  const double b_theta =
      info_.naive_thresholds_size() > 0 ? info_.naive_thresholds(0).b_theta() : 0.0;
  const int64_t floor = has_prefix ? static_cast<int64_t>(std::ceil(std::max(1.0, b_theta))) : 1;
  return std::max<int64_t>(floor, sequences);
}

absl::StatusOr<cluster::Placement> ClusterClient::PlaceInGroup(
    const std::string& prefix_id, const std::string& hint, const std::vector<std::string>& refused,
    std::string& group) {
  const std::string base = absl::StrCat(prefix_id.empty() ? "-" : prefix_id, "|", hint);
  int number = 0;
  GroupState open;
  {
    absl::MutexLock lock(&mu_);
    number = open_group_[base];
    group = absl::StrCat(base, "#", number);
    auto it = groups_.find(group);
    if (it != groups_.end()) open = it->second;
  }
  const bool refused_there =
      std::find(refused.begin(), refused.end(), open.instance_id) != refused.end();
  if (!open.instance_id.empty() && !refused_there) {
    // The open group takes the sequence while it is below the spread size and its server
    // is a member, not leaving, with room.
    const std::optional<cluster::MemberRecord> member = view_->Find(open.instance_id);
    int64_t reserved = 0;
    {
      absl::MutexLock lock(&mu_);
      auto r = reservations_.find(open.instance_id);
      if (member.has_value() && r != reservations_.end() &&
          r->second.record_updated_unix_ms == member->updated_unix_ms) {
        reserved = r->second.bytes;
      }
    }
    const bool room = member.has_value() && member->state != cluster::kMemberMovingOut &&
                      member->kv_budget_bytes - member->kv_used_bytes - reserved >= SequenceBytes();
    if (room && (spread_group_ <= 0 || open.sequences < spread_group_)) {
      bool register_prefix = false;
      if (!prefix_id.empty()) {
        absl::MutexLock lock(&mu_);
        auto p = prefixes_.find(prefix_id);
        register_prefix = p == prefixes_.end() || !p->second.groups.contains(open.instance_id);
      }
      return cluster::Placement{open.instance_id, register_prefix};
    }
  }
  if (!open.instance_id.empty()) {  // full, gone or refused: the next group takes new ones
    if (open.sequences == 0) CountInGroup(group, 0);  // a claim no sequence came to
    absl::MutexLock lock(&mu_);
    number = ++open_group_[base];
    group = absl::StrCat(base, "#", number);
  }
  cluster::PlacementRequest request;
  ASSIGN_OR_RETURN(std::vector<cluster::PlacementCandidate> candidates,
                   Candidates(prefix_id, SequenceBytes(), refused, request));
  cluster::GroupRequest wanted;
  wanted.group =
      absl::StrCat(groups_table_ == nullptr ? "" : groups_table_->client_id(), "/", group);
  wanted.weight = GroupWeight(!prefix_id.empty(), 1);
  wanted.bytes = wanted.weight * SequenceBytes();
  wanted.load_slack = options_.load_slack;
  cluster::Placement placed;
  auto choose = [&](const cluster::GroupLoads& loads) -> absl::StatusOr<std::string> {
    for (cluster::PlacementCandidate& c : candidates) {
      auto load = loads.find(c.member.instance_id);
      c.group_load = load == loads.end() ? 0 : load->second.weight;
      c.group_bytes = load == loads.end() ? 0 : load->second.bytes;
    }
    ASSIGN_OR_RETURN(placed, cluster::PlaceGroup(candidates, request, wanted));
    return placed.instance_id;
  };
  if (groups_table_ == nullptr) {
    // Each client alone: its own groups are the loads it knows.
    cluster::GroupLoads own;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [name, state] : groups_) {
        cluster::GroupClaim& load = own[state.instance_id];
        load.weight += GroupWeight(state.has_prefix, state.sequences);
        load.bytes += GroupWeight(state.has_prefix, state.sequences) * SequenceBytes();
      }
    }
    RETURN_IF_ERROR(choose(own).status());
  } else {
    absl::StatusOr<std::string> claimed =
        groups_table_->Claim(group, wanted.weight, wanted.bytes, choose);
    if (!claimed.ok()) {
      if (absl::IsResourceExhausted(claimed.status())) return claimed.status();
      spdlog::warn("cluster '{}': group '{}' placed without its claim in etcd: {}",
                   view_->cluster(), group, std::string(claimed.status().message()));
      RETURN_IF_ERROR(choose({}).status());
    }
  }
  absl::MutexLock lock(&mu_);
  GroupState& state = groups_[group];
  state.instance_id = placed.instance_id;
  state.has_prefix = !prefix_id.empty();
  state.claimed_weight = wanted.weight;
  return placed;
}

absl::StatusOr<std::pair<std::string, std::string>> ClusterClient::GroupOf(
    absl::string_view sequence_id) const {
  absl::MutexLock lock(&mu_);
  auto it = sequences_.find(sequence_id);
  if (it == sequences_.end() || it->second.group.empty()) {
    return absl::NotFoundError(
        absl::StrCat("sequence_id: '", sequence_id, "' is in no placement group of this client"));
  }
  auto group = groups_.find(it->second.group);
  return std::make_pair(it->second.group,
                        group == groups_.end() ? std::string() : group->second.instance_id);
}

void ClusterClient::CountInGroup(const std::string& group, int delta) {
  // Counting and writing the claim go together: two releases of one group must not write
  // their weights in the other order (etcd would keep the older).
  absl::MutexLock claiming(&claims_mu_);
  int64_t weight = 0;
  bool drop = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = groups_.find(group);
    if (it == groups_.end()) return;
    it->second.sequences = std::max(0, it->second.sequences + delta);
    weight = GroupWeight(it->second.has_prefix, it->second.sequences);
    drop = it->second.sequences == 0;
    if (drop) {
      groups_.erase(it);
    } else if (weight == it->second.claimed_weight) {
      return;
    } else {
      it->second.claimed_weight = weight;
    }
  }
  if (groups_table_ == nullptr) return;
  const absl::Status written = drop
                                   ? groups_table_->Drop(group)
                                   : groups_table_->Update(group, weight, weight * SequenceBytes());
  if (!written.ok()) {
    spdlog::warn("cluster '{}': group '{}''s claim in etcd not updated: {}", view_->cluster(),
                 group, std::string(written.message()));
  }
}

absl::Status ClusterClient::EnsurePrefixOn(const std::string& prefix_id,
                                           const std::string& instance_id) {
  PrefixState prefix;
  {
    absl::MutexLock lock(&mu_);
    auto it = prefixes_.find(prefix_id);
    if (it == prefixes_.end()) {
      return absl::NotFoundError(absl::StrCat("prefix_id: '", prefix_id, "' is not known"));
    }
    if (it->second.groups.contains(instance_id)) return absl::OkStatus();
    prefix = it->second;
  }
  if (!prefix.parent_id.empty()) RETURN_IF_ERROR(EnsurePrefixOn(prefix.parent_id, instance_id));
  const std::optional<cluster::MemberRecord> member = view_->Find(instance_id);
  if (!member.has_value()) {
    return absl::UnavailableError(
        absl::StrCat("instance ", instance_id, " has left cluster '", view_->cluster(), "'"));
  }
  ASSIGN_OR_RETURN(Route route, RouteTo(instance_id, member->address, ""));
  absl::Status registered =
      route.client->RegisterPrefix(prefix_id, prefix.parent_id, prefix.latent, prefix.kv_dtype);
  if (!registered.ok() && !absl::IsAlreadyExists(registered)) return Annotate(registered, route);
  Reserve(instance_id, PrefixBytes(prefix.tokens));
  absl::MutexLock lock(&mu_);
  auto it = prefixes_.find(prefix_id);
  if (it != prefixes_.end()) it->second.groups.try_emplace(instance_id, 0);
  return absl::OkStatus();
}

absl::Status ClusterClient::RegisterPrefix(absl::string_view prefix_id, absl::string_view parent_id,
                                           const v1::Tensor& latent, v1::KvDtype kv_dtype) {
  if (latent.shape_size() != 3) {
    return absl::InvalidArgumentError("latent: must be [layers][tokens][dl + dr]");
  }
  absl::MutexLock placing(&placement_mu_);
  std::string where;
  {
    absl::MutexLock lock(&mu_);
    if (prefixes_.contains(prefix_id)) {
      return absl::AlreadyExistsError(
          absl::StrCat("prefix_id: '", prefix_id, "' is already registered by this client"));
    }
    if (!parent_id.empty()) {
      auto parent = prefixes_.find(parent_id);
      if (parent == prefixes_.end() || parent->second.groups.empty()) {
        return absl::NotFoundError(
            absl::StrCat("parent_id: '", parent_id, "' is not a prefix of this cluster client"));
      }
      // A child goes where its parent is first registered (the smallest id, for determinism).
      where = std::min_element(parent->second.groups.begin(), parent->second.groups.end())->first;
    }
    PrefixState& state = prefixes_[prefix_id];
    state.parent_id = std::string(parent_id);
    state.latent = latent;
    state.kv_dtype = kv_dtype;
    state.tokens = latent.shape(1);
  }
  if (where.empty()) {
    absl::StatusOr<cluster::Placement> placed = Place("", PrefixBytes(latent.shape(1)), {});
    if (!placed.ok()) {
      absl::MutexLock lock(&mu_);
      prefixes_.erase(prefix_id);
      return placed.status();
    }
    where = placed->instance_id;
  }
  absl::Status registered = EnsurePrefixOn(std::string(prefix_id), where);
  if (!registered.ok()) {
    absl::MutexLock lock(&mu_);
    prefixes_.erase(prefix_id);
  }
  return registered;
}

absl::Status ClusterClient::ReleasePrefix(absl::string_view prefix_id) {
  std::vector<std::string> holders;
  {
    absl::MutexLock lock(&mu_);
    auto it = prefixes_.find(prefix_id);
    if (it == prefixes_.end()) {
      return absl::NotFoundError(
          absl::StrCat("prefix_id: '", prefix_id, "' is not a prefix of this cluster client"));
    }
    for (const auto& [instance, group] : it->second.groups) holders.push_back(instance);
  }
  for (const std::string& instance : holders) {
    const std::optional<cluster::MemberRecord> member = view_->Find(instance);
    if (!member.has_value()) continue;  // gone with its server
    ASSIGN_OR_RETURN(Route route, RouteTo(instance, member->address, ""));
    absl::Status released = route.client->ReleasePrefix(prefix_id);
    if (!released.ok() && !absl::IsNotFound(released)) return Annotate(released, route);
  }
  absl::MutexLock lock(&mu_);
  prefixes_.erase(prefix_id);
  return absl::OkStatus();
}

absl::StatusOr<v1::Sequence> ClusterClient::CreateSequence(absl::string_view sequence_id,
                                                           absl::string_view prefix_id,
                                                           v1::KvDtype kv_dtype) {
  const std::string hint =
      options_.placement_group_of ? options_.placement_group_of(sequence_id) : std::string();
  return CreateSequence(sequence_id, prefix_id, kv_dtype, hint);
}

absl::StatusOr<v1::Sequence> ClusterClient::CreateSequence(absl::string_view sequence_id,
                                                           absl::string_view prefix_id,
                                                           v1::KvDtype kv_dtype,
                                                           absl::string_view placement_group) {
  // Without a prefix or a group there is nothing to keep together: the sequence is placed
  // alone by room (PlaceSequence).
  const bool grouped = !prefix_id.empty() || !placement_group.empty();
  std::string group;
  absl::MutexLock placing(&placement_mu_);
  int64_t prefix_tokens = 0;
  {
    absl::MutexLock lock(&mu_);
    if (sequences_.contains(sequence_id)) {
      return absl::AlreadyExistsError(
          absl::StrCat("sequence_id: '", sequence_id, "' already exists in this cluster client"));
    }
    if (!prefix_id.empty()) {
      auto prefix = prefixes_.find(prefix_id);
      if (prefix != prefixes_.end()) prefix_tokens = prefix->second.tokens;
    }
  }
  // A server that refuses (UNAVAILABLE: it is leaving the cluster in a drain, or going away)
  // is passed over and the sequence placed again.
  std::vector<std::string> refused;
  cluster::Placement placed;
  std::optional<cluster::MemberRecord> member;
  absl::StatusOr<v1::Sequence> created = absl::UnavailableError("not placed");
  for (int attempt = 0; attempt < 3 && (absl::IsUnavailable(created.status()) ||
                                        absl::IsCancelled(created.status()));
       ++attempt) {
    if (grouped) {
      ASSIGN_OR_RETURN(placed, PlaceInGroup(std::string(prefix_id), std::string(placement_group),
                                            refused, group));
    } else {
      ASSIGN_OR_RETURN(placed, Place(std::string(prefix_id), SequenceBytes(), refused));
    }
    refused.push_back(placed.instance_id);
    absl::Status ready = absl::OkStatus();
    if (placed.register_prefix) ready = EnsurePrefixOn(std::string(prefix_id), placed.instance_id);
    member = view_->Find(placed.instance_id);
    if (ready.ok() && !member.has_value()) {
      ready =
          absl::UnavailableError(absl::StrCat("instance ", placed.instance_id, " left cluster '",
                                              view_->cluster(), "' while the sequence was placed"));
    }
    if (!ready.ok()) {
      created = ready;
      continue;
    }
    ASSIGN_OR_RETURN(Route route, RouteTo(placed.instance_id, member->address, sequence_id));
    created = route.client->CreateSequence(sequence_id, prefix_id, kv_dtype);
    if (!created.ok()) created = Annotate(created.status(), route);
  }
  if (!group.empty()) CountInGroup(group, created.ok() ? 1 : 0);
  if (!created.ok()) return created.status();
  Reserve(placed.instance_id, SequenceBytes());
  absl::MutexLock lock(&mu_);
  SequenceState& state = sequences_[sequence_id];
  state.group = group;
  state.prefix_id = std::string(prefix_id);
  state.kv_dtype = created->kv_dtype();
  state.prefix_tokens = prefix_tokens;
  state.parts.push_back({placed.instance_id, member->address, std::string(sequence_id), 0});
  state.layer_lengths.assign(created->layer_lengths().begin(), created->layer_lengths().end());
  if (!prefix_id.empty()) ++prefixes_[prefix_id].groups[placed.instance_id];
  return created;
}

absl::StatusOr<v1::Sequence> ClusterClient::ForkOnce(absl::string_view source_id,
                                                     absl::string_view new_id) {
  ASSIGN_OR_RETURN(SequenceState source, SequenceCopy(source_id));
  absl::MutexLock placing(&placement_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (sequences_.contains(new_id)) {
      return absl::AlreadyExistsError(
          absl::StrCat("new_sequence_id: '", new_id, "' already exists in this cluster client"));
    }
  }
  SequenceState fork = source;
  v1::Sequence first;
  for (size_t p = 0; p < fork.parts.size(); ++p) {
    Part& part = fork.parts[p];
    ASSIGN_OR_RETURN(Route route, RouteTo(part.instance_id, part.address, source_id));
    const std::string fork_id = PartId(new_id, p);
    absl::StatusOr<v1::Sequence> forked = route.client->ForkSequence(part.sequence_id, fork_id);
    if (!forked.ok()) return Annotate(forked.status(), route);
    if (p == 0) first = *forked;
    part.sequence_id = fork_id;
    Reserve(part.instance_id, SequenceBytes());
  }
  if (!fork.group.empty()) CountInGroup(fork.group, 1);
  absl::MutexLock lock(&mu_);
  if (!fork.prefix_id.empty()) ++prefixes_[fork.prefix_id].groups[fork.parts[0].instance_id];
  sequences_.emplace(new_id, std::move(fork));
  return first;
}

absl::Status ClusterClient::ReleaseOnce(absl::string_view sequence_id) {
  ASSIGN_OR_RETURN(SequenceState state, SequenceCopy(sequence_id));
  for (const Part& part : state.parts) {
    absl::StatusOr<Route> route = RouteTo(part.instance_id, part.address, sequence_id);
    if (!route.ok()) continue;  // its server has left: nothing to release
    absl::Status released = route->client->ReleaseSequence(part.sequence_id);
    if (!released.ok() && !absl::IsNotFound(released)) return Annotate(released, *route);
  }
  if (!state.group.empty()) CountInGroup(state.group, -1);
  absl::MutexLock lock(&mu_);
  sequences_.erase(sequence_id);
  if (!state.prefix_id.empty()) {
    auto prefix = prefixes_.find(state.prefix_id);
    if (prefix != prefixes_.end()) {
      auto group = prefix->second.groups.find(state.parts[0].instance_id);
      if (group != prefix->second.groups.end() && group->second > 0) --group->second;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ClusterClient::SequenceState> ClusterClient::SequenceCopy(
    absl::string_view sequence_id) const {
  absl::MutexLock lock(&mu_);
  auto it = sequences_.find(sequence_id);
  if (it == sequences_.end()) {
    return absl::NotFoundError(
        absl::StrCat("sequence_id: '", sequence_id, "' is not a sequence of this cluster client"));
  }
  return it->second;
}

absl::StatusOr<size_t> ClusterClient::PartFor(const std::string& sequence_id, int64_t position) {
  ASSIGN_OR_RETURN(SequenceState state, SequenceCopy(sequence_id));
  const int64_t first_end = state.prefix_tokens + options_.context_part_tokens;
  if (options_.context_part_tokens <= 0 || position < first_end) return 0;
  const size_t index =
      1 + static_cast<size_t>((position - first_end) / options_.context_part_tokens);
  if (index < state.parts.size()) return index;
  absl::MutexLock placing(&placement_mu_);
  // Opens the parts up to `index` (another thread may have opened some meanwhile).
  while (true) {
    ASSIGN_OR_RETURN(state, SequenceCopy(sequence_id));
    if (index < state.parts.size()) return index;
    const size_t opening = state.parts.size();
    std::vector<std::string> exclude;
    for (const Part& part : state.parts) exclude.push_back(part.instance_id);
    const int64_t part_bytes = SequenceBytes();
    absl::StatusOr<cluster::Placement> placed = Place("", part_bytes, exclude);
    if (absl::IsResourceExhausted(placed.status())) placed = Place("", part_bytes, {});
    if (!placed.ok()) return placed.status();
    const std::optional<cluster::MemberRecord> member = view_->Find(placed->instance_id);
    if (!member.has_value()) return absl::UnavailableError("a placed server left the cluster");
    ASSIGN_OR_RETURN(Route route, RouteTo(placed->instance_id, member->address, sequence_id));
    const std::string part_id = PartId(sequence_id, opening);
    absl::StatusOr<v1::Sequence> created =
        route.client->CreateSequence(part_id, "", state.kv_dtype);
    if (!created.ok()) return Annotate(created.status(), route);
    Reserve(placed->instance_id, part_bytes);
    spdlog::debug("cluster: sequence '{}' part {} on {} from position {}", sequence_id, opening,
                  member->address,
                  first_end + static_cast<int64_t>(opening - 1) * options_.context_part_tokens);
    absl::MutexLock lock(&mu_);
    auto it = sequences_.find(sequence_id);
    if (it == sequences_.end()) return absl::NotFoundError("sequence released while appending");
    it->second.parts.push_back(
        {placed->instance_id, member->address, part_id,
         first_end + static_cast<int64_t>(opening - 1) * options_.context_part_tokens});
  }
}

}  // namespace mlaserve::client
