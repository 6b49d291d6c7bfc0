#include "client/loadgen/default_ranks.h"

#include <algorithm>

namespace mlaserve::loadgen {

int DefaultRanks(const v1::GetServerInfoResponse& info) {
  int ranks = 0;
  for (const v1::DeviceInfo& device : info.devices()) {
    ranks += device.kind() == "gpu" ? kRanksPerGpu : 1;
  }
  return std::max(ranks, kMinRanks);
}

}  // namespace mlaserve::loadgen
