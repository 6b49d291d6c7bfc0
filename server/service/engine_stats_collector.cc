#include "server/service/engine_stats_collector.h"

#include <map>
#include <string>
#include <utility>

#include "server/service/metric_family.h"

namespace mlaserve::service {
namespace {

// The pool's devices: what each is (an info metric), whether it serves, and a GPU's memory by
// use (the rest of its total is the driver's and other processes').
void AddDeviceFamilies(const engine::Engine& engine, const engine::EngineStats& stats,
                       std::vector<prometheus::MetricFamily>& families) {
  using prometheus::MetricType;
  prometheus::MetricFamily info{"mlaserve_device_info",
                                "The pool's devices: kind, profile and, for a GPU, its model, "
                                "SMs, memory and driver",
                                MetricType::Gauge,
                                {}};
  const std::vector<engine::DeviceInfo>& devices = engine.Info().devices;
  for (size_t d = 0; d < devices.size(); ++d) {
    prometheus::ClientMetric metric;
    metric.label = {{"device", std::to_string(d)},
                    {"kind", devices[d].kind},
                    {"profile", devices[d].profile},
                    {"description", devices[d].description}};
    metric.gauge.value = 1;
    info.metric.push_back(std::move(metric));
  }
  families.push_back(std::move(info));
  families.push_back(Family("mlaserve_devices_healthy",
                            "1 while every device serves; 0 once a fault took one out",
                            MetricType::Gauge, "", {{"", engine.Health().ok() ? 1.0 : 0.0}}));
  if (stats.device_memory.empty()) return;
  prometheus::MetricFamily memory{"mlaserve_device_memory_bytes",
                                  "A GPU's memory: total, free, and mlaserve's by use",
                                  MetricType::Gauge,
                                  {}};
  for (const auto& [device, m] : stats.device_memory) {
    for (const auto& [kind, bytes] : {std::pair{"total", m.total_bytes},
                                      {"free", m.free_bytes},
                                      {"weights", m.weights_bytes},
                                      {"kv_pool", m.kv_pool_bytes},
                                      {"expanded", m.expansion_bytes},
                                      {"batch", m.batch_bytes}}) {
      prometheus::ClientMetric metric;
      metric.label = {{"device", std::to_string(device)}, {"kind", kind}};
      metric.gauge.value = static_cast<double>(bytes);
      memory.metric.push_back(std::move(metric));
    }
  }
  families.push_back(std::move(memory));
}

}  // namespace

std::vector<prometheus::MetricFamily> EngineStatsCollector::Collect() const {
  const engine::EngineStats stats = engine_.Stats();
  const engine::KvStoreStats& kv = stats.kv;
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> families;
  families.push_back(Family("mlaserve_kv_pages", "KV cache pages by state", MetricType::Gauge,
                            "state",
                            {{"total", static_cast<double>(kv.pages_total)},
                             {"used", static_cast<double>(kv.pages_used)},
                             {"free", static_cast<double>(kv.pages_free)},
                             {"prefix", static_cast<double>(kv.pages_prefix)},
                             {"sequence", static_cast<double>(kv.pages_sequence)},
                             {"pinned", static_cast<double>(kv.pages_pinned)}}));
  families.push_back(
      Family("mlaserve_kv_bytes",
             "KV cache memory: budget, used, expanded K/V, pool pages resident in RAM",
             MetricType::Gauge, "kind",
             {{"budget", static_cast<double>(kv.budget_bytes)},
              {"used", static_cast<double>(kv.used_bytes)},
              {"expanded", static_cast<double>(kv.expanded_bytes)},
              {"resident", static_cast<double>(int64_t{kv.pages_touched} * kv.page_bytes)}}));
  families.push_back(Family("mlaserve_prefixes",
                            "Prefixes: registered, and released but still referenced",
                            MetricType::Gauge, "state",
                            {{"registered", static_cast<double>(kv.prefixes)},
                             {"retained", static_cast<double>(kv.retained_prefixes)}}));
  families.push_back(Family("mlaserve_sequences", "Live sequences", MetricType::Gauge, "",
                            {{"", static_cast<double>(kv.sequences)}}));
  families.push_back(Family("mlaserve_evictions_total", "LRU evictions under memory pressure",
                            MetricType::Counter, "kind",
                            {{"prefix", static_cast<double>(kv.prefix_evictions)},
                             {"expanded", static_cast<double>(kv.expanded_evictions)}}));
  // The machine, as an info metric (value 1, the facts in labels), so dashboards show which
  // ISA and matrix backend produced the numbers beside it.
  const engine::HostInfo& host = engine_.Info().host;
  prometheus::MetricFamily info;
  info.name = "mlaserve_host_info";
  info.help = "The host CPU, its best matrix ISA and what runs the matrix units";
  info.type = MetricType::Gauge;
  prometheus::ClientMetric metric;
  metric.label = {{"cpu", host.cpu_model}, {"isa", host.isa}, {"matrix_unit", host.matrix_unit}};
  metric.gauge.value = 1;
  info.metric.push_back(std::move(metric));
  families.push_back(std::move(info));
  if (host.sizing.usable_cpus > 0) {
    families.push_back(Family("mlaserve_host_usable_cpus",
                              "CPUs the server may keep busy (affinity cut to the cgroup quota), "
                              "from which the device pool was sized",
                              MetricType::Gauge, "",
                              {{"", static_cast<double>(host.sizing.usable_cpus)}}));
  }
  AddDeviceFamilies(engine_, stats, families);
  families.push_back(Family("mlaserve_decode_queued", "Decode queries waiting to be batched",
                            MetricType::Gauge, "", {{"", static_cast<double>(stats.queued)}}));
  if (tenancy_ != nullptr && tenancy_->mode() != Tenancy::Mode::kSingleTenant) {
    std::vector<Sample> queued, share, kv_bytes, quota, queries, refusals, denials;
    const std::map<std::string, int64_t> quotas = tenancy_->KvQuotas();
    for (const Tenant* t : tenancy_->Known()) {
      queued.push_back({t->name, static_cast<double>(t->queued_queries.load())});
      share.push_back({t->name, static_cast<double>(t->max_queued_queries)});
      const auto used = kv.namespace_used_bytes.find(t->name);
      kv_bytes.push_back({t->name, used == kv.namespace_used_bytes.end()
                                       ? 0.0
                                       : static_cast<double>(used->second)});
      if (const auto q = quotas.find(t->name); q != quotas.end()) {
        quota.push_back({t->name, static_cast<double>(q->second)});
      }
      queries.push_back({t->name, static_cast<double>(t->decode_queries.load())});
      refusals.push_back({t->name, static_cast<double>(t->queue_refusals.load())});
      denials.push_back({t->name, static_cast<double>(t->permission_denials.load())});
    }
    families.push_back(Family("mlaserve_tenant_queued_queries",
                              "Decode queries a tenant has queued or running", MetricType::Gauge,
                              "tenant", std::move(queued)));
    families.push_back(Family("mlaserve_tenant_queue_share_queries",
                              "Decode queries a tenant may have queued or running",
                              MetricType::Gauge, "tenant", std::move(share)));
    families.push_back(Family("mlaserve_tenant_kv_bytes", "Latent KV page bytes a tenant holds",
                              MetricType::Gauge, "tenant", std::move(kv_bytes)));
    families.push_back(Family("mlaserve_tenant_kv_quota_bytes", "A tenant's KV quota",
                              MetricType::Gauge, "tenant", std::move(quota)));
    families.push_back(Family("mlaserve_tenant_decode_queries_total",
                              "Decode queries a tenant had accepted", MetricType::Counter, "tenant",
                              std::move(queries)));
    families.push_back(Family("mlaserve_tenant_queue_refusals_total",
                              "Decode calls refused because the tenant's queue share was full",
                              MetricType::Counter, "tenant", std::move(refusals)));
    families.push_back(Family("mlaserve_tenant_permission_denials_total",
                              "Calls refused for a right the tenant lacks", MetricType::Counter,
                              "tenant", std::move(denials)));
    families.push_back(Family("mlaserve_unauthenticated_total",
                              "Calls refused without known credentials", MetricType::Counter, "",
                              {{"", static_cast<double>(tenancy_->unauthenticated())}}));
  }
  return families;
}

}  // namespace mlaserve::service
