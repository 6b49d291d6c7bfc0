#include "server/engine/devices/pool_sizing.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace mlaserve::engine {
namespace {

std::string Threads(int n) { return absl::StrCat(n, n == 1 ? " host thread" : " host threads"); }
std::string Devices(int n) { return absl::StrCat(n, n == 1 ? " device" : " devices"); }

}  // namespace

PoolSizing SizePool(const PoolRequest& request, const HostResources& host) {
  PoolSizing sizing;
  const int usable = host.UsableCpus();
  sizing.usable_cpus = usable;
  const std::string from = absl::StrCat("; ", usable, " usable: ", host.Describe());
  if (request.host_device) {
    sizing.devices = 1;
    sizing.host_threads = request.host_threads.value_or(usable);
    sizing.rule = request.host_threads
                      ? absl::StrCat("as given: the host device on ", Threads(sizing.host_threads))
                      : absl::StrCat("auto: the host device on every usable CPU", from);
  } else if (request.devices && request.host_threads) {
    sizing.devices = *request.devices;
    sizing.host_threads = *request.host_threads;
    sizing.rule =
        absl::StrCat("as given: ", Devices(sizing.devices), " x ", Threads(sizing.host_threads));
  } else if (request.devices) {
    sizing.devices = *request.devices;
    sizing.host_threads = std::max(1, usable / sizing.devices);
    sizing.rule = absl::StrCat("as given: ", Devices(sizing.devices),
                               "; auto: ", Threads(sizing.host_threads),
                               " each, the usable CPUs shared out", from);
  } else if (request.host_threads) {
    sizing.host_threads = *request.host_threads;
    sizing.devices = std::max(1, usable / sizing.host_threads);
    sizing.rule =
        absl::StrCat("as given: ", Threads(sizing.host_threads),
                     " a device; auto: ", Devices(sizing.devices), " for the usable CPUs", from);
  } else {
    sizing.devices = usable;
    sizing.host_threads = 1;
    sizing.rule = absl::StrCat("auto: a device of 1 host thread per usable CPU", from);
  }
  sizing.oversubscribed = int64_t{sizing.devices} * sizing.host_threads > usable;
  // Sized from the host, several devices that fit it share its CPUs: one busy device alone
  // runs on the others' too.
  const bool sized_from_host = !(request.devices && request.host_threads);
  if (request.share_cpus && !request.host_device && sized_from_host && sizing.devices > 1 &&
      !sizing.oversubscribed) {
    sizing.shared_cpus = usable;
    sizing.rule +=
        absl::StrCat("; idle devices' CPUs lent to busy ones (", usable, " shared, up to ",
                     Threads(LentThreads(usable, sizing.host_threads)), " a device)");
  }
  return sizing;
}

int LentThreads(int shared_cpus, int host_threads) {
  return std::max(host_threads, std::min(shared_cpus, kMostLentThreads));
}

}  // namespace mlaserve::engine
