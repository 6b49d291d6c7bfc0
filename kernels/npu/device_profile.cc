#include "kernels/npu/device_profile.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace mlaserve::npu {
namespace {

// One profile parameter: its JSON key, where it lands, and its admissible range.
struct Field {
  const char* key;
  std::function<void(DeviceProfile&, double)> assign;
  double min;
  double max;
};

template <typename T>
Field Member(const char* key, T DeviceProfile::*member, double min, double max) {
  return Field{key, [member](DeviceProfile& p, double v) { p.*member = static_cast<T>(v); }, min,
               max};
}

const std::vector<Field>& Fields() {
  using P = DeviceProfile;
  constexpr double kBig = 1e15;
  static const std::vector<Field>* fields = new std::vector<Field>{
      Member("clock_ghz", &P::clock_ghz, 0.01, 100),
      Member("dies", &P::dies, 1, 64),
      Member("cube_cores", &P::cube_cores, 1, 4096),
      Member("vector_cores_per_cube", &P::vector_cores_per_cube, 2, 2),
      Member("cube_macs_per_cycle", &P::cube_macs_per_cycle, 1, 1 << 20),
      Member("cube_fp8_macs_per_cycle", &P::cube_fp8_macs_per_cycle, 0, 1 << 21),
      Member("mmad_head_cycles", &P::mmad_head_cycles, 0, 1e6),
      Member("hbm_bytes", &P::hbm_bytes, 1 << 20, kBig),
      Member("hbm_bytes_per_cycle", &P::hbm_bytes_per_cycle, 1, 1e7),
      Member("l2_bytes", &P::l2_bytes, 0, kBig),
      Member("l2_bytes_per_cycle", &P::l2_bytes_per_cycle, 1, 1e7),
      Member("l2_line_bytes", &P::l2_line_bytes, 512, 1 << 26),
      Member("l1_bytes", &P::l1_bytes, 1024, 1 << 30),
      Member("l0a_bytes", &P::l0a_bytes, 1024, 1 << 30),
      Member("l0b_bytes", &P::l0b_bytes, 1024, 1 << 30),
      Member("l0c_bytes", &P::l0c_bytes, 1024, 1 << 30),
      Member("ub_bytes", &P::ub_bytes, 1024, 1 << 30),
      Member("l1_alignment", &P::l1_alignment, 1, 4096),
      Member("l0ab_alignment", &P::l0ab_alignment, 1, 4096),
      Member("l0c_alignment", &P::l0c_alignment, 1, 4096),
      Member("ub_alignment", &P::ub_alignment, 1, 4096),
      Member("gm_alignment", &P::gm_alignment, 1, 1 << 20),
      Member("cube_mte2_bytes_per_cycle", &P::cube_mte2_bytes_per_cycle, 0.001, 1e6),
      Member("vector_mte2_bytes_per_cycle", &P::vector_mte2_bytes_per_cycle, 0.001, 1e6),
      Member("mte1_l0a_bytes_per_cycle", &P::mte1_l0a_bytes_per_cycle, 0.001, 1e6),
      Member("mte1_l0b_bytes_per_cycle", &P::mte1_l0b_bytes_per_cycle, 0.001, 1e6),
      Member("fix_bytes_per_cycle", &P::fix_bytes_per_cycle, 0.001, 1e6),
      Member("mte3_bytes_per_cycle", &P::mte3_bytes_per_cycle, 0.001, 1e6),
      Member("gm_read_head_cycles", &P::gm_read_head_cycles, 0, 1e7),
      Member("hbm_miss_extra_cycles", &P::hbm_miss_extra_cycles, 0, 1e7),
      Member("gm_write_head_cycles", &P::gm_write_head_cycles, 0, 1e7),
      Member("mte1_head_cycles", &P::mte1_head_cycles, 0, 1e7),
      Member("fix_head_cycles", &P::fix_head_cycles, 0, 1e7),
      Member("vector_head_cycles", &P::vector_head_cycles, 0, 1e7),
      Member("vector_unary_cycles_per_repeat", &P::vector_unary_cycles_per_repeat, 1, 1e4),
      Member("vector_binary_cycles_per_repeat", &P::vector_binary_cycles_per_repeat, 1, 1e4),
      Member("vector_exp_cycles_per_repeat", &P::vector_exp_cycles_per_repeat, 1, 1e4),
      Member("vector_reduce_cycles_per_repeat", &P::vector_reduce_cycles_per_repeat, 1, 1e4),
      Member("vector_div_cycles_per_repeat", &P::vector_div_cycles_per_repeat, 1, 1e4),
      Member("flag_latency_cycles", &P::flag_latency_cycles, 0, 1e7),
      Member("cross_core_flag_latency_cycles", &P::cross_core_flag_latency_cycles, 0, 1e7),
      Member("launch_overhead_cycles", &P::launch_overhead_cycles, 0, 1e9),
      Member("mix_block_start_cycles", &P::mix_block_start_cycles, 0, 1e9),
      Member("cube_block_start_cycles", &P::cube_block_start_cycles, 0, 1e9),
      Member("vector_launch_overhead_cycles", &P::vector_launch_overhead_cycles, 0, 1e9),
      Member("vector_block_start_cycles", &P::vector_block_start_cycles, 0, 1e9),
      Member("core_prologue_cycles", &P::core_prologue_cycles, 0, 1e9),
  };
  return *fields;
}

absl::StatusOr<std::string> ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open profile ", path.string()));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::filesystem::path> SearchPath() {
  std::vector<std::filesystem::path> dirs;
  if (const char* env = std::getenv("MLASERVE_PROFILE_PATH"); env != nullptr && *env != '\0') {
    for (absl::string_view dir : absl::StrSplit(env, ':', absl::SkipEmpty())) {
      dirs.emplace_back(std::string(dir));
    }
  }
  dirs.emplace_back(MLASERVE_INSTALLED_PROFILE_DIR);
  dirs.emplace_back(MLASERVE_SOURCE_PROFILE_DIR);
  return dirs;
}

}  // namespace

absl::StatusOr<DeviceProfile> ParseDeviceProfile(absl::string_view json_text) {
  const nlohmann::json doc = nlohmann::json::parse(json_text.begin(), json_text.end(), nullptr,
                                                   /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return absl::InvalidArgumentError("profile: not a JSON object");
  }
  DeviceProfile profile;
  if (!doc.contains("name") || !doc["name"].is_string() || doc["name"].get<std::string>().empty()) {
    return absl::InvalidArgumentError("profile: 'name' must be a non-empty string");
  }
  profile.name = doc["name"].get<std::string>();
  if (doc.contains("description") && doc["description"].is_string()) {
    profile.description = doc["description"].get<std::string>();
  }
  if (!doc.contains("parameters") || !doc["parameters"].is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("profile ", profile.name, ": 'parameters' missing"));
  }
  const nlohmann::json& params = doc["parameters"];
  std::set<std::string> known;
  for (const Field& field : Fields()) {
    known.insert(field.key);
    if (!params.contains(field.key)) {
      return absl::InvalidArgumentError(
          absl::StrCat("profile ", profile.name, ": parameter '", field.key, "' is missing"));
    }
    const nlohmann::json& entry = params[field.key];
    if (!entry.is_object() || !entry.contains("value") || !entry["value"].is_number()) {
      return absl::InvalidArgumentError(absl::StrCat("profile ", profile.name, ": parameter '",
                                                     field.key, "' needs a numeric 'value'"));
    }
    if (!entry.contains("origin") || !entry["origin"].is_string() ||
        entry["origin"].get<std::string>().empty()) {
      return absl::InvalidArgumentError(absl::StrCat("profile ", profile.name, ": parameter '",
                                                     field.key, "' needs an 'origin'"));
    }
    const double value = entry["value"].get<double>();
    if (!(value >= field.min && value <= field.max)) {
      return absl::InvalidArgumentError(absl::StrCat("profile ", profile.name, ": parameter '",
                                                     field.key, "' = ", value, " is outside [",
                                                     field.min, ", ", field.max, "]"));
    }
    field.assign(profile, value);
    profile.origins[field.key] = entry["origin"].get<std::string>();
  }
  for (const auto& [key, unused] : params.items()) {
    if (!known.contains(key)) {
      return absl::InvalidArgumentError(
          absl::StrCat("profile ", profile.name, ": unknown parameter '", key, "'"));
    }
  }
  for (int64_t alignment : {profile.l1_alignment, profile.l0ab_alignment, profile.l0c_alignment,
                            profile.ub_alignment, profile.gm_alignment}) {
    if ((alignment & (alignment - 1)) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("profile ", profile.name, ": alignments must be powers of two"));
    }
  }
  return profile;
}

absl::StatusOr<DeviceProfile> LoadDeviceProfile(absl::string_view name_or_path) {
  const std::string spec(name_or_path);
  if (spec.find('/') != std::string::npos || absl::EndsWith(spec, ".json")) {
    ASSIGN_OR_RETURN(std::string text, ReadFile(spec));
    return ParseDeviceProfile(text);
  }
  for (const std::filesystem::path& dir : SearchPath()) {
    const std::filesystem::path candidate = dir / (spec + ".json");
    if (std::filesystem::exists(candidate)) {
      ASSIGN_OR_RETURN(std::string text, ReadFile(candidate));
      return ParseDeviceProfile(text);
    }
  }
  return absl::NotFoundError(absl::StrCat("no device profile named '", spec,
                                          "' (known: ascend910, ascend910-die; or pass a path)"));
}

}  // namespace mlaserve::npu
