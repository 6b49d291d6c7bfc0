// mlaserve-ctl: what an operator asks a running server, as tables for people and JSON for
// scripts (Debian ships no grpcurl). Read-only but for `drain`, which moves a server's
// sequences to the other members of its cluster and stops it.
//
//   mlaserve-ctl [--target host:port] [--json] [TLS and token flags] COMMAND
//     info        model, devices, limits, host, KV formats, instance and restored state
//     health      grpc.health.v1 status of the server; exit 0 SERVING, 1 not serving, 2 no answer
//     prefixes    registered prefixes (all pages; --limit caps them)
//     sequences   live sequences, optionally --prefix ID's only
//     stats       KV pages and bytes, prefixes, sequences, evictions, queued queries
//     members     the cluster's servers and their load, from etcd (--etcd_endpoints)
//     drain       move --target's sequences to the other members, then stop it

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/ctl/drain.h"
#include "client/health_check.h"
#include "client/mlaserve_client.h"
#include "client/transport_hint.h"
#include "cluster/etcd_client.h"
#include "cluster/member_record.h"
#include "common/command_line.h"
#include "common/status_macros.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/security/credentials.h"
#include "kernels/core/matmul.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50051", "server address, host:port");
ABSL_FLAG(bool, json, false,
          "print JSON (one object; listings as {\"prefixes\": [...]}) for scripts");
ABSL_FLAG(double, timeout_s, 10, "deadline of each call");
ABSL_FLAG(int, limit, 0, "prefixes, sequences: list at most this many (0: all)");
ABSL_FLAG(int, page_size, 100, "prefixes, sequences: entries per call (1..1000)");
ABSL_FLAG(std::string, prefix, "", "sequences: only those started on this prefix");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA bundle that signed the server's certificate (enables TLS)");
ABSL_FLAG(std::string, tls_cert, "", "PEM client certificate, for servers that require one (mTLS)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_server_name, "",
          "name the server's certificate carries, when it is not the target's host");
ABSL_FLAG(std::string, etcd_endpoints, "",
          "members, drain: etcd's host:port list, where the cluster's servers register");
ABSL_FLAG(std::string, cluster, "default", "members, drain: the servers' --cluster");
ABSL_FLAG(std::string, etcd_ca, "", "PEM CA of etcd's certificate (TLS towards etcd)");
ABSL_FLAG(std::string, etcd_cert, "", "PEM client certificate for an etcd that requires one");
ABSL_FLAG(std::string, etcd_key, "", "PEM private key of --etcd_cert");
ABSL_FLAG(double, move_timeout_s, 600, "drain: deadline of each move");
ABSL_FLAG(std::string, auth_token_file, "",
          "file whose first line is the tenant's bearer token (servers with --auth_tokens_file)");

namespace {

using mlaserve::client::MlaServeClient;
namespace v1 = mlaserve::v1;

constexpr char kUsage[] =
    "mlaserve-ctl [--target host:port] [--json] COMMAND\n"
    "Read-only commands:\n"
    "  info        the server's model, devices, limits, host, KV formats and state\n"
    "  health      grpc.health.v1 status; exit 0 SERVING, 1 not serving, 2 no answer\n"
    "  prefixes    registered prefixes: id, parent, tokens, format, pages, referenced\n"
    "  sequences   live sequences (--prefix ID: those on one prefix): lengths, format, pages\n"
    "  stats       KV pages and bytes, prefixes, sequences, evictions, queued queries\n"
    "  members     the cluster's servers and their load, from etcd (--etcd_endpoints)\n"
    "Command that changes state:\n"
    "  drain       move --target's sequences to the cluster's other servers (by prefix, by\n"
    "              room), then stop it; clients follow them (docs/cluster.md)\n"
    "Under tenants a caller sees its own prefixes and sequences only (docs/api.md).";

// Whether --tls_ca made this a TLS client: a connection failure then reads differently.
bool client_tls = false;

// `from_target`: the failure of a call to --target (not to etcd, whose TLS flags are others).
int Fail(const absl::Status& failure, bool from_target = true) {
  const absl::Status status =
      from_target ? mlaserve::client::ExplainTransportError(failure, client_tls) : failure;
  std::cerr << "mlaserve-ctl: " << absl::StatusCodeToString(status.code()) << ": "
            << status.message() << "\n";
  return 2;
}

std::string Json(const google::protobuf::Message& message) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(message, &out, options);
  return out;
}

std::string Dtype(v1::KvDtype dtype) {
  switch (dtype) {
    case v1::KV_DTYPE_BF16:
      return "bf16";
    case v1::KV_DTYPE_FP8:
      return "fp8";
    default:
      return "?";
  }
}

// Lengths per layer as one cell: "130" when every layer holds the same, else "min-max".
std::string Lengths(const v1::Sequence& sequence) {
  if (sequence.layer_lengths().empty()) return "-";
  int lo = sequence.layer_lengths(0), hi = lo;
  for (int length : sequence.layer_lengths()) {
    lo = std::min(lo, length);
    hi = std::max(hi, length);
  }
  return lo == hi ? absl::StrCat(lo) : absl::StrCat(lo, "-", hi);
}

int Info(MlaServeClient& client, bool json) {
  absl::StatusOr<v1::GetServerInfoResponse> info = client.GetServerInfo();
  if (!info.ok()) return Fail(info.status());
  if (json) {
    std::cout << Json(*info);
    return 0;
  }
  const v1::ModelInfo& m = info->model();
  std::cout << absl::StrFormat("server      mlaserve %s, instance %s\n", info->server_version(),
                               info->state().instance_id());
  std::cout << absl::StrFormat("model       %s: %d layers, %d heads, dl %d + dr %d\n", m.name(),
                               m.layers(), m.heads(), m.dl(), m.dr());
  for (const v1::DeviceInfo& d : info->devices()) {
    std::cout << absl::StrFormat("device      %d: %s\n", d.index(), d.profile());
  }
  const v1::Limits& l = info->limits();
  std::cout << absl::StrFormat(
      "limits      max_batch %d, max_sq %d, max_queue %d, max_wait %d us, KV budget %.1f MiB, "
      "messages up to %.1f MiB\n",
      l.max_batch(), l.max_sq(), l.max_queue(), l.max_wait_us(), l.kv_budget_bytes() / 1048576.0,
      l.max_message_bytes() / 1048576.0);
  std::vector<std::string> formats;
  for (const v1::KvFormat& f : info->kv_formats()) {
    formats.push_back(absl::StrFormat("%s (%d B/token, %d tokens/page)", Dtype(f.dtype()),
                                      f.bytes_per_token(), f.page_tokens()));
  }
  std::cout << "kv formats  " << absl::StrJoin(formats, ", ") << "; default "
            << Dtype(info->default_kv_dtype()) << "\n";
  const v1::HostInfo& h = info->host();
  std::cout << absl::StrFormat("host        %s, %d cores, %s, matrix unit %s\n", h.cpu_model(),
                               h.logical_cores(), h.isa(), h.matrix_unit());
  if (!h.pool_sizing().empty()) std::cout << "pool        " << h.pool_sizing() << "\n";
  const v1::StateInfo& s = info->state();
  std::cout << absl::StrFormat(
      "state       dir %s, snapshots every %g s; restored %d prefixes and %d sequences%s\n",
      s.state_dir().empty() ? "(none)" : s.state_dir(), s.snapshot_interval_s(),
      s.restored_prefixes(), s.restored_sequences(),
      s.restored_from_instance_id().empty() ? ""
                                            : " from instance " + s.restored_from_instance_id());
  return 0;
}

int Health(MlaServeClient& client, bool json) {
  absl::StatusOr<mlaserve::client::ServingStatus> status = mlaserve::client::CheckHealth(
      client.channel(), "", absl::Seconds(absl::GetFlag(FLAGS_timeout_s)));
  if (!status.ok()) return Fail(status.status());
  const std::string name = mlaserve::client::ServingStatusName(*status);
  std::cout << (json ? absl::StrCat("{\"status\": \"", name, "\"}") : name) << "\n";
  return *status == mlaserve::client::ServingStatus::kServing ? 0 : 1;
}

// A listing as far as --limit, and whether the server holds more entries than it shows.
template <typename Entry>
struct Listing {
  std::vector<Entry> entries;
  bool more = false;
};

// Pages through a listing until its end or --limit (one entry past it tells whether more exist).
template <typename Entry, typename Response, typename Call, typename Entries>
absl::StatusOr<Listing<Entry>> ListAll(Call call, Entries entries) {
  const int limit = absl::GetFlag(FLAGS_limit);
  Listing<Entry> all;
  std::string token;
  do {
    absl::StatusOr<Response> page = call(absl::GetFlag(FLAGS_page_size), token);
    if (!page.ok()) return page.status();
    for (const auto& entry : entries(*page)) {
      if (limit > 0 && static_cast<int>(all.entries.size()) >= limit) {
        all.more = true;
        return all;
      }
      all.entries.push_back(entry);
    }
    token = page->next_page_token();
  } while (!token.empty());
  return all;
}

// The table's last line: the count, and how to see the rest when --limit cut the listing.
std::string CountLine(size_t shown, bool more, const char* what) {
  if (!more) return absl::StrCat(shown, " ", what, "\n");
  return absl::StrCat(shown, " ", what, " shown; the server holds more (--limit ",
                      absl::GetFlag(FLAGS_limit), "; --limit 0 lists all)\n");
}

int Prefixes(MlaServeClient& client, bool json) {
  auto prefixes = ListAll<v1::PrefixSummary, v1::ListPrefixesResponse>(
      [&](int size, const std::string& token) { return client.ListPrefixes(size, token); },
      [](const v1::ListPrefixesResponse& page) -> const auto& { return page.prefixes(); });
  if (!prefixes.ok()) return Fail(prefixes.status());
  if (json) {
    v1::ListPrefixesResponse all;
    for (const v1::PrefixSummary& p : prefixes->entries) *all.add_prefixes() = p;
    // As the RPC says it: more entries follow the last one shown.
    if (prefixes->more) all.set_next_page_token(all.prefixes().rbegin()->prefix_id());
    std::cout << Json(all);
    return 0;
  }
  std::cout << absl::StrFormat("%-32s %-24s %8s %8s %6s %8s %s\n", "PREFIX", "PARENT", "TOKENS",
                               "OWN", "FORMAT", "PAGES", "REFERENCED");
  for (const v1::PrefixSummary& p : prefixes->entries) {
    std::cout << absl::StrFormat("%-32s %-24s %8d %8d %6s %8d %s\n", p.prefix_id(),
                                 p.parent_id().empty() ? "-" : p.parent_id(), p.tokens(),
                                 p.own_tokens(), Dtype(p.kv_dtype()), p.pages(),
                                 p.referenced() ? "yes" : "no");
  }
  std::cout << CountLine(prefixes->entries.size(), prefixes->more, "prefix(es)");
  return 0;
}

int Sequences(MlaServeClient& client, bool json) {
  const std::string on = absl::GetFlag(FLAGS_prefix);
  auto sequences = ListAll<v1::SequenceSummary, v1::ListSequencesResponse>(
      [&](int size, const std::string& token) { return client.ListSequences(size, token, on); },
      [](const v1::ListSequencesResponse& page) -> const auto& { return page.sequences(); });
  if (!sequences.ok()) return Fail(sequences.status());
  if (json) {
    v1::ListSequencesResponse all;
    for (const v1::SequenceSummary& s : sequences->entries) *all.add_sequences() = s;
    if (sequences->more) {
      all.set_next_page_token(all.sequences().rbegin()->sequence().sequence_id());
    }
    std::cout << Json(all);
    return 0;
  }
  std::cout << absl::StrFormat("%-32s %-24s %10s %6s %8s %s\n", "SEQUENCE", "PREFIX", "LENGTH",
                               "FORMAT", "PAGES", "SHARED");
  for (const v1::SequenceSummary& s : sequences->entries) {
    const v1::Sequence& q = s.sequence();
    std::cout << absl::StrFormat("%-32s %-24s %10s %6s %8d %d\n", q.sequence_id(),
                                 q.prefix_id().empty() ? "-" : q.prefix_id(), Lengths(q),
                                 Dtype(q.kv_dtype()), s.pages(), s.shared_pages());
  }
  std::cout << CountLine(sequences->entries.size(), sequences->more, "sequence(s)");
  return 0;
}

int Stats(MlaServeClient& client, bool json) {
  absl::StatusOr<v1::GetStatsResponse> stats = client.GetStats();
  if (!stats.ok()) return Fail(stats.status());
  if (json) {
    std::cout << Json(*stats);
    return 0;
  }
  const v1::GetStatsResponse& s = *stats;
  if (!s.tenant().empty()) {
    std::cout << absl::StrFormat(
        "tenant      %s (KV quota %s)\n", s.tenant(),
        s.tenant_kv_quota_bytes() > 0
            ? absl::StrFormat("%.1f MiB", s.tenant_kv_quota_bytes() / 1048576.0)
            : std::string("none"));
  }
  std::cout << absl::StrFormat(
      "kv pages    %d used of %d (%.1f %%)\n", s.kv_pages_used(), s.kv_pages_total(),
      s.kv_pages_total() > 0 ? 100.0 * s.kv_pages_used() / s.kv_pages_total() : 0.0);
  std::cout << absl::StrFormat(
      "kv bytes    %.1f MiB used of %.1f MiB budget, %.1f MiB expanded K/V\n",
      s.kv_bytes_used() / 1048576.0, s.kv_bytes_budget() / 1048576.0,
      s.kv_bytes_expanded() / 1048576.0);
  std::cout << absl::StrFormat("held        %d prefix(es) (+%d retained), %d sequence(s)\n",
                               s.prefixes(), s.retained_prefixes(), s.sequences());
  std::cout << absl::StrFormat("evictions   %d prefix, %d expanded\n", s.prefix_evictions(),
                               s.expanded_evictions());
  std::cout << absl::StrFormat("queued      %d decode queries\n", s.decode_queued());
  return 0;
}

// The cluster's members as etcd holds them (docs/cluster.md, "The record").
absl::StatusOr<std::vector<mlaserve::cluster::MemberRecord>> ReadMembers() {
  const std::string endpoints = absl::GetFlag(FLAGS_etcd_endpoints);
  if (endpoints.empty()) return absl::InvalidArgumentError("--etcd_endpoints: needed here");
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!absl::GetFlag(FLAGS_etcd_ca).empty() || !absl::GetFlag(FLAGS_etcd_cert).empty()) {
    ASSIGN_OR_RETURN(credentials, mlaserve::cluster::EtcdChannelCredentials(
                                      absl::GetFlag(FLAGS_etcd_ca), absl::GetFlag(FLAGS_etcd_cert),
                                      absl::GetFlag(FLAGS_etcd_key)));
  }
  ASSIGN_OR_RETURN(
      std::unique_ptr<mlaserve::cluster::EtcdClient> etcd,
      mlaserve::cluster::EtcdClient::Connect(absl::StrSplit(endpoints, ','), credentials));
  ASSIGN_OR_RETURN(auto pairs,
                   etcd->GetPrefix(mlaserve::cluster::MembersPrefix(absl::GetFlag(FLAGS_cluster))));
  std::vector<mlaserve::cluster::MemberRecord> members;
  for (const auto& [key, value] : pairs) {
    absl::StatusOr<mlaserve::cluster::MemberRecord> record =
        mlaserve::cluster::ParseMemberRecord(value);
    if (record.ok()) members.push_back(*std::move(record));
  }
  return members;
}

int Members(bool json) {
  absl::StatusOr<std::vector<mlaserve::cluster::MemberRecord>> members = ReadMembers();
  if (!members.ok()) return Fail(members.status(), /*from_target=*/false);
  if (json) {
    std::cout << "{\"members\": [";
    for (size_t i = 0; i < members->size(); ++i) {
      std::cout << (i > 0 ? ", " : "") << (*members)[i].ToJson();
    }
    std::cout << "]}\n";
    return 0;
  }
  std::cout << absl::StrFormat("%-24s %-32s %-12s %6s %10s %10s %9s %7s\n", "address", "instance",
                               "model", "seqs", "KV used", "budget", "queued", "q/s");
  for (const mlaserve::cluster::MemberRecord& m : *members) {
    std::cout << absl::StrFormat("%-24s %-32s %-12s %6d %8.1fMi %8.1fMi %9d %7.0f\n", m.address,
                                 m.instance_id, m.model, m.sequences, m.kv_used_bytes / 1048576.0,
                                 m.kv_budget_bytes / 1048576.0, m.queued_queries, m.queries_per_s);
  }
  return 0;
}

int Drain(MlaServeClient& client, bool json) {
  absl::StatusOr<std::vector<mlaserve::cluster::MemberRecord>> members = ReadMembers();
  if (!members.ok()) return Fail(members.status(), /*from_target=*/false);
  const std::string target = absl::GetFlag(FLAGS_target);
  absl::StatusOr<v1::GetServerInfoResponse> info = client.GetServerInfo();
  if (!info.ok()) return Fail(info.status());
  // The others: by instance id (the address it advertises may differ from --target's).
  std::vector<mlaserve::cluster::MemberRecord> others;
  for (mlaserve::cluster::MemberRecord& m : *members) {
    if (m.instance_id != info->state().instance_id() && m.address != target) {
      others.push_back(std::move(m));
    }
  }
  const absl::Time start = absl::Now();
  absl::StatusOr<std::vector<mlaserve::ctl::DrainStep>> steps = mlaserve::ctl::DrainServer(
      client, others, absl::Seconds(absl::GetFlag(FLAGS_move_timeout_s)));
  if (!steps.ok()) return Fail(steps.status());
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (json) {
    std::cout << "{\"drained\": \"" << target << "\", \"seconds\": " << seconds << ", \"moves\": [";
    for (size_t i = 0; i < steps->size(); ++i) {
      const auto& s = (*steps)[i];
      std::cout << (i > 0 ? ", " : "") << "{\"target\": \"" << s.target
                << "\", \"sequences\": " << s.moved.sequences()
                << ", \"prefixes\": " << s.moved.prefixes() << ", \"tokens\": " << s.moved.tokens()
                << ", \"bytes\": " << s.moved.bytes() << ", \"seconds\": " << s.moved.seconds()
                << ", \"held_seconds\": " << s.moved.held_seconds() << "}";
    }
    std::cout << "]}\n";
    return 0;
  }
  std::cout << absl::StrFormat("drained %s in %.2f s; it stops now\n", target, seconds);
  std::cout << absl::StrFormat("  %-24s %9s %8s %10s %10s %8s %8s\n", "to", "sequences", "prefixes",
                               "tokens", "MiB", "s", "held ms");
  for (const auto& s : *steps) {
    std::cout << absl::StrFormat("  %-24s %9d %8d %10d %10.1f %8.2f %8.1f\n", s.target,
                                 s.moved.sequences(), s.moved.prefixes(), s.moved.tokens(),
                                 s.moved.bytes() / 1048576.0, s.moved.seconds(),
                                 s.moved.held_seconds() * 1000);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Reports (and --json) own stdout; the cluster client's log lines go to stderr.
  spdlog::set_default_logger(spdlog::stderr_color_mt("mlaserve-ctl"));
  absl::SetProgramUsageMessage(kUsage);
  absl::StatusOr<std::vector<std::string>> args =
      mlaserve::ParseFlags(argc, argv, mlaserve::MatrixPathDescription);
  if (!args.ok()) return Fail(args.status());
  if (args->size() != 1) {
    std::cerr << kUsage << "\n";
    return 2;
  }
  const std::string command = args->front();
  const int page_size = absl::GetFlag(FLAGS_page_size);
  if (page_size < 1 || page_size > 1000) {
    std::cerr << "mlaserve-ctl: --page_size: " << page_size << " is not in 1..1000\n";
    return 2;
  }
  if (absl::GetFlag(FLAGS_limit) < 0) {
    std::cerr << "mlaserve-ctl: --limit: must be 0 (all) or more\n";
    return 2;
  }
  if (absl::GetFlag(FLAGS_timeout_s) <= 0) {
    std::cerr << "mlaserve-ctl: --timeout_s: must be positive\n";
    return 2;
  }

  mlaserve::client::ClientOptions options;
  options.timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  if (const std::string ca = absl::GetFlag(FLAGS_tls_ca); !ca.empty()) {
    absl::StatusOr<mlaserve::client::ClientTls> tls = mlaserve::client::LoadClientTls(
        ca, absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key));
    if (!tls.ok()) return Fail(tls.status());
    options.tls = *std::move(tls);
    options.tls.server_name = absl::GetFlag(FLAGS_tls_server_name);
    client_tls = true;
  } else if (!absl::GetFlag(FLAGS_tls_cert).empty()) {
    std::cerr << "mlaserve-ctl: --tls_cert: needs --tls_ca\n";
    return 2;
  }
  if (const std::string path = absl::GetFlag(FLAGS_auth_token_file); !path.empty()) {
    std::ifstream in(path);
    if (!in || !std::getline(in, options.bearer_token) || options.bearer_token.empty()) {
      std::cerr << "mlaserve-ctl: --auth_token_file: cannot read a token from '" << path << "'\n";
      return 2;
    }
  }
  std::unique_ptr<MlaServeClient> client =
      MlaServeClient::Connect(absl::GetFlag(FLAGS_target), options);
  const bool json = absl::GetFlag(FLAGS_json);
  if (command == "info") return Info(*client, json);
  if (command == "health") return Health(*client, json);
  if (command == "prefixes") return Prefixes(*client, json);
  if (command == "sequences") return Sequences(*client, json);
  if (command == "stats") return Stats(*client, json);
  if (command == "members") return Members(json);
  if (command == "drain") return Drain(*client, json);
  std::cerr << "mlaserve-ctl: unknown command '" << command << "'\n" << kUsage << "\n";
  return 2;
}
