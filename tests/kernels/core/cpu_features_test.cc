#include "kernels/core/cpu_features.h"

#include <algorithm>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <string>

#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"

namespace mlaserve {
namespace {

// The kernel's own reading of the CPU (/proc/cpuinfo's first processor), as an independent
// source: its flags are what the kernel decided the CPU and the OS both support.
struct ProcCpuInfo {
  std::string model;
  std::set<std::string> flags;
};

ProcCpuInfo ReadProcCpuInfo() {
  ProcCpuInfo info;
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    const std::vector<std::string> kv = absl::StrSplit(line, absl::MaxSplits(':', 1));
    if (kv.size() != 2) {
      if (!info.flags.empty()) break;  // end of the first processor
      continue;
    }
    const std::string key(absl::StripAsciiWhitespace(kv[0]));
    const std::string value(absl::StripAsciiWhitespace(kv[1]));
    if (key == "model name" && info.model.empty()) info.model = value;
    if (key == "flags") {
      for (absl::string_view f : absl::StrSplit(value, ' ', absl::SkipEmpty()))
        info.flags.insert(std::string(f));
    }
  }
  return info;
}

TEST(CpuFeaturesTest, AgreesWithTheKernelsView) {
  const ProcCpuInfo proc = ReadProcCpuInfo();
  ASSERT_FALSE(proc.flags.empty()) << "no /proc/cpuinfo flags";
  const CpuFeatures& cpu = HostCpu();
  // The model is CPUID's brand string as the processor gives it now. The kernel read its
  // copy at boot, and a virtual machine can be moved to another host since (seen here:
  // "AMD EPYC" in /proc/cpuinfo, "Oxide Virtual Turin-like Processor" from CPUID), so only
  // the ISA must agree; the model must be a readable name.
  ASSERT_FALSE(cpu.model.empty());
  EXPECT_TRUE(std::all_of(cpu.model.begin(), cpu.model.end(), [](char c) {
    return c >= 0x20 && c < 0x7f;
  })) << cpu.model;
  if (cpu.model != proc.model) {
    std::cout << "CPUID brand '" << cpu.model << "', /proc/cpuinfo model name '" << proc.model
              << "'\n";
  }
  EXPECT_EQ(cpu.avx2, proc.flags.contains("avx2"));
  EXPECT_EQ(cpu.avx512, proc.flags.contains("avx512f") && proc.flags.contains("avx512bw") &&
                            proc.flags.contains("avx512vl"));
  EXPECT_EQ(cpu.avx512_bf16, cpu.avx512 && proc.flags.contains("avx512_bf16"));
  EXPECT_EQ(cpu.amx_bf16, proc.flags.contains("amx_bf16") && proc.flags.contains("amx_tile"));
  EXPECT_GE(cpu.logical_cores, 1);
}

TEST(CpuFeaturesTest, NamesTheBestMatrixIsa) {
  CpuFeatures f;
  EXPECT_EQ(f.MatrixIsa(), "x86-64");
  f.avx2 = true;
  EXPECT_EQ(f.MatrixIsa(), "AVX2");
  f.avx512 = true;
  EXPECT_EQ(f.MatrixIsa(), "AVX-512");
  f.avx512_bf16 = true;
  EXPECT_EQ(f.MatrixIsa(), "AVX-512 BF16");
  f.amx_bf16 = true;
  EXPECT_EQ(f.MatrixIsa(), "AMX");
}

TEST(CpuFeaturesTest, ThisBuildRunsHere) { EXPECT_TRUE(CheckBuildRunsOnThisCpu().ok()); }

}  // namespace
}  // namespace mlaserve
