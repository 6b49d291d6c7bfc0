#include "bench/host_description.h"

#include "absl/strings/str_format.h"
#include "kernels/core/cpu_features.h"
#include "kernels/core/matmul.h"

namespace mlaserve::bench {

std::string HostDescription() {
  const CpuFeatures& cpu = HostCpu();
  return absl::StrFormat("host: %s (%d logical cores), ISA %s, matrix unit on %s", cpu.model,
                         cpu.logical_cores, cpu.MatrixIsa(), MatrixUnitBackend());
}

}  // namespace mlaserve::bench
