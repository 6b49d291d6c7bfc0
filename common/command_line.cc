#include "common/command_line.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iostream>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"

namespace mlaserve {
namespace {

constexpr int kMaxFlagfileDepth = 8;

// A token is a flag if it starts with a dash and is not a negative number (a value).
bool IsFlag(absl::string_view arg) {
  return arg.size() > 1 && arg[0] == '-' &&
         !absl::ascii_isdigit(static_cast<unsigned char>(arg[1])) && arg[1] != '.';
}

absl::Status Expand(const std::vector<std::string>& args, size_t first, int depth,
                    std::vector<std::string>& out);

absl::Status ExpandFlagfile(const std::string& path, int depth, std::vector<std::string>& out) {
  if (depth >= kMaxFlagfileDepth) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--flagfile: ", path, ": flagfiles nest deeper than ", kMaxFlagfileDepth, " (a cycle?)"));
  }
  std::ifstream file(path);
  if (!file) return absl::NotFoundError(absl::StrCat("--flagfile: cannot read ", path));
  std::vector<std::string> lines;
  for (std::string line; std::getline(file, line);) {
    absl::string_view trimmed = absl::StripAsciiWhitespace(line);
    if (trimmed.empty() || trimmed[0] == '#') continue;
    lines.emplace_back(trimmed);
  }
  return Expand(lines, 0, depth + 1, out);
}

absl::Status Expand(const std::vector<std::string>& args, size_t first, int depth,
                    std::vector<std::string>& out) {
  for (size_t i = first; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      out.insert(out.end(), args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
      return absl::OkStatus();
    }
    if (!IsFlag(arg)) {
      out.push_back(arg);
      continue;
    }
    absl::string_view body = absl::StripPrefix(absl::StripPrefix(arg, "-"), "-");
    const size_t equals = body.find('=');
    const std::string name = absl::StrReplaceAll(body.substr(0, equals), {{"-", "_"}});
    const bool has_value = equals != absl::string_view::npos;
    if (name == "flagfile") {
      std::string path;
      if (has_value) {
        path = std::string(body.substr(equals + 1));
      } else if (i + 1 < args.size()) {
        path = args[++i];
      } else {
        return absl::InvalidArgumentError("--flagfile: missing a path");
      }
      RETURN_IF_ERROR(ExpandFlagfile(path, depth, out));
      continue;
    }
    out.push_back(has_value ? absl::StrCat("--", name, "=", body.substr(equals + 1))
                            : absl::StrCat("--", name));
  }
  return absl::OkStatus();
}

// Every flag of a normalized command line names a flag the program defines and carries a value
// its type parses, checked before abseil's parser sees it (which would end the process with
// status 1, where the binaries document 2 for a bad flag). A value is the part after `=`,
// or, for a flag that is not a bool, the next argument, as abseil reads it.
absl::Status CheckFlagArguments(const std::vector<std::string>& args) {
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") break;
    if (!IsFlag(arg)) continue;
    absl::string_view body = absl::StripPrefix(absl::StripPrefix(arg, "-"), "-");
    const size_t equals = body.find('=');
    const absl::string_view name = body.substr(0, equals);
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr && equals == absl::string_view::npos && absl::StartsWith(name, "no")) {
      absl::CommandLineFlag* negated = absl::FindCommandLineFlag(name.substr(2));
      if (negated != nullptr && negated->IsOfType<bool>()) continue;  // --noname
    }
    if (flag == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag --", name, " (--help lists the flags)"));
    }
    std::string value;
    if (equals != absl::string_view::npos) {
      value = std::string(body.substr(equals + 1));
    } else if (flag->IsOfType<bool>()) {
      continue;  // --name alone is true
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat("--", name, ": missing a value"));
    }
    // Parsed into the flag here; abseil's parser then sets the same value again.
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, ": ", error));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<std::string>> NormalizeFlagArguments(std::vector<std::string> args) {
  std::vector<std::string> out;
  if (args.empty()) return out;
  out.push_back(args[0]);
  RETURN_IF_ERROR(Expand(args, 1, 0, out));
  return out;
}

std::string FlagsHelp() {
  std::vector<const absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    // abseil's own flags (--flagfile, --fromenv, --help...) are defined in its sources.
    if (absl::StrContains(flag->Filename(), "absl/")) continue;
    flags.push_back(flag);
  }
  std::sort(flags.begin(), flags.end(),
            [](const auto* a, const auto* b) { return a->Name() < b->Name(); });
  std::string out = "Flags (--name=value; dashes and underscores are the same in names):\n";
  for (const absl::CommandLineFlag* flag : flags) {
    absl::StrAppend(&out, "  --", flag->Name(), " (default \"", flag->DefaultValue(), "\")\n      ",
                    flag->Help(), "\n");
  }
  absl::StrAppend(&out,
                  "  --flagfile=PATH\n      read further flags from PATH, one per line (# "
                  "comments)\n  --help, --version\n      print this, or the version, and exit\n");
  return out;
}

std::string VersionLine(const std::string& argv0,
                        const std::function<std::string()>& build_description) {
  std::string line = absl::StrCat(argv0.substr(argv0.rfind('/') + 1), " ", MLASERVE_VERSION);
  if (build_description) absl::StrAppend(&line, " (", build_description(), ")");
  return line;
}

absl::StatusOr<std::vector<std::string>> ParseFlags(
    int argc, char** argv, const std::function<std::string()>& build_description) {
  ASSIGN_OR_RETURN(std::vector<std::string> args,
                   NormalizeFlagArguments(std::vector<std::string>(argv, argv + argc)));
  // abseil 20220623 exits 1 after --help (a script reads that as a failure) and lists only
  // flags defined in a file named after the program, which none of ours is.
  for (const std::string& arg : args) {
    if (arg == "--") break;
    if (arg == "--help" || arg == "--helpfull" || arg == "--helpshort") {
      std::cout << absl::ProgramUsageMessage() << "\n\n" << FlagsHelp();
      std::exit(EXIT_SUCCESS);
    }
    if (arg == "--version") {
      std::cout << VersionLine(args.empty() ? "mlaserve" : args[0], build_description) << "\n";
      std::exit(EXIT_SUCCESS);
    }
  }
  RETURN_IF_ERROR(CheckFlagArguments(args));
  std::vector<char*> normalized;
  for (std::string& arg : args) normalized.push_back(arg.data());
  const std::vector<char*> parsed =
      absl::ParseCommandLine(static_cast<int>(normalized.size()), normalized.data());
  return std::vector<std::string>(parsed.begin() + (parsed.empty() ? 0 : 1), parsed.end());
}

}  // namespace mlaserve
