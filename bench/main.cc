// mlaserve-bench: the project's measurement tool. One binary, one subcommand per study;
// each prints a table (or JSON lines with --json) and is recorded in docs/performance.md.
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "bench/accuracy_command.h"

ABSL_FLAG(int, seeds, 5, "accuracy: random draws per distribution");
ABSL_FLAG(bool, json, false, "print one JSON object per line instead of a table");

namespace {

constexpr char kUsage[] =
    "mlaserve-bench <command> [flags]\n"
    "commands:\n"
    "  accuracy   AMLA paper accuracy sweep (Base vs AMLA vs fp64 golden)\n";

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2) {
    std::cerr << kUsage;
    return 2;
  }
  const std::string command = args[1];
  absl::Status status;
  if (command == "accuracy") {
    status = mlaserve::bench::RunAccuracyCommand(
        {.seeds = absl::GetFlag(FLAGS_seeds), .json = absl::GetFlag(FLAGS_json)}, std::cout);
  } else {
    std::cerr << "unknown command '" << command << "'\n" << kUsage;
    return 2;
  }
  if (!status.ok()) {
    std::cerr << "mlaserve-bench " << command << ": " << status << "\n";
    return 1;
  }
  return 0;
}
