#ifndef MLASERVE_KERNELS_CORE_CPU_FEATURES_H_
#define MLASERVE_KERNELS_CORE_CPU_FEATURES_H_

#include <string>

#include "absl/status/status.h"

namespace mlaserve {

// What the host CPU offers the kernels, read once at run time (cpuid and the OS's saved
// state): machines differ from session to session, so nothing here is assumed at build time.
struct CpuFeatures {
  std::string model;  // the brand string, e.g. "AMD EPYC 9R45"
  int logical_cores = 0;
  bool avx2 = false;
  bool avx512 = false;       // F, BW, VL, with the OS saving the ZMM state
  bool avx512_bf16 = false;  // vdpbf16ps
  bool amx_bf16 = false;     // AMX tiles with bf16, with the OS saving the tile state

  // The best matrix ISA, fastest first: "AMX", "AVX-512 BF16", "AVX-512", "AVX2", or
  // "x86-64" (none of these).
  std::string MatrixIsa() const;
};

const CpuFeatures& HostCpu();

// FAILED_PRECONDITION naming the missing features if this binary was compiled for
// instructions the CPU lacks (a build made elsewhere with -march=native), so a server says
// so at start instead of dying of SIGILL in its first batch.
absl::Status CheckBuildRunsOnThisCpu();

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_CORE_CPU_FEATURES_H_
