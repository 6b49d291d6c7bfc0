#ifndef MLASERVE_SERVER_SERVICE_SERVICE_METRICS_H_
#define MLASERVE_SERVER_SERVICE_SERVICE_METRICS_H_

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"
#include "server/engine/engine.h"

namespace mlaserve::service {

// The process as Prometheus' client libraries report it, read now from /proc/self (status,
// stat, fd) and getrlimit: process_resident_memory_bytes, process_virtual_memory_bytes,
// process_threads, process_open_fds, process_max_fds, process_cpu_seconds_total. A value that
// cannot be read is left out rather than reported as 0.
std::vector<prometheus::MetricFamily> ProcessMetricFamilies();

// The server's Prometheus metrics that are observed as things happen (names prefixed
// `mlaserve_`, times in seconds as Prometheus expects). Gauges read from the engine at
// scrape time live in EngineStatsCollector. The registry also reports the process itself at
// scrape time under Prometheus' standard names (process_resident_memory_bytes,
// process_open_fds, process_threads, ...; see ProcessMetricFamilies), which prometheus-cpp
// does not export: a soak run watches them for leaks. Thread-safe.
class ServiceMetrics {
 public:
  ServiceMetrics();
  ServiceMetrics(const ServiceMetrics&) = delete;
  ServiceMetrics& operator=(const ServiceMetrics&) = delete;

  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }

  // One finished RPC (a DecodeStream request counts as one "DecodeStream.request"), by the
  // transport that carried it: "grpc", or a data plane ("shm", "ucx") for a Decode.
  void RecordRpc(absl::string_view rpc, absl::StatusCode code, absl::Duration elapsed,
                 absl::string_view transport = "grpc");
  // One answered decode query: how it was planned and where its time went.
  void RecordDecodeAnswer(const engine::PlanInfo& plan, engine::QuerySpace space);
  // One device batch (EngineOptions::on_batch).
  void RecordBatch(const engine::BatchReport& report);
  // Makes the per-device series of devices 0..count-1 exist at zero, so a dashboard or a
  // rate() sees every device from the first scrape, not from its first batch.
  void AddDevices(int count);
  // One return of freed memory to the kernel (HeapReleaser) and the time it took.
  void RecordHeapRelease(absl::Duration took);

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Histogram>& request_seconds_;
  prometheus::Family<prometheus::Counter>& decode_queries_;
  prometheus::Histogram& queue_seconds_;
  prometheus::Histogram& device_modeled_seconds_;
  prometheus::Histogram& device_host_seconds_;
  prometheus::Histogram& batch_queries_;
  // Once per batch (the decode_ ones above count a batch once per query it holds).
  prometheus::Histogram& batch_device_host_seconds_;
  prometheus::Histogram& batch_device_modeled_seconds_;
  prometheus::Family<prometheus::Counter>& batches_;
  prometheus::Family<prometheus::Counter>& groups_;
  prometheus::Counter& hybrid_groups_;
  prometheus::Counter& absorb_groups_;
  prometheus::Family<prometheus::Counter>& device_modeled_busy_;
  // A GPU's batches: its own time for the launches, and the bytes each sent it.
  prometheus::Histogram& device_kernel_seconds_;
  prometheus::Histogram& batch_bytes_to_device_;
  prometheus::Histogram& batch_kv_bytes_to_device_;
  prometheus::Histogram& batch_query_bytes_in_place_;
  prometheus::Counter& heap_releases_;
  prometheus::Counter& heap_release_seconds_;
};

}  // namespace mlaserve::service

#endif  // MLASERVE_SERVER_SERVICE_SERVICE_METRICS_H_
