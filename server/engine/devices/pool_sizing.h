#ifndef MLASERVE_SERVER_ENGINE_DEVICES_POOL_SIZING_H_
#define MLASERVE_SERVER_ENGINE_DEVICES_POOL_SIZING_H_

#include <optional>
#include <string>

#include "common/host_resources.h"

namespace mlaserve::engine {

// What the command line fixed of a CPU pool (--devices, --host_threads); what it left unset
// is sized from the host.
struct PoolRequest {
  std::optional<int> devices;       // --devices=N; nullopt: --devices=auto
  std::optional<int> host_threads;  // --host_threads=N; nullopt: auto
  bool host_device = false;         // --devices=host: one device computing on the host
  bool share_cpus = true;           // --share_cpus: PoolSizing::shared_cpus may be set
};

struct PoolSizing {
  int devices = 1;
  int host_threads = 1;  // per device
  // The CPUs the devices share (EngineOptions::shared_cpus): the usable CPUs when the pool
  // was sized from the host and fits it (idle devices' CPUs lent to busy ones); 0 when a
  // count was given on both sides, or the pool is the host device.
  int shared_cpus = 0;
  int usable_cpus = 1;  // HostResources::UsableCpus()
  // The rule that chose, in words, for the start-up line and GetServerInfo.
  std::string rule;
  // devices x host_threads exceeds the usable CPUs (only ever as asked).
  bool oversubscribed = false;
};

// The pool for `host` (docs/engine.md, "Sizing the pool"). Left to it, every usable CPU gets
// a device of one host thread: the pool that served make demo's workload best on both
// machines measured (16 x 1 on a 16-core Xeon: 3,941 queries/s, against 1,517 for 2 x 8),
// since batches on separate devices share nothing while one batch's threads still meet at
// every step. Fixed on one side, the other divides the usable CPUs by it (at least 1); the
// host device takes every usable CPU.
PoolSizing SizePool(const PoolRequest& request, const HostResources& host);

// Threads an emulated device runs when the pool shares `shared_cpus` CPUs: enough for a lone
// batch to use them all, at most kMostLentThreads (each thread keeps its own scratch, and a
// launch's cores seldom keep more busy), never fewer than its own `host_threads`.
inline constexpr int kMostLentThreads = 8;
int LentThreads(int shared_cpus, int host_threads);

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_DEVICES_POOL_SIZING_H_
