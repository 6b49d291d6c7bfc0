#include "server/service/service_metrics.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace mlaserve::service {
namespace {

// 10 us to 10 s: a decode's queue wait is bounded by max_wait (500 us by default), device
// time by the batch, and a whole RPC by the client's deadline.
prometheus::Histogram::BucketBoundaries LatencyBuckets() {
  return {1e-5,   2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2,
          2.5e-2, 5e-2,   0.1,  0.25, 0.5,    1.0,  2.5,  5.0,    10.0};
}

prometheus::Histogram::BucketBoundaries BatchSizeBuckets() {
  return {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};
}

prometheus::Histogram& LatencyHistogram(prometheus::Registry& registry, const std::string& name,
                                        const std::string& help) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(registry).Add(
      {}, LatencyBuckets());
}

}  // namespace

ServiceMetrics::ServiceMetrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      requests_(prometheus::BuildCounter()
                    .Name("mlaserve_requests_total")
                    .Help("Finished RPCs by method and gRPC status code")
                    .Register(*registry_)),
      request_seconds_(prometheus::BuildHistogram()
                           .Name("mlaserve_request_duration_seconds")
                           .Help("Time from receiving an RPC to answering it, by method")
                           .Register(*registry_)),
      decode_queries_(prometheus::BuildCounter()
                          .Name("mlaserve_decode_queries_total")
                          .Help("Answered decode queries by query space and formulation")
                          .Register(*registry_)),
      queue_seconds_(LatencyHistogram(*registry_, "mlaserve_decode_queue_seconds",
                                      "Time a decode query waited to be batched")),
      device_modeled_seconds_(
          LatencyHistogram(*registry_, "mlaserve_decode_device_modeled_seconds",
                           "Modelled device time of the batch that ran a decode query")),
      device_host_seconds_(LatencyHistogram(*registry_, "mlaserve_decode_device_host_seconds",
                                            "Host wall time of the batch that ran a decode query")),
      batch_queries_(prometheus::BuildHistogram()
                         .Name("mlaserve_batch_queries")
                         .Help("Queries per device batch")
                         .Register(*registry_)
                         .Add({}, BatchSizeBuckets())),
      batches_(prometheus::BuildCounter()
                   .Name("mlaserve_batches_total")
                   .Help("Device batches by device and outcome")
                   .Register(*registry_)),
      groups_(prometheus::BuildCounter()
                  .Name("mlaserve_batch_groups_total")
                  .Help("Prefix groups planned, by formulation (the TyphoonMLA decision)")
                  .Register(*registry_)),
      hybrid_groups_(groups_.Add({{"formulation", "hybrid"}})),
      absorb_groups_(groups_.Add({{"formulation", "absorb"}})),
      device_modeled_busy_(prometheus::BuildCounter()
                               .Name("mlaserve_device_modeled_busy_seconds_total")
                               .Help("Modelled busy time per device; its rate is the modelled "
                                     "utilisation")
                               .Register(*registry_)) {}

void ServiceMetrics::RecordRpc(absl::string_view rpc, absl::StatusCode code,
                               absl::Duration elapsed) {
  requests_.Add({{"rpc", std::string(rpc)}, {"code", absl::StatusCodeToString(code)}}).Increment();
  request_seconds_.Add({{"rpc", std::string(rpc)}}, LatencyBuckets())
      .Observe(absl::ToDoubleSeconds(elapsed));
}

void ServiceMetrics::RecordDecodeAnswer(const engine::PlanInfo& plan, engine::QuerySpace space) {
  decode_queries_
      .Add(
          {{"space", space == engine::QuerySpace::kHead ? "head" : "latent"},
           {"formulation", plan.formulation == engine::Formulation::kHybrid ? "hybrid" : "absorb"}})
      .Increment();
  queue_seconds_.Observe(plan.queue_us * 1e-6);
  device_modeled_seconds_.Observe(plan.device_modeled_us * 1e-6);
  device_host_seconds_.Observe(plan.device_host_ms * 1e-3);
}

void ServiceMetrics::RecordBatch(const engine::BatchReport& report) {
  const std::string device = absl::StrCat(report.device);
  batches_.Add({{"device", device}, {"outcome", report.status.ok() ? "ok" : "error"}}).Increment();
  batch_queries_.Observe(report.queries);
  hybrid_groups_.Increment(report.hybrid_groups);
  absorb_groups_.Increment(report.absorb_groups);
  device_modeled_busy_.Add({{"device", device}}).Increment(report.modeled_us * 1e-6);
}

}  // namespace mlaserve::service
