#ifndef MLASERVE_COMMON_COMMAND_LINE_H_
#define MLASERVE_COMMON_COMMAND_LINE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace mlaserve {

// The command line with every flag spelled `--name[=value]`, dashes in names turned into
// underscores, and each `--flagfile=PATH` (or `--flagfile PATH`) replaced by the flags in
// that file (one per line; blank lines and lines starting with # are skipped; files may
// name further flagfiles). Values, positional arguments and everything after `--` are kept
// as they are. NOT_FOUND for a flagfile that cannot be read.
absl::StatusOr<std::vector<std::string>> NormalizeFlagArguments(std::vector<std::string> args);

// NormalizeFlagArguments, then abseil's ParseCommandLine (which ends the process on an
// unknown flag or --help, with the usage message). Returns the positional arguments after
// the program name.
absl::StatusOr<std::vector<std::string>> ParseFlags(int argc, char** argv);

}  // namespace mlaserve

#endif  // MLASERVE_COMMON_COMMAND_LINE_H_
