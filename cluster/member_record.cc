#include "cluster/member_record.h"

#include <type_traits>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace mlaserve::cluster {

std::string MemberRecord::ToJson() const {
  nlohmann::json json = {
      {"instance_id", instance_id},
      {"address", address},
      {"version", version},
      {"model", {{"name", model}, {"layers", layers}, {"heads", heads}}},
      {"kv_formats", kv_formats},
      {"default_kv_format", default_kv_format},
      {"devices", {{"count", devices}, {"profile", device_profile}}},
      {"kv_budget_bytes", kv_budget_bytes},
      {"load",
       {{"kv_used_bytes", kv_used_bytes},
        {"sequences", sequences},
        {"prefixes", prefixes},
        {"queued_queries", queued_queries},
        {"queries_per_s", queries_per_s},
        {"updated_unix_ms", updated_unix_ms}}},
      {"state", state},
  };
  return json.dump();
}

absl::StatusOr<MemberRecord> ParseMemberRecord(const std::string& text) {
  const nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!json.is_object()) return absl::InvalidArgumentError("member record: not a JSON object");
  // Reads json[path...] into `out` if it has the right type; the error names the path.
  std::string problem;
  auto read = [&](const nlohmann::json& parent, const char* name, const std::string& path,
                  auto& out) {
    if (!problem.empty()) return;
    const auto it = parent.find(name);
    using Out = std::decay_t<decltype(out)>;
    bool fits = false;
    if (it != parent.end()) {
      if constexpr (std::is_same_v<Out, std::string>) {
        fits = it->is_string();
      } else if constexpr (std::is_same_v<Out, double>) {
        fits = it->is_number();
      } else if constexpr (std::is_integral_v<Out>) {
        fits = it->is_number_integer();
      } else {
        fits = it->is_array();
        for (const nlohmann::json& item : *it) fits &= item.is_string();
      }
    }
    if (!fits) {
      problem = absl::StrCat("member record: ", path, " is missing or of the wrong type");
      return;
    }
    out = it->template get<Out>();
  };
  MemberRecord record;
  read(json, "instance_id", "instance_id", record.instance_id);
  read(json, "address", "address", record.address);
  read(json, "version", "version", record.version);
  read(json, "kv_formats", "kv_formats", record.kv_formats);
  read(json, "default_kv_format", "default_kv_format", record.default_kv_format);
  read(json, "kv_budget_bytes", "kv_budget_bytes", record.kv_budget_bytes);
  for (const char* object : {"model", "devices", "load"}) {
    if (problem.empty() && (!json.contains(object) || !json[object].is_object())) {
      problem = absl::StrCat("member record: ", object, " is missing or not an object");
    }
  }
  if (problem.empty()) {
    const nlohmann::json& model = json["model"];
    read(model, "name", "model.name", record.model);
    read(model, "layers", "model.layers", record.layers);
    read(model, "heads", "model.heads", record.heads);
    const nlohmann::json& devices = json["devices"];
    read(devices, "count", "devices.count", record.devices);
    read(devices, "profile", "devices.profile", record.device_profile);
    const nlohmann::json& load = json["load"];
    read(load, "kv_used_bytes", "load.kv_used_bytes", record.kv_used_bytes);
    read(load, "sequences", "load.sequences", record.sequences);
    read(load, "prefixes", "load.prefixes", record.prefixes);
    read(load, "queued_queries", "load.queued_queries", record.queued_queries);
    read(load, "queries_per_s", "load.queries_per_s", record.queries_per_s);
    read(load, "updated_unix_ms", "load.updated_unix_ms", record.updated_unix_ms);
  }
  if (problem.empty() && json.contains("state")) read(json, "state", "state", record.state);
  if (!problem.empty()) return absl::InvalidArgumentError(problem);
  if (record.instance_id.empty()) {
    return absl::InvalidArgumentError("member record: instance_id is empty");
  }
  if (record.address.empty()) return absl::InvalidArgumentError("member record: address is empty");
  return record;
}

std::string MembersPrefix(const std::string& cluster) {
  return absl::StrCat("/mlaserve/", cluster, "/servers/");
}

std::string MemberKey(const std::string& cluster, const std::string& instance_id) {
  return absl::StrCat(MembersPrefix(cluster), instance_id);
}

}  // namespace mlaserve::cluster
