#include "common/host_resources.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace mlaserve {
namespace {

namespace fs = std::filesystem;

// A file's whole text; nullopt where it does not exist or cannot be read (procfs and sysfs
// files come and go with the kernel's version and configuration).
std::optional<std::string> ReadText(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::Status Unparsable(const fs::path& path, absl::string_view what, absl::string_view text) {
  return absl::InternalError(absl::StrCat("cannot parse ", path.string(), " (", what, "): '",
                                          absl::StripAsciiWhitespace(text), "'"));
}

// The path of a cgroup (as /proc/self/cgroup gives it) below the hierarchy's mount, walked up
// to the mount: the limits of every ancestor apply. A path that is not there (a container
// whose cgroup namespace shows the host's path while its own cgroup is mounted as the root)
// starts at the mount.
std::vector<fs::path> CgroupChain(const fs::path& mount, absl::string_view cgroup_path) {
  fs::path dir = mount;
  const std::string relative(absl::StripPrefix(cgroup_path, "/"));
  std::error_code error;
  if (!relative.empty() && fs::is_directory(mount / relative, error)) dir = mount / relative;
  std::vector<fs::path> chain;
  for (fs::path at = dir;; at = at.parent_path()) {
    chain.push_back(at);
    if (at == mount || !at.has_relative_path() || at == at.parent_path()) break;
  }
  return chain;
}

// The smallest cgroup v2 limit (cpu.max: "max 100000" or "<quota> <period>") on the chain.
absl::StatusOr<double> CgroupV2Quota(const std::vector<fs::path>& chain, std::string& source) {
  double quota = 0;
  for (const fs::path& dir : chain) {
    const fs::path file = dir / "cpu.max";
    std::optional<std::string> text = ReadText(file);
    if (!text) continue;
    std::vector<absl::string_view> fields =
        absl::StrSplit(absl::StripAsciiWhitespace(*text), ' ', absl::SkipEmpty());
    if (fields.size() != 2) return Unparsable(file, "quota and period", *text);
    if (fields[0] == "max") continue;
    double q = 0;
    double period = 0;
    if (!absl::SimpleAtod(fields[0], &q) || !absl::SimpleAtod(fields[1], &period) || q <= 0 ||
        period <= 0) {
      return Unparsable(file, "quota and period", *text);
    }
    if (quota == 0 || q / period < quota) {
      quota = q / period;
      source = file.string();
    }
  }
  return quota;
}

// The same for cgroup v1's cpu controller: cpu.cfs_quota_us (-1: none) over cpu.cfs_period_us.
absl::StatusOr<double> CgroupV1Quota(const std::vector<fs::path>& chain, std::string& source) {
  double quota = 0;
  for (const fs::path& dir : chain) {
    const fs::path quota_file = dir / "cpu.cfs_quota_us";
    std::optional<std::string> quota_text = ReadText(quota_file);
    std::optional<std::string> period_text = ReadText(dir / "cpu.cfs_period_us");
    if (!quota_text || !period_text) continue;
    int64_t q = 0;
    int64_t period = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(*quota_text), &q)) {
      return Unparsable(quota_file, "quota", *quota_text);
    }
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(*period_text), &period) || period <= 0) {
      return Unparsable(dir / "cpu.cfs_period_us", "period", *period_text);
    }
    if (q <= 0) continue;  // -1: unlimited
    const double cpus = static_cast<double>(q) / static_cast<double>(period);
    if (quota == 0 || cpus < quota) {
      quota = cpus;
      source = quota_file.string();
    }
  }
  return quota;
}

// The cgroup's CPU limit from /proc/self/cgroup: the v1 cpu controller's hierarchy where one
// is mounted (also on hybrid systems, whose v2 hierarchy then has no cpu controller), else
// the unified v2 hierarchy.
absl::StatusOr<double> CgroupQuota(const fs::path& root, std::string& source) {
  const fs::path self = root / "proc/self/cgroup";
  std::optional<std::string> text = ReadText(self);
  if (!text) return 0.0;
  const fs::path cgroups = root / "sys/fs/cgroup";
  std::optional<std::string> v2_path;
  for (absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> fields = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (fields.size() != 3) return Unparsable(self, "id:controllers:path", line);
    if (fields[0] == "0" && fields[1].empty()) {
      v2_path = std::string(fields[2]);
      continue;
    }
    std::vector<absl::string_view> controllers = absl::StrSplit(fields[1], ',');
    if (std::find(controllers.begin(), controllers.end(), "cpu") == controllers.end()) continue;
    for (const fs::path& mount :
         {cgroups / std::string(fields[1]), cgroups / "cpu", cgroups / "cpu,cpuacct"}) {
      std::error_code error;
      if (fs::is_directory(mount, error))
        return CgroupV1Quota(CgroupChain(mount, fields[2]), source);
    }
  }
  std::error_code error;
  if (v2_path && fs::exists(cgroups / "cgroup.controllers", error)) {
    return CgroupV2Quota(CgroupChain(cgroups, *v2_path), source);
  }
  return 0.0;
}

absl::StatusOr<std::vector<int>> ReadCpuListFile(const fs::path& file,
                                                 std::optional<std::string> text) {
  if (!text) return std::vector<int>{};
  absl::StatusOr<std::vector<int>> cpus = ParseCpuList(absl::StripAsciiWhitespace(*text));
  if (!cpus.ok()) return Unparsable(file, "CPU list", *text);
  return cpus;
}

// "32K", "1024K", "32M" (sysfs's cache sizes); 0 where unreadable.
int64_t ParseCacheSize(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  int64_t unit = 1;
  if (absl::ConsumeSuffix(&text, "K"))
    unit = int64_t{1} << 10;
  else if (absl::ConsumeSuffix(&text, "M"))
    unit = int64_t{1} << 20;
  else if (absl::ConsumeSuffix(&text, "G"))
    unit = int64_t{1} << 30;
  int64_t value = 0;
  return absl::SimpleAtoi(text, &value) && value > 0 ? value * unit : 0;
}

void ReadCaches(const fs::path& cpu_dir, HostResources& host) {
  std::error_code error;
  fs::directory_iterator it(cpu_dir / "cache", error);
  if (error) return;
  for (const fs::directory_entry& entry : it) {
    if (!absl::StartsWith(entry.path().filename().string(), "index")) continue;
    std::optional<std::string> level = ReadText(entry.path() / "level");
    std::optional<std::string> size = ReadText(entry.path() / "size");
    if (!level || !size) continue;
    const std::string l(absl::StripAsciiWhitespace(*level));
    if (l == "2") host.l2_bytes = ParseCacheSize(*size);
    if (l == "3") host.l3_bytes = ParseCacheSize(*size);
  }
}

std::string Bytes(int64_t bytes) {
  if (bytes >= (int64_t{1} << 20) && bytes % (int64_t{1} << 20) == 0) {
    return absl::StrCat(bytes >> 20, " MiB");
  }
  return absl::StrCat(bytes >> 10, " KiB");
}

}  // namespace

int HostResources::UsableCpus() const {
  int cpus = allowed_cpus.empty() ? online_cpus : static_cast<int>(allowed_cpus.size());
  if (cpu_quota > 0) {
    cpus = std::min(cpus, std::max(1, static_cast<int>(std::floor(cpu_quota + 1e-9))));
  }
  return std::max(cpus, 1);
}

std::string HostResources::Describe() const {
  std::string text = absl::StrCat(
      allowed_cpus.size(), allowed_cpus.size() == 1 ? " CPU (" : " CPUs (",
      FormatCpuList(allowed_cpus),
      static_cast<int>(allowed_cpus.size()) < online_cpus
          ? absl::StrCat(" of ", online_cpus, " online")
          : "",
      "), ", cpu_quota > 0 ? absl::StrFormat("a CPU quota of %.2f", cpu_quota) : "no CPU quota",
      ", ", numa_nodes.size(), numa_nodes.size() == 1 ? " NUMA node" : " NUMA nodes");
  if (l2_bytes > 0) absl::StrAppend(&text, ", L2 ", Bytes(l2_bytes));
  if (l3_bytes > 0) absl::StrAppend(&text, ", L3 ", Bytes(l3_bytes));
  return text;
}

absl::StatusOr<std::vector<int>> ParseCpuList(absl::string_view text) {
  std::vector<int> cpus;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    part = absl::StripAsciiWhitespace(part);
    std::vector<absl::string_view> bounds = absl::StrSplit(part, absl::MaxSplits('-', 1));
    int first = 0;
    int last = 0;
    if (!absl::SimpleAtoi(bounds[0], &first) ||
        !absl::SimpleAtoi(bounds.size() == 2 ? bounds[1] : bounds[0], &last) || first < 0 ||
        last < first || last - first >= (1 << 16)) {
      return absl::InvalidArgumentError(absl::StrCat("'", part, "' is not a CPU or a range"));
    }
    for (int cpu = first; cpu <= last; ++cpu) cpus.push_back(cpu);
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

std::string FormatCpuList(const std::vector<int>& cpus) {
  std::vector<std::string> ranges;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    ranges.push_back(j == i ? absl::StrCat(cpus[i]) : absl::StrCat(cpus[i], "-", cpus[j]));
    i = j + 1;
  }
  return absl::StrJoin(ranges, ",");
}

absl::StatusOr<HostResources> ReadHostResources(const fs::path& root) {
  HostResources host;
  const fs::path online_file = root / "sys/devices/system/cpu/online";
  absl::StatusOr<std::vector<int>> online = ReadCpuListFile(online_file, ReadText(online_file));
  if (!online.ok()) return online.status();
  host.online_cpus = static_cast<int>(online->size());

  const fs::path status_file = root / "proc/self/status";
  if (std::optional<std::string> status = ReadText(status_file)) {
    for (absl::string_view line : absl::StrSplit(*status, '\n')) {
      if (absl::ConsumePrefix(&line, "Cpus_allowed_list:")) {
        absl::StatusOr<std::vector<int>> allowed = ReadCpuListFile(status_file, std::string(line));
        if (!allowed.ok()) return allowed.status();
        host.allowed_cpus = *std::move(allowed);
      }
    }
  }
  if (host.allowed_cpus.empty()) host.allowed_cpus = *online;
  if (host.online_cpus == 0) host.online_cpus = static_cast<int>(host.allowed_cpus.size());
  if (host.allowed_cpus.empty()) {
    return absl::InternalError(absl::StrCat("no CPU found: neither ", online_file.string(), " nor ",
                                            status_file.string(), " names one"));
  }

  absl::StatusOr<double> quota = CgroupQuota(root, host.cpu_quota_source);
  if (!quota.ok()) return quota.status();
  host.cpu_quota = *quota;

  std::error_code error;
  std::vector<fs::path> node_dirs;
  for (fs::directory_iterator it(root / "sys/devices/system/node", error), end; !error && it != end;
       it.increment(error)) {
    const std::string name = it->path().filename().string();
    int id = 0;
    if (absl::StartsWith(name, "node") && absl::SimpleAtoi(name.substr(4), &id)) {
      node_dirs.push_back(it->path());
    }
  }
  std::sort(node_dirs.begin(), node_dirs.end());
  for (const fs::path& dir : node_dirs) {
    absl::StatusOr<std::vector<int>> cpus =
        ReadCpuListFile(dir / "cpulist", ReadText(dir / "cpulist"));
    if (!cpus.ok()) return cpus.status();
    std::vector<int> mine;
    std::set_intersection(cpus->begin(), cpus->end(), host.allowed_cpus.begin(),
                          host.allowed_cpus.end(), std::back_inserter(mine));
    if (!mine.empty()) host.numa_nodes.push_back(std::move(mine));
  }
  if (host.numa_nodes.empty()) host.numa_nodes.push_back(host.allowed_cpus);

  ReadCaches(root / "sys/devices/system/cpu" / absl::StrCat("cpu", host.allowed_cpus.front()),
             host);
  return host;
}

}  // namespace mlaserve
