#include "client/cluster/cluster_client.h"

#include <algorithm>
#include <cmath>
#include <future>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/tensor_helpers.h"
#include "cluster/placement.h"
#include "common/status_macros.h"
#include "grpcpp/security/credentials.h"
#include "spdlog/spdlog.h"

namespace mlaserve::client {
namespace {

v1::Fp8Rows SliceFp8Rows(const v1::Fp8Rows& rows, int64_t first, int64_t count) {
  v1::Fp8Rows slice;
  slice.set_count(count);
  const size_t row_bytes = rows.data().size() / static_cast<size_t>(rows.count());
  slice.set_data(rows.data().substr(first * row_bytes, count * row_bytes));
  return slice;
}

int64_t RowCount(const KvAppend& append) {
  if (append.fp8_rows.count() > 0) return append.fp8_rows.count();
  return append.rows.shape_size() > 0 ? append.rows.shape(0) : 0;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ClusterClient>> ClusterClient::Connect(ClusterOptions options) {
  std::shared_ptr<grpc::ChannelCredentials> credentials =
      options.etcd_credentials ? options.etcd_credentials : grpc::InsecureChannelCredentials();
  ASSIGN_OR_RETURN(std::unique_ptr<cluster::EtcdClient> etcd,
                   cluster::EtcdClient::Connect(options.etcd_endpoints, credentials));
  ASSIGN_OR_RETURN(std::unique_ptr<cluster::MembershipView> view,
                   cluster::MembershipView::Start(std::move(etcd), options.cluster));
  std::unique_ptr<cluster::GroupTable> groups;
  if (options.placement_groups) {
    // A connection of its own: EtcdClient takes one caller at a time, and the view's watch
    // holds its own.
    ASSIGN_OR_RETURN(std::unique_ptr<cluster::EtcdClient> table_etcd,
                     cluster::EtcdClient::Connect(options.etcd_endpoints, credentials));
    ASSIGN_OR_RETURN(groups, cluster::GroupTable::Start(std::move(table_etcd), options.cluster,
                                                        options.group_lease_ttl));
  }
  return Create(std::move(view), std::move(options), std::move(groups));
}

absl::StatusOr<std::unique_ptr<ClusterClient>> ClusterClient::Create(
    std::unique_ptr<cluster::MembershipView> view, ClusterOptions options,
    std::unique_ptr<cluster::GroupTable> groups) {
  const std::vector<cluster::MemberRecord> members = view->Members();
  if (members.empty()) {
    return absl::UnavailableError(
        absl::StrCat("cluster '", view->cluster(), "' has no member in etcd"));
  }
  absl::Status last = absl::OkStatus();
  for (const cluster::MemberRecord& member : members) {
    std::unique_ptr<MlaServeClient> first =
        MlaServeClient::Connect(member.address, options.server_options);
    absl::StatusOr<v1::GetServerInfoResponse> info = first->GetServerInfo();
    if (info.ok()) {
      return std::unique_ptr<ClusterClient>(new ClusterClient(std::move(view), std::move(options),
                                                              *std::move(info), std::move(groups)));
    }
    last = absl::Status(info.status().code(),
                        absl::StrCat("server ", member.address, ": ", info.status().message()));
  }
  return last;
}

ClusterClient::ClusterClient(std::unique_ptr<cluster::MembershipView> view, ClusterOptions options,
                             v1::GetServerInfoResponse info,
                             std::unique_ptr<cluster::GroupTable> groups)
    : view_(std::move(view)),
      groups_table_(std::move(groups)),
      options_(std::move(options)),
      info_(std::move(info)),
      tie_break_(absl::Uniform<uint64_t>(absl::BitGen(), 1, ~uint64_t{0})) {
  spread_group_ = options_.spread_group;
  if (spread_group_ < 0) {
    const double b_theta =
        info_.naive_thresholds_size() > 0 ? info_.naive_thresholds(0).b_theta() : 0.0;
    spread_group_ = 2 * static_cast<int>(std::ceil(std::max(1.0, b_theta)));
  }
  if (options_.rebalance_interval > absl::ZeroDuration() && groups_table_ != nullptr) {
    rebalancer_ = std::thread([this] { RebalanceLoop(); });
  }
}

ClusterClient::~ClusterClient() {
  {
    absl::MutexLock lock(&rebalance_mu_);
    stopping_ = true;
  }
  if (rebalancer_.joinable()) rebalancer_.join();
}

absl::StatusOr<ClusterClient::Route> ClusterClient::RouteTo(const std::string& instance_id,
                                                            const std::string& address,
                                                            absl::string_view sequence_id) {
  // A server drained by mlaserve-ctl drain still answers for its sequences (they move, and
  // calls naming them are redirected); a lost one is failed here, without a call, unless a
  // server has come back at its address (systemd's restart: with --state_dir it holds the
  // sequences again, else it answers NOT_FOUND).
  if (view_->Contains(instance_id) || view_->MovedOut(instance_id)) {
    return Route{ClientFor(address), instance_id, address};
  }
  for (const cluster::MemberRecord& member : view_->Members()) {
    if (member.address == address) return Route{ClientFor(address), member.instance_id, address};
  }
  return absl::UnavailableError(absl::StrCat("server ", address, " (instance ", instance_id,
                                             ") has left cluster '", view_->cluster(), "'",
                                             sequence_id.empty() ? "" : "; sequence '", sequence_id,
                                             sequence_id.empty() ? "" : "' was on it"));
}

std::shared_ptr<MlaServeClient> ClusterClient::ClientFor(const std::string& address) {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<MlaServeClient>& client = clients_[address];
  if (client == nullptr) client = MlaServeClient::Connect(address, options_.server_options);
  return client;
}

absl::Status ClusterClient::Annotate(const absl::Status& status, const Route& route) const {
  if (status.ok()) return status;
  if (!view_->Contains(route.instance_id) && !view_->MovedOut(route.instance_id)) {
    return absl::UnavailableError(absl::StrCat("server ", route.address, " (instance ",
                                               route.instance_id, ") has left cluster '",
                                               view_->cluster(), "': ", status.message()));
  }
  return absl::Status(status.code(),
                      absl::StrCat("server ", route.address, ": ", status.message()));
}

absl::StatusOr<v1::GetServerInfoResponse> ClusterClient::GetServerInfo() {
  for (const cluster::MemberRecord& member : view_->Members()) {
    absl::StatusOr<Route> route = RouteTo(member.instance_id, member.address, "");
    if (!route.ok()) continue;
    absl::StatusOr<v1::GetServerInfoResponse> info = route->client->GetServerInfo();
    if (info.ok()) return info;
  }
  return info_;
}

absl::Status ClusterClient::AppendKv(absl::string_view sequence_id, int layer,
                                     int64_t start_position, const v1::Tensor& rows) {
  KvAppend append{std::string(sequence_id), layer, start_position, rows, {}};
  return AppendKv(std::span<const KvAppend>(&append, 1));
}

absl::Status ClusterClient::AppendOnce(std::span<const KvAppend> appends) {
  // The appends each server gets, with the route to it.
  absl::flat_hash_map<std::string, std::pair<Route, std::vector<KvAppend>>> by_server;
  for (const KvAppend& append : appends) {
    const int64_t n = RowCount(append);
    int64_t done = 0;
    while (done < n || (n == 0 && done == 0)) {
      const int64_t position = append.start_position + done;
      ASSIGN_OR_RETURN(const size_t index, PartFor(append.sequence_id, position));
      ASSIGN_OR_RETURN(SequenceState state, SequenceCopy(append.sequence_id));
      const Part& part = state.parts[index];
      int64_t take = n - done;
      if (options_.context_part_tokens > 0) {
        const int64_t part_end =
            state.prefix_tokens + options_.context_part_tokens * static_cast<int64_t>(index + 1);
        take = std::min(take, part_end - position);
      }
      ASSIGN_OR_RETURN(Route route, RouteTo(part.instance_id, part.address, append.sequence_id));
      KvAppend piece;
      piece.sequence_id = part.sequence_id;
      piece.layer = append.layer;
      piece.start_position = position - part.start;
      if (append.fp8_rows.count() > 0) {
        piece.fp8_rows = SliceFp8Rows(append.fp8_rows, done, take);
      } else if (n > 0) {
        piece.rows = SliceOuter(append.rows, done, take);
      } else {
        piece.rows = append.rows;  // the server names what is wrong with it
      }
      auto& [server_route, pieces] = by_server[part.instance_id];
      server_route = route;
      pieces.push_back(std::move(piece));
      done += std::max<int64_t>(take, 1);
    }
  }
  for (auto& [instance, work] : by_server) {
    auto& [route, pieces] = work;
    RETURN_IF_ERROR(Annotate(route.client->AppendKv(pieces), route));
  }
  absl::MutexLock lock(&mu_);
  for (const KvAppend& append : appends) {
    auto it = sequences_.find(append.sequence_id);
    if (it == sequences_.end() || append.layer < 0) continue;
    std::vector<int64_t>& lengths = it->second.layer_lengths;
    if (static_cast<size_t>(append.layer) >= lengths.size()) continue;
    lengths[append.layer] =
        std::max(lengths[append.layer], append.start_position + RowCount(append));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::DecodeResponse> ClusterClient::DecodeOnce(const v1::DecodeRequest& request) {
  // The call's options, as `options` or as the older top-level fields; every server's part
  // carries them (its output type fp32 where the answer is merged here).
  if (request.has_options() &&
      (request.output_dtype() != v1::DTYPE_UNSPECIFIED || request.has_softmax_scale())) {
    return absl::InvalidArgumentError(
        "options: set beside the top-level output_dtype or softmax_scale, which mean the same; "
        "set options alone");
  }
  v1::DecodeCallOptions options = request.options();
  if (!request.has_options()) {
    options.set_output_dtype(request.output_dtype());
    if (request.has_softmax_scale()) options.set_softmax_scale(request.softmax_scale());
  }
  const v1::DType requested =
      options.output_dtype() == v1::DTYPE_UNSPECIFIED ? v1::DTYPE_BF16 : options.output_dtype();
  // What each server is asked, and where each answer goes back.
  struct Slot {
    int query = 0;
    int part_query = -1;  // index into split[query], -1: the whole query
  };
  // A call names each (sequence, layer) once (the server's rule), so the sub-queries one
  // part gets for several tokens of a query go out as calls of their own, in parallel.
  struct ServerCall {
    Route route;
    std::vector<v1::DecodeQuery> queries;
    std::vector<Slot> slots;
    absl::flat_hash_set<std::pair<std::string, int>> named;
    bool fp32 = false;
  };
  std::vector<ServerCall> calls;
  absl::flat_hash_map<std::string, std::vector<size_t>> calls_of;  // by instance id
  const int n = request.queries_size();
  std::vector<std::vector<PartQuery>> split(n);
  auto call_for = [&](const Route& route, const v1::DecodeQuery& query) -> ServerCall& {
    std::vector<size_t>& indices = calls_of[route.instance_id];
    const std::pair<std::string, int> name(query.sequence_id(), query.layer());
    for (size_t index : indices) {
      if (calls[index].named.insert(name).second) return calls[index];
    }
    indices.push_back(calls.size());
    ServerCall& call = calls.emplace_back();
    call.route = route;
    call.named.insert(name);
    return call;
  };
  for (int i = 0; i < n; ++i) {
    const v1::DecodeQuery& query = request.queries(i);
    ASSIGN_OR_RETURN(SequenceState state, SequenceCopy(query.sequence_id()));
    const bool has_append = query.has_append_position();
    const int64_t append_rows =
        query.append_rows().shape_size() > 0 ? query.append_rows().shape(0) : 0;
    const int64_t first_end = state.prefix_tokens + options_.context_part_tokens;
    const bool one_part = options_.context_part_tokens <= 0 ||
                          (state.parts.size() == 1 &&
                           (!has_append || query.append_position() + append_rows <= first_end));
    if (one_part) {
      const Part& part = state.parts[0];
      ASSIGN_OR_RETURN(Route route, RouteTo(part.instance_id, part.address, query.sequence_id()));
      ServerCall& call = call_for(route, query);
      call.queries.push_back(query);
      call.slots.push_back({i, -1});
      if (has_append && options_.context_part_tokens > 0) {
        absl::MutexLock lock(&mu_);
        auto it = sequences_.find(query.sequence_id());
        if (it != sequences_.end() && query.layer() >= 0 &&
            static_cast<size_t>(query.layer()) < it->second.layer_lengths.size()) {
          int64_t& length = it->second.layer_lengths[query.layer()];
          length = std::max(length, query.append_position() + append_rows);
        }
      }
      continue;
    }
    v1::DecodeQuery bare = query;
    if (has_append) {
      KvAppend append{
          query.sequence_id(), query.layer(), query.append_position(), query.append_rows(), {}};
      RETURN_IF_ERROR(AppendKv(std::span<const KvAppend>(&append, 1)));
      bare.clear_append_rows();
      bare.clear_append_position();
    }
    ASSIGN_OR_RETURN(state, SequenceCopy(query.sequence_id()));
    if (query.layer() < 0 || static_cast<size_t>(query.layer()) >= state.layer_lengths.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("queries[", i, "].layer: ", query.layer(), " is not a layer of the model"));
    }
    const int64_t length = state.layer_lengths[query.layer()];
    std::vector<SequencePart> parts;
    for (size_t p = 0; p < state.parts.size() && state.parts[p].start < length; ++p) {
      const int64_t end =
          p + 1 < state.parts.size() ? std::min(state.parts[p + 1].start, length) : length;
      parts.push_back({state.parts[p].sequence_id, state.parts[p].start, end});
    }
    ASSIGN_OR_RETURN(split[i], SplitOverParts(bare, length, parts));
    for (size_t s = 0; s < split[i].size(); ++s) {
      const Part& part = state.parts[split[i][s].part];
      ASSIGN_OR_RETURN(Route route, RouteTo(part.instance_id, part.address, query.sequence_id()));
      ServerCall& call = call_for(route, split[i][s].query);
      call.queries.push_back(split[i][s].query);
      call.slots.push_back({i, static_cast<int>(s)});
      call.fp32 = true;
    }
  }

  // One call per server (in chunks of the servers' batch limit), in parallel.
  const int max_batch = std::max(1, info_.limits().max_batch());
  auto run = [&](ServerCall& call) -> absl::StatusOr<std::vector<v1::DecodeResult>> {
    std::vector<v1::DecodeResult> results;
    for (size_t first = 0; first < call.queries.size(); first += max_batch) {
      v1::DecodeRequest part;
      *part.mutable_options() = options;
      part.mutable_options()->set_output_dtype(call.fp32 ? v1::DTYPE_FP32 : requested);
      const size_t last = std::min(call.queries.size(), first + max_batch);
      for (size_t q = first; q < last; ++q) *part.add_queries() = call.queries[q];
      absl::StatusOr<v1::DecodeResponse> response = call.route.client->DecodeRaw(part);
      if (!response.ok()) return Annotate(response.status(), call.route);
      for (v1::DecodeResult& result : *response->mutable_results()) {
        results.push_back(std::move(result));
      }
    }
    return results;
  };
  std::vector<absl::StatusOr<std::vector<v1::DecodeResult>>> answers(calls.size());
  std::vector<std::future<void>> running;
  for (size_t c = 1; c < calls.size(); ++c) {
    running.push_back(std::async(std::launch::async, [&, c] { answers[c] = run(calls[c]); }));
  }
  if (!calls.empty()) answers[0] = run(calls[0]);
  for (std::future<void>& done : running) done.get();

  v1::DecodeResponse response;
  for (int i = 0; i < n; ++i) response.add_results();
  std::vector<std::vector<v1::DecodeResult>> part_answers(n);
  for (int i = 0; i < n; ++i) part_answers[i].resize(split[i].size());
  for (size_t s = 0; s < calls.size(); ++s) {
    if (!answers[s].ok()) return answers[s].status();
    ServerCall& call = calls[s];
    for (size_t q = 0; q < call.slots.size(); ++q) {
      v1::DecodeResult& result = (*answers[s])[q];
      const Slot& slot = call.slots[q];
      if (slot.part_query >= 0) {
        part_answers[slot.query][slot.part_query] = std::move(result);
        continue;
      }
      if (call.fp32 && requested != v1::DTYPE_FP32) {
        // Rounded here as the server would have (nearest even).
        ASSIGN_OR_RETURN(std::vector<float> values, TensorToFloats(result.out()));
        const std::vector<int64_t> shape(result.out().shape().begin(), result.out().shape().end());
        *result.mutable_out() = FloatTensor(values, shape, requested);
      }
      *response.mutable_results(slot.query) = std::move(result);
    }
  }
  for (int i = 0; i < n; ++i) {
    if (split[i].empty()) continue;
    ASSIGN_OR_RETURN(*response.mutable_results(i),
                     MergeByLse(request.queries(i).sq(), split[i], part_answers[i], requested));
  }
  return response;
}

// A moved sequence is followed to its new server and the call repeated (every call here is
// idempotent). A server refuses one moved sequence per call, so a call may follow as many moves
// as it names sequences, and a few more.
constexpr int kMovesFollowedBeyondSequences = 8;

absl::StatusOr<v1::DecodeResponse> ClusterClient::DecodeRaw(const v1::DecodeRequest& request) {
  const int bound = request.queries_size() + kMovesFollowedBeyondSequences;
  for (int moves = 0;; ++moves) {
    absl::StatusOr<v1::DecodeResponse> response = DecodeOnce(request);
    if (response.ok() || moves >= bound || !FollowMove(response.status())) return response;
  }
}

absl::Status ClusterClient::AppendKv(std::span<const KvAppend> appends) {
  const int bound = static_cast<int>(appends.size()) + kMovesFollowedBeyondSequences;
  for (int moves = 0;; ++moves) {
    absl::Status status = AppendOnce(appends);
    if (status.ok() || moves >= bound || !FollowMove(status)) return status;
  }
}

absl::Status ClusterClient::ReleaseSequence(absl::string_view sequence_id) {
  for (int moves = 0;; ++moves) {
    absl::Status status = ReleaseOnce(sequence_id);
    if (status.ok() || moves >= kMovesFollowedBeyondSequences || !FollowMove(status)) {
      return status;
    }
  }
}

absl::StatusOr<v1::Sequence> ClusterClient::ForkSequence(absl::string_view source_id,
                                                         absl::string_view new_id) {
  for (int moves = 0;; ++moves) {
    absl::StatusOr<v1::Sequence> forked = ForkOnce(source_id, new_id);
    if (forked.ok() || moves >= kMovesFollowedBeyondSequences || !FollowMove(forked.status())) {
      return forked;
    }
  }
}

bool ClusterClient::FollowMove(const absl::Status& status) {
  // Its last rows are on their way: the move ends within moments (the client library's own
  // retries of UNAVAILABLE may not have waited long enough).
  if (absl::IsUnavailable(status) &&
      absl::StrContains(status.message(), "' is moving to server ")) {
    absl::SleepFor(absl::Milliseconds(100));
    return true;
  }
  // A drained server that has already stopped: its sequences moved, but there is nobody left
  // to say where. The other members' listings do.
  // (CANCELLED: it was shutting down as the call arrived.)
  if ((absl::IsUnavailable(status) || absl::IsCancelled(status)) &&
      absl::StartsWith(status.message(), "server ")) {
    const absl::string_view rest = status.message().substr(7);
    const std::string address(rest.substr(0, rest.find(':', rest.find(':') + 1)));
    return Relocate(address);
  }
  if (!absl::IsFailedPrecondition(status)) return false;
  const absl::string_view message = status.message();
  constexpr absl::string_view kMoved = "' moved to server ";
  const size_t moved = message.find(kMoved);
  constexpr absl::string_view kSequence = "sequence '";
  const size_t named = moved == absl::string_view::npos ? moved : message.rfind(kSequence, moved);
  if (named == absl::string_view::npos) return false;
  const std::string part_id(
      message.substr(named + kSequence.size(), moved - named - kSequence.size()));
  absl::string_view address = message.substr(moved + kMoved.size());
  address = address.substr(0, address.find_first_of(" ;,)"));
  std::optional<cluster::MemberRecord> member;
  for (cluster::MemberRecord& record : view_->Members()) {
    if (record.address == address) member = std::move(record);
  }
  if (!member.has_value()) {
    spdlog::warn("cluster '{}': sequence '{}' moved to {}, which is no member", view_->cluster(),
                 part_id, std::string(address));
    return false;
  }
  absl::MutexLock lock(&mu_);
  return Repoint(part_id, *member);
}

bool ClusterClient::Repoint(const std::string& part_id, const cluster::MemberRecord& member) {
  for (auto& [id, state] : sequences_) {
    for (size_t p = 0; p < state.parts.size(); ++p) {
      Part& part = state.parts[p];
      if (part.sequence_id != part_id) continue;
      // Another call followed this move first: repeating is all that is left to do.
      if (part.instance_id == member.instance_id) return true;
      spdlog::info("cluster '{}': sequence '{}' moved from {} to {}", view_->cluster(), part_id,
                   part.address, member.address);
      if (p == 0 && !state.prefix_id.empty()) {
        auto prefix = prefixes_.find(state.prefix_id);
        if (prefix != prefixes_.end()) {
          auto old_group = prefix->second.groups.find(part.instance_id);
          if (old_group != prefix->second.groups.end() && old_group->second > 0) {
            --old_group->second;
          }
          // The move registered the prefix there.
          ++prefix->second.groups[member.instance_id];
        }
      }
      part.instance_id = member.instance_id;
      part.address = member.address;
      return true;
    }
  }
  return false;
}

bool ClusterClient::Relocate(const std::string& address) {
  std::string gone_instance;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, state] : sequences_) {
      for (const Part& part : state.parts) {
        if (part.address == address) gone_instance = part.instance_id;
      }
    }
    // Another call relocated them first: repeating is all that is left to do.
    if (gone_instance.empty()) return relocated_.contains(address);
  }
  if (!view_->MovedOut(gone_instance)) return false;
  // Every sequence the members hold, by id.
  absl::flat_hash_map<std::string, cluster::MemberRecord> holder;
  for (const cluster::MemberRecord& member : view_->Members()) {
    absl::StatusOr<Route> route = RouteTo(member.instance_id, member.address, "");
    if (!route.ok()) continue;
    absl::StatusOr<std::vector<v1::SequenceSummary>> listed = route->client->ListAllSequences();
    if (!listed.ok()) continue;
    for (const v1::SequenceSummary& s : *listed) holder.emplace(s.sequence().sequence_id(), member);
  }
  bool moved = false;
  absl::MutexLock lock(&mu_);
  for (auto& [id, state] : sequences_) {
    for (Part& part : state.parts) {
      if (part.instance_id != gone_instance) continue;
      auto it = holder.find(part.sequence_id);
      if (it == holder.end()) continue;
      spdlog::info("cluster '{}': sequence '{}' found on {} after {} stopped", view_->cluster(),
                   part.sequence_id, it->second.address, part.address);
      part.instance_id = it->second.instance_id;
      part.address = it->second.address;
      moved = true;
    }
  }
  if (moved) relocated_.insert(address);
  return moved;
}

absl::StatusOr<std::vector<DecodeOutput>> ClusterClient::Decode(
    std::vector<v1::DecodeQuery> queries, v1::DType output_dtype) {
  v1::DecodeRequest request;
  for (v1::DecodeQuery& query : queries) *request.add_queries() = std::move(query);
  request.set_output_dtype(output_dtype);
  ASSIGN_OR_RETURN(v1::DecodeResponse response, DecodeRaw(request));
  return ToDecodeOutputs(response);
}

absl::StatusOr<std::vector<std::string>> ClusterClient::ServersOf(
    absl::string_view sequence_id) const {
  ASSIGN_OR_RETURN(SequenceState state, SequenceCopy(sequence_id));
  std::vector<std::string> addresses;
  for (const Part& part : state.parts) addresses.push_back(part.address);
  return addresses;
}

std::vector<std::string> ClusterClient::PrefixServers(absl::string_view prefix_id) const {
  std::vector<std::string> instances;
  {
    absl::MutexLock lock(&mu_);
    auto it = prefixes_.find(prefix_id);
    if (it == prefixes_.end()) return {};
    for (const auto& [instance, group] : it->second.groups) instances.push_back(instance);
  }
  std::sort(instances.begin(), instances.end());
  std::vector<std::string> addresses;
  for (const std::string& instance : instances) {
    if (std::optional<cluster::MemberRecord> member = view_->Find(instance)) {
      addresses.push_back(member->address);
    }
  }
  return addresses;
}

}  // namespace mlaserve::client
