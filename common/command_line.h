#ifndef MLASERVE_COMMON_COMMAND_LINE_H_
#define MLASERVE_COMMON_COMMAND_LINE_H_

#include <functional>
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

// NormalizeFlagArguments, then abseil's ParseCommandLine. An unknown flag, a flag without its
// value or a value its type does not parse is INVALID_ARGUMENT naming the flag (the
// binaries exit 2 for it, the server 1). `--help` prints the program's usage message
// (absl::SetProgramUsageMessage) and every flag it defines, with its default and meaning,
// to stdout and exits 0; `--version` prints the program's name, mlaserve's version and, when
// given, `build_description()` (the matrix path, say), and exits 0. Returns the positional
// arguments after the program name.
absl::StatusOr<std::vector<std::string>> ParseFlags(
    int argc, char** argv, const std::function<std::string()>& build_description = nullptr);

// What --version prints (without the newline): the program's name (`argv0` without its
// directory), mlaserve's version and, when given, `build_description()` in parentheses, e.g.
// "mlaserve-server 0.1.0 (matrix unit: ...; CPU: ...)". For binaries whose flags another
// parser reads (mlaserve-microbench: google-benchmark's).
std::string VersionLine(const std::string& argv0,
                        const std::function<std::string()>& build_description = nullptr);

// What --help prints after the usage message: each flag the program defines (abseil's own
// are left out), sorted by name.
std::string FlagsHelp();

}  // namespace mlaserve

#endif  // MLASERVE_COMMON_COMMAND_LINE_H_
