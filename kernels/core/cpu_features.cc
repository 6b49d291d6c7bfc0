#include "kernels/core/cpu_features.h"

#include <cpuid.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace mlaserve {
namespace {

uint64_t Xcr0() {
  uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

CpuFeatures Detect() {
  CpuFeatures f;
  f.logical_cores = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (static_cast<unsigned>(__get_cpuid_max(0x80000000, nullptr)) >= 0x80000004u) {
    char brand[49] = {};
    for (unsigned leaf = 0; leaf < 3; ++leaf) {
      __get_cpuid(0x80000002 + leaf, &a, &b, &c, &d);
      std::memcpy(brand + 16 * leaf, &a, 4);
      std::memcpy(brand + 16 * leaf + 4, &b, 4);
      std::memcpy(brand + 16 * leaf + 8, &c, 4);
      std::memcpy(brand + 16 * leaf + 12, &d, 4);
    }
    f.model = std::string(absl::StripAsciiWhitespace(brand));
  }
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = (c & bit_OSXSAVE) != 0;
  const uint64_t xcr0 = osxsave ? Xcr0() : 0;
  const bool ymm_state = (xcr0 & 0x6) == 0x6;           // SSE and AVX state
  const bool zmm_state = (xcr0 & 0xe6) == 0xe6;         // plus opmask, ZMM_Hi256, Hi16_ZMM
  const bool tile_state = (xcr0 & 0x60000) == 0x60000;  // XTILECFG, XTILEDATA
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid_count(7, 0, a, b, c, d);
  f.avx2 = ymm_state && (b & bit_AVX2) != 0;
  f.avx512 = zmm_state && (b & bit_AVX512F) && (b & bit_AVX512BW) && (b & bit_AVX512VL);
  f.amx_bf16 = tile_state && (d & (1u << 22)) && (d & (1u << 24));  // AMX-BF16, AMX-TILE
  unsigned a1 = 0, b1 = 0, c1 = 0, d1 = 0;
  __cpuid_count(7, 1, a1, b1, c1, d1);
  f.avx512_bf16 = f.avx512 && (a1 & (1u << 5)) != 0;
  return f;
}

}  // namespace

std::string CpuFeatures::MatrixIsa() const {
  if (amx_bf16) return "AMX";
  if (avx512_bf16) return "AVX-512 BF16";
  if (avx512) return "AVX-512";
  if (avx2) return "AVX2";
  return "x86-64";
}

const CpuFeatures& HostCpu() {
  static const CpuFeatures features = Detect();
  return features;
}

absl::Status CheckBuildRunsOnThisCpu() {
  const CpuFeatures& cpu = HostCpu();
  std::vector<std::string> missing;
#if defined(__AVX2__)
  if (!cpu.avx2) missing.push_back("AVX2");
#endif
#if defined(__AVX512F__)
  if (!cpu.avx512) missing.push_back("AVX-512");
#endif
#if defined(__AVX512BF16__)
  if (!cpu.avx512_bf16) missing.push_back("AVX-512 BF16");
#endif
#if defined(__AMX_TILE__)
  if (!cpu.amx_bf16) missing.push_back("AMX");
#endif
  if (missing.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "this binary was built for ", absl::StrJoin(missing, ", "), ", which this CPU (", cpu.model,
      ") lacks; rebuild it on this machine (make build) or configure with -DMLASERVE_NATIVE=OFF"));
}

}  // namespace mlaserve
