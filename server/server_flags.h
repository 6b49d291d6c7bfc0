#ifndef MLASERVE_SERVER_SERVER_FLAGS_H_
#define MLASERVE_SERVER_SERVER_FLAGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/host_resources.h"
#include "server/cluster/cluster_membership.h"
#include "server/engine/engine.h"
#include "server/service/mla_server.h"
#include "spdlog/common.h"

namespace mlaserve {

// Everything mlaserve-server's command line decides.
struct ServerConfig {
  engine::EngineOptions engine;
  service::ServerOptions server;
  spdlog::level::level_enum log_level = spdlog::level::info;
  absl::Duration drain_timeout = absl::Seconds(30);
  // Membership in a cluster on etcd (docs/cluster.md); no endpoints: a standalone server.
  std::vector<std::string> etcd_endpoints;
  // What the server's record tells clients to dial; empty: --listen's address with its port,
  // the host name in place of a wildcard address.
  std::string advertise_address;
  cluster::MembershipOptions membership;
  // TLS towards etcd: its CA, and a client certificate and key (PEM files); empty: plaintext.
  std::string etcd_ca_file;
  std::string etcd_cert_file;
  std::string etcd_key_file;
};

// Parses mlaserve-server's flags (run `mlaserve-server --help` for the list). Flag names
// take dashes or underscores (`--max-batch` = `--max_batch`), also inside --flagfile files.
// INVALID_ARGUMENT naming the flag for a bad value; unknown flags end the process with
// abseil's usage message, as --help does.
// --devices=auto and --host_threads=auto size the pool from this host's usable CPUs
// (ReadHostResources; engine/devices/pool_sizing.h).
absl::StatusOr<ServerConfig> ParseServerCommandLine(int argc, char** argv);
// The same, sizing the pool for `host` instead of the machine it runs on.
absl::StatusOr<ServerConfig> ParseServerCommandLine(int argc, char** argv,
                                                    const HostResources& host);

// "2GiB", "512MiB", "1.5GiB", "64KiB", "1GB" (decimal), "4096" (bytes). Case-insensitive.
absl::StatusOr<int64_t> ParseByteSize(absl::string_view text);

}  // namespace mlaserve

#endif  // MLASERVE_SERVER_SERVER_FLAGS_H_
