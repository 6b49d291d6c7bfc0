#include "server/cluster/member_description.h"

#include <cstdint>
#include <utility>

#include "absl/time/clock.h"
#include "kernels/core/kv_dtype.h"

namespace mlaserve::cluster {

std::function<MemberRecord()> DescribeServer(service::MlaServer& server, std::string address,
                                             std::string version) {
  const engine::EngineInfo& info = server.engine().Info();
  MemberRecord base;
  base.instance_id = server.state().instance_id();
  base.address = std::move(address);
  base.version = std::move(version);
  base.model = info.model.name;
  base.layers = info.model.layers;
  base.heads = info.model.heads;
  base.kv_formats = {"bf16", "fp8"};
  base.default_kv_format = KvDtypeName(info.default_kv_dtype);
  base.devices = static_cast<int>(info.devices.size());
  base.device_profile = info.devices.empty() ? "" : info.devices.front().profile;
  base.kv_budget_bytes = info.kv_budget_bytes;
  return [&server, base, last_queries = int64_t{-1}, last_time = absl::Now()]() mutable {
    const engine::EngineStats stats = server.engine().Stats();
    const absl::Time now = absl::Now();
    MemberRecord record = base;
    record.kv_used_bytes = stats.kv.used_bytes;
    record.sequences = stats.kv.sequences;
    record.prefixes = stats.kv.prefixes;
    record.queued_queries = stats.queued;
    const double seconds = absl::ToDoubleSeconds(now - last_time);
    record.queries_per_s =
        last_queries >= 0 && seconds > 0 ? (stats.queries - last_queries) / seconds : 0;
    record.updated_unix_ms = absl::ToUnixMillis(now);
    last_queries = stats.queries;
    last_time = now;
    return record;
  };
}

}  // namespace mlaserve::cluster
