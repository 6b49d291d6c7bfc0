#include "server/service/service_metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/heap_usage.h"
#include "google/protobuf/descriptor.h"
#include "mlaserve/v1/mlaserve.pb.h"

namespace mlaserve::service {
namespace {

// 10 us to 10 s: a decode's queue wait is bounded by max_wait (500 us by default), device
// time by the batch, and a whole RPC by the client's deadline.
prometheus::Histogram::BucketBoundaries LatencyBuckets() {
  return {1e-5,   2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2,
          2.5e-2, 5e-2,   0.1,  0.25, 0.5,    1.0,  2.5,  5.0,    10.0};
}

// 1 KiB to 1 GiB by factors of 4: a step's query bytes up to a long prompt's registration.
prometheus::Histogram::BucketBoundaries ByteBuckets() {
  prometheus::Histogram::BucketBoundaries buckets;
  for (double b = 1024; b <= double{1 << 30}; b *= 4) buckets.push_back(b);
  return buckets;
}

prometheus::Histogram& ByteHistogram(prometheus::Registry& registry, const std::string& name,
                                     const std::string& help) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(registry).Add({},
                                                                                   ByteBuckets());
}

prometheus::Histogram::BucketBoundaries BatchSizeBuckets() {
  return {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};
}

prometheus::Histogram& LatencyHistogram(prometheus::Registry& registry, const std::string& name,
                                        const std::string& help) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(registry).Add(
      {}, LatencyBuckets());
}

std::optional<double> StatusField(const std::string& status, absl::string_view field) {
  for (absl::string_view line : absl::StrSplit(status, '\n')) {
    if (!absl::ConsumePrefix(&line, field) || !absl::ConsumePrefix(&line, ":")) continue;
    // "VmRSS:\t  123456 kB" or "Threads:\t17".
    std::vector<absl::string_view> words = absl::StrSplit(line, ' ', absl::SkipWhitespace());
    if (words.empty()) return std::nullopt;
    double value = 0;
    if (!absl::SimpleAtod(absl::StripAsciiWhitespace(words[0]), &value)) return std::nullopt;
    if (words.size() > 1 && words[1] == "kB") value *= 1024;
    return value;
  }
  return std::nullopt;
}

std::optional<double> OpenFds() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return std::nullopt;
  double count = 0;
  while (const dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  closedir(dir);
  // The listing includes the descriptor opendir itself held, which is not the server's.
  return count - 1;
}

// utime + stime of /proc/self/stat (fields 14 and 15, counted after the command name, which
// may hold spaces and so is skipped through its closing parenthesis).
std::optional<double> CpuSeconds() {
  std::ifstream in("/proc/self/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return std::nullopt;
  std::istringstream fields(stat.substr(paren + 1));
  std::string field;
  double utime = 0, stime = 0;
  // After ')': state is field 3, so utime (14) is the 12th word and stime (15) the 13th.
  for (int i = 3; i <= 15 && (fields >> field); ++i) {
    if (i == 14 && !absl::SimpleAtod(field, &utime)) return std::nullopt;
    if (i == 15 && !absl::SimpleAtod(field, &stime)) return std::nullopt;
  }
  const long ticks = sysconf(_SC_CLK_TCK);
  if (ticks <= 0) return std::nullopt;
  return (utime + stime) / static_cast<double>(ticks);
}

void AddFamily(std::vector<prometheus::MetricFamily>& families, std::string name, std::string help,
               prometheus::MetricType type, std::optional<double> value) {
  if (!value.has_value()) return;
  prometheus::MetricFamily family;
  family.name = std::move(name);
  family.help = std::move(help);
  family.type = type;
  prometheus::ClientMetric metric;
  if (type == prometheus::MetricType::Counter) {
    metric.counter.value = *value;
  } else {
    metric.gauge.value = *value;
  }
  family.metric.push_back(std::move(metric));
  families.push_back(std::move(family));
}

// The service's registry plus the process families, read at each scrape (the server's wiring
// registers only the registry with the exposer, and the process metrics must be current).
class RegistryWithProcessMetrics final : public prometheus::Registry {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> families = prometheus::Registry::Collect();
    for (prometheus::MetricFamily& family : ProcessMetricFamilies()) {
      families.push_back(std::move(family));
    }
    return families;
  }
};

}  // namespace

std::vector<prometheus::MetricFamily> ProcessMetricFamilies() {
  std::string status;
  {
    // Closed before the descriptors are counted, so the count does not include it.
    std::ifstream in("/proc/self/status");
    status.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  std::optional<double> max_fds;
  if (rlimit limit{}; getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    max_fds = static_cast<double>(limit.rlim_cur);
  }
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> families;
  AddFamily(families, "process_resident_memory_bytes", "Resident memory size in bytes",
            MetricType::Gauge, StatusField(status, "VmRSS"));
  AddFamily(families, "process_virtual_memory_bytes", "Virtual memory size in bytes",
            MetricType::Gauge, StatusField(status, "VmSize"));
  AddFamily(families, "process_threads", "Number of OS threads in the process", MetricType::Gauge,
            StatusField(status, "Threads"));
  AddFamily(families, "process_open_fds", "Number of open file descriptors", MetricType::Gauge,
            OpenFds());
  AddFamily(families, "process_max_fds", "Maximum number of open file descriptors",
            MetricType::Gauge, max_fds);
  AddFamily(families, "process_cpu_seconds_total", "Total user and system CPU time in seconds",
            MetricType::Counter, CpuSeconds());
  const std::optional<HeapUsage> heap = ReadHeapUsage();
  AddFamily(families, "mlaserve_heap_in_use_bytes",
            "Bytes the allocator has handed out and not had back (glibc mallinfo2)",
            MetricType::Gauge, heap ? std::optional(heap->in_use_bytes) : std::nullopt);
  AddFamily(families, "mlaserve_heap_free_bytes",
            "Bytes freed but kept by the allocator's arenas, resident or not (glibc mallinfo2)",
            MetricType::Gauge, heap ? std::optional(heap->free_bytes) : std::nullopt);
  return families;
}

ServiceMetrics::ServiceMetrics()
    : registry_(std::make_shared<RegistryWithProcessMetrics>()),
      requests_(
          prometheus::BuildCounter()
              .Name("mlaserve_requests_total")
              .Help("Finished RPCs by method, gRPC status code and transport (grpc, shm, ucx)")
              .Register(*registry_)),
      request_seconds_(
          prometheus::BuildHistogram()
              .Name("mlaserve_request_duration_seconds")
              .Help("Time from receiving an RPC to answering it, by method and transport")
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
      batch_device_host_seconds_(
          LatencyHistogram(*registry_, "mlaserve_batch_device_host_seconds",
                           "Host wall time of a device batch's work, once per batch")),
      batch_device_modeled_seconds_(
          LatencyHistogram(*registry_, "mlaserve_batch_device_modeled_seconds",
                           "Modelled device time of a device batch, once per batch")),
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
                               .Register(*registry_)),
      device_kernel_seconds_(
          LatencyHistogram(*registry_, "mlaserve_device_kernel_seconds",
                           "A GPU's own time for a batch's launches (CUDA events), per batch")),
      batch_bytes_to_device_(ByteHistogram(
          *registry_, "mlaserve_batch_bytes_to_device",
          "Bytes a GPU batch copied to the device: queries, written KV rows, job records")),
      batch_kv_bytes_to_device_(ByteHistogram(
          *registry_, "mlaserve_batch_kv_bytes_to_device",
          "KV rows among them: those appended or registered since the previous batch")),
      batch_query_bytes_in_place_(ByteHistogram(
          *registry_, "mlaserve_batch_query_bytes_in_place",
          "Query bytes a GPU batch read from a data plane's mapped region instead of copying")),
      heap_releases_(prometheus::BuildCounter()
                         .Name("mlaserve_heap_releases_total")
                         .Help("Times freed memory was handed back to the kernel (malloc_trim)")
                         .Register(*registry_)
                         .Add({})),
      heap_release_seconds_(prometheus::BuildCounter()
                                .Name("mlaserve_heap_release_seconds_total")
                                .Help("Time spent handing freed memory back to the kernel")
                                .Register(*registry_)
                                .Add({})) {
  // Counters with the label values they will have are present from the first scrape, so that
  // rate() and increase() see a call's first increment instead of a series appearing at 1.
  // mlaserve.proto declares only the service, so nothing else refers to its generated code:
  // without this use a static link would leave that out, and with it the descriptor that
  // server reflection also describes the service from.
  const google::protobuf::FileDescriptor* file =
      google::protobuf::DescriptorPool::generated_pool()->FindFileByName(
          descriptor_table_mlaserve_2fv1_2fmlaserve_2eproto.filename);
  const google::protobuf::ServiceDescriptor* service =
      file != nullptr && file->service_count() == 1 ? file->service(0) : nullptr;
  for (int i = 0; service != nullptr && i < service->method_count(); ++i) {
    requests_.Add({{"rpc", service->method(i)->name()}, {"code", "OK"}, {"transport", "grpc"}});
  }
  for (const char* space : {"head", "latent"}) {
    for (const char* formulation : {"hybrid", "absorb"}) {
      decode_queries_.Add({{"space", space}, {"formulation", formulation}});
    }
  }
}

void ServiceMetrics::RecordHeapRelease(absl::Duration took) {
  heap_releases_.Increment();
  heap_release_seconds_.Increment(absl::ToDoubleSeconds(took));
}

void ServiceMetrics::RecordRpc(absl::string_view rpc, absl::StatusCode code, absl::Duration elapsed,
                               absl::string_view transport) {
  requests_
      .Add({{"rpc", std::string(rpc)},
            {"code", absl::StatusCodeToString(code)},
            {"transport", std::string(transport)}})
      .Increment();
  request_seconds_
      .Add({{"rpc", std::string(rpc)}, {"transport", std::string(transport)}}, LatencyBuckets())
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
  if (report.status.ok()) {
    batch_device_host_seconds_.Observe(report.host_ms * 1e-3);
    batch_device_modeled_seconds_.Observe(report.modeled_us * 1e-6);
  }
  hybrid_groups_.Increment(report.hybrid_groups);
  absorb_groups_.Increment(report.absorb_groups);
  device_modeled_busy_.Add({{"device", device}}).Increment(report.modeled_us * 1e-6);
  if (report.status.ok() && report.device_us > 0) {
    device_kernel_seconds_.Observe(report.device_us * 1e-6);
    batch_bytes_to_device_.Observe(static_cast<double>(report.bytes_to_device));
    batch_kv_bytes_to_device_.Observe(static_cast<double>(report.kv_bytes_to_device));
    batch_query_bytes_in_place_.Observe(static_cast<double>(report.query_bytes_in_place));
  }
}

void ServiceMetrics::AddDevices(int count) {
  for (int d = 0; d < count; ++d) {
    const std::string device = absl::StrCat(d);
    for (const char* outcome : {"ok", "error"}) {
      batches_.Add({{"device", device}, {"outcome", outcome}});
    }
    device_modeled_busy_.Add({{"device", device}});
  }
}

}  // namespace mlaserve::service
