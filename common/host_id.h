#ifndef MLASERVE_COMMON_HOST_ID_H_
#define MLASERVE_COMMON_HOST_ID_H_

#include <fstream>
#include <string>

namespace mlaserve {

// This machine's identity for the same-host data plane: the kernel's boot id, the same for
// every process of one boot of one host (containers on it included), new at each boot.
inline std::string HostId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return id;
}

}  // namespace mlaserve

#endif  // MLASERVE_COMMON_HOST_ID_H_
