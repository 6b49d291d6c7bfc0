#include "client/loadgen/sweep_output.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "kernels/core/cpu_features.h"

namespace mlaserve::loadgen {

nlohmann::json ClientMachine() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return {{"cpu", mlaserve::HostCpu().model},
          {"isa", mlaserve::HostCpu().MatrixIsa()},
          {"cores", std::thread::hardware_concurrency()},
          {"hostname", host}};
}

absl::Status PrepareSweepOutput(const std::string& out) {
  const std::filesystem::path folder = std::filesystem::path(out).parent_path();
  std::error_code error;
  if (!folder.empty()) std::filesystem::create_directories(folder, error);
  if (error) {
    return absl::InvalidArgumentError(
        absl::StrCat("--out: cannot create the folder ", folder.string(), ": ", error.message()));
  }
  const std::string where = folder.empty() ? "." : folder.string();
  for (const std::string& file : {out + ".json", out + ".csv"}) {
    const bool exists = std::filesystem::exists(file, error);
    if (access(exists ? file.c_str() : where.c_str(), W_OK) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--out: cannot write ", file, ": ", std::strerror(errno)));
    }
  }
  return absl::OkStatus();
}

}  // namespace mlaserve::loadgen
