#ifndef MLASERVE_TESTS_TESTING_FAKE_HOST_H_
#define MLASERVE_TESTS_TESTING_FAKE_HOST_H_

#include "common/host_resources.h"

namespace mlaserve::testing {

// A host of `cpus` CPUs on one NUMA node, with a cgroup limit of `quota` CPUs (0: none): what
// the pool-sizing rules read, without the machine's /proc and /sys.
inline HostResources FakeHost(int cpus, double quota = 0) {
  HostResources host;
  host.online_cpus = cpus;
  for (int cpu = 0; cpu < cpus; ++cpu) host.allowed_cpus.push_back(cpu);
  host.numa_nodes = {host.allowed_cpus};
  host.cpu_quota = quota;
  return host;
}

}  // namespace mlaserve::testing

#endif  // MLASERVE_TESTS_TESTING_FAKE_HOST_H_
