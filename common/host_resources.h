#ifndef MLASERVE_COMMON_HOST_RESOURCES_H_
#define MLASERVE_COMMON_HOST_RESOURCES_H_

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mlaserve {

// What this process may compute on, as the kernel tells it: the CPUs it may run on (its
// affinity mask), the CPU time its cgroup allows, how those CPUs fall into NUMA nodes, and
// the caches of the first of them. A server sizes its device pool from it
// (server/engine/devices/pool_sizing.h); a container's limits count, not the host's cores.
struct HostResources {
  int online_cpus = 0;                       // the machine's online CPUs
  std::vector<int> allowed_cpus;             // the affinity mask, ascending
  double cpu_quota = 0;                      // the cgroup's limit in CPUs (quota / period); 0: none
  std::string cpu_quota_source;              // the file that set it, for the start-up line
  std::vector<std::vector<int>> numa_nodes;  // each node's allowed CPUs; nodes without any left out
  int64_t l2_bytes = 0;  // the first allowed CPU's L2 and L3; 0 where not reported
  int64_t l3_bytes = 0;

  // CPUs this process can keep busy at once: the affinity mask's size, cut to the cgroup's
  // quota rounded down (at least 1), so a pool never plans on CPU time the kernel would
  // throttle away.
  int UsableCpus() const;
  // "2 CPUs (0-1), no CPU quota, 1 NUMA node, L2 1 MiB, L3 32 MiB", for logs and reports.
  std::string Describe() const;
};

// Reads them below `root` ("/" on a live system; a directory laid out the same way in
// tests): /proc/self/status (Cpus_allowed_list), /sys/devices/system/cpu/online,
// /proc/self/cgroup and the cgroup files it leads to (cgroup v2's cpu.max, or v1's
// cpu.cfs_quota_us and cpu.cfs_period_us, the smallest limit from the process's cgroup up to
// the hierarchy's root), /sys/devices/system/node/node*/cpulist and the CPU's cache
// directories. What a kernel does not expose is left at its default (no quota, one NUMA node,
// caches 0); INTERNAL naming the file only for a file that exists but cannot be parsed, and
// for a system that names no CPU at all.
absl::StatusOr<HostResources> ReadHostResources(const std::filesystem::path& root = "/");

// "0-3,8,10-11" (the kernel's CPU list format) -> {0, 1, 2, 3, 8, 10, 11}; an empty list is
// empty. INVALID_ARGUMENT for anything else.
absl::StatusOr<std::vector<int>> ParseCpuList(absl::string_view text);

// The inverse, compressed into ranges: {0, 1, 2, 3, 8} -> "0-3,8".
std::string FormatCpuList(const std::vector<int>& cpus);

}  // namespace mlaserve

#endif  // MLASERVE_COMMON_HOST_RESOURCES_H_
