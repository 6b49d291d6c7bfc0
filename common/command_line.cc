#include "common/command_line.h"

#include <fstream>

#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
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

}  // namespace

absl::StatusOr<std::vector<std::string>> NormalizeFlagArguments(std::vector<std::string> args) {
  std::vector<std::string> out;
  if (args.empty()) return out;
  out.push_back(args[0]);
  RETURN_IF_ERROR(Expand(args, 1, 0, out));
  return out;
}

absl::StatusOr<std::vector<std::string>> ParseFlags(int argc, char** argv) {
  ASSIGN_OR_RETURN(std::vector<std::string> args,
                   NormalizeFlagArguments(std::vector<std::string>(argv, argv + argc)));
  std::vector<char*> normalized;
  for (std::string& arg : args) normalized.push_back(arg.data());
  const std::vector<char*> parsed =
      absl::ParseCommandLine(static_cast<int>(normalized.size()), normalized.data());
  return std::vector<std::string>(parsed.begin() + (parsed.empty() ? 0 : 1), parsed.end());
}

}  // namespace mlaserve
