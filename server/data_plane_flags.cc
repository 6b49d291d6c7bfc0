#include "server/data_plane_flags.h"

#include <unistd.h>

#include <cstdlib>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

ABSL_FLAG(std::string, data_plane_socket, "auto",
          "The same-host data plane's unix socket: a path, @name (abstract), none, or auto "
          "($RUNTIME_DIRECTORY/data-plane.sock under systemd, else @mlaserve-data-plane-PID)");
ABSL_FLAG(std::string, data_plane_poll_us, "auto",
          "How long the data plane's poller keeps scanning for calls after one arrived or was "
          "answered before it sleeps (clients then wake it through the socket), microseconds; "
          "it never spins while a call runs. auto: 200; 0: never");
ABSL_FLAG(int, data_plane_region_mb, 1024, "Most memory one data-plane client may register, MiB");
ABSL_FLAG(int, data_plane_tenant_mb, 4096,
          "Most memory one tenant's data-plane clients may "
          "register together, MiB");
ABSL_FLAG(int, data_plane_memory_mb, 16384,
          "Most memory all data-plane clients may register together, MiB");

ABSL_FLAG(std::string, data_plane_ucx, "off",
          "The cross-host data plane on UCX: HOST:PORT its listener binds (UCX's TCP sockaddr "
          "connection; RDMA or TCP for the bytes), or off. Clients on other hosts then send "
          "each Decode over UCX (docs/deploy.md, \"Data planes\")");
ABSL_FLAG(bool, data_plane_ucx_trusted_fabric, false,
          "The fabric between this server and its UCX clients is private: UCX does not encrypt, "
          "so with --tls_cert the UCX plane starts only with this set");
ABSL_FLAG(int, data_plane_ucx_call_mb, 256, "Most bytes one call over the UCX plane may take, MiB");
ABSL_FLAG(int, data_plane_ucx_tenant_mb, 1024,
          "Most bytes of one tenant's calls in flight over the UCX plane, MiB");
ABSL_FLAG(int, data_plane_ucx_memory_mb, 4096,
          "Most bytes of all calls in flight over the UCX plane, MiB");

namespace mlaserve {
namespace {

absl::Status BadDataPlaneFlag(absl::string_view flag, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", problem));
}

absl::StatusOr<uint64_t> Mebibytes(absl::string_view flag, int value) {
  if (value < 1) return BadDataPlaneFlag(flag, absl::StrCat(value, " must be positive"));
  return uint64_t{static_cast<unsigned>(value)} << 20;
}

std::string DefaultSocket() {
  if (const char* runtime = std::getenv("RUNTIME_DIRECTORY"); runtime != nullptr && *runtime) {
    const std::string directories(runtime);  // systemd lists them with ':'
    return directories.substr(0, directories.find(':')) + "/data-plane.sock";
  }
  return absl::StrCat("@mlaserve-data-plane-", getpid());
}

}  // namespace

absl::Status ParseDataPlaneFlags(service::ServerOptions& server) {
  const std::string socket = absl::GetFlag(FLAGS_data_plane_socket);
  if (socket.empty())
    return BadDataPlaneFlag("data_plane_socket", "empty; none turns the plane off");
  server.data_plane_socket = socket == "none" ? "" : socket == "auto" ? DefaultSocket() : socket;
  auto& caps = server.data_plane_caps;
  absl::StatusOr<uint64_t> region =
      Mebibytes("data_plane_region_mb", absl::GetFlag(FLAGS_data_plane_region_mb));
  absl::StatusOr<uint64_t> tenant =
      Mebibytes("data_plane_tenant_mb", absl::GetFlag(FLAGS_data_plane_tenant_mb));
  absl::StatusOr<uint64_t> total =
      Mebibytes("data_plane_memory_mb", absl::GetFlag(FLAGS_data_plane_memory_mb));
  for (const auto* parsed : {&region, &tenant, &total}) {
    if (!parsed->ok()) return parsed->status();
  }
  const std::string ucx = absl::GetFlag(FLAGS_data_plane_ucx);
  if (ucx.empty()) return BadDataPlaneFlag("data_plane_ucx", "empty; off turns the plane off");
  server.data_plane_ucx = ucx == "off" ? "" : ucx;
  server.data_plane_ucx_trusted_fabric = absl::GetFlag(FLAGS_data_plane_ucx_trusted_fabric);
  absl::StatusOr<uint64_t> ucx_call =
      Mebibytes("data_plane_ucx_call_mb", absl::GetFlag(FLAGS_data_plane_ucx_call_mb));
  absl::StatusOr<uint64_t> ucx_tenant =
      Mebibytes("data_plane_ucx_tenant_mb", absl::GetFlag(FLAGS_data_plane_ucx_tenant_mb));
  absl::StatusOr<uint64_t> ucx_total =
      Mebibytes("data_plane_ucx_memory_mb", absl::GetFlag(FLAGS_data_plane_ucx_memory_mb));
  for (const auto* parsed : {&ucx_call, &ucx_tenant, &ucx_total}) {
    if (!parsed->ok()) return parsed->status();
  }
  server.data_plane_ucx_caps = {*ucx_call, *ucx_tenant, *ucx_total};
  caps.item_bytes = *region;
  caps.tenant_bytes = *tenant;
  caps.total_bytes = *total;
  const std::string poll = absl::GetFlag(FLAGS_data_plane_poll_us);
  if (poll == "auto") {
    // Long enough for a framework's next call to find the poller awake; it spins only while
    // no call runs, so the devices never share their CPUs with it.
    server.data_plane_poll = absl::Microseconds(200);
    return absl::OkStatus();
  }
  int64_t us = 0;
  if (!absl::SimpleAtoi(poll, &us) || us < 0 || us > 1000000) {
    return BadDataPlaneFlag("data_plane_poll_us",
                            absl::StrCat("'", poll, "' is not auto or 0 to 1000000"));
  }
  server.data_plane_poll = absl::Microseconds(us);
  return absl::OkStatus();
}

}  // namespace mlaserve
