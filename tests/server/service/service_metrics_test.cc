// The edge's metrics over a mocked engine: batch reports and engine stats as series, and
// every counter present from the start.

#include <set>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/metric_family.h"
#include "server/service/engine_stats_collector.h"
#include "tests/server/service/mla_serve_service_fixture.h"

namespace mlaserve::service {
namespace {

using testing::MlaServeServiceTest;
using ::testing::Return;

TEST_F(MlaServeServiceTest, BatchReportsAndEngineStatsBecomeMetrics) {
  ASSERT_TRUE(on_batch_);
  engine::BatchReport report;
  report.device = 1;
  report.queries = 40;
  report.hybrid_groups = 2;
  report.absorb_groups = 3;
  report.modeled_us = 500;
  on_batch_(report);
  EXPECT_EQ(CounterValue("mlaserve_batch_groups_total", {{"formulation", "hybrid"}}), 2);
  EXPECT_EQ(CounterValue("mlaserve_batch_groups_total", {{"formulation", "absorb"}}), 3);
  EXPECT_EQ(CounterValue("mlaserve_batches_total", {{"device", "1"}, {"outcome", "ok"}}), 1);
  EXPECT_DOUBLE_EQ(CounterValue("mlaserve_device_modeled_busy_seconds_total", {{"device", "1"}}),
                   500e-6);

  engine::EngineStats stats;
  stats.kv.pages_used = 17;
  stats.kv.sequences = 5;
  stats.queued = 3;
  EXPECT_CALL(*engine_, Stats()).WillOnce(Return(stats));
  const EngineStatsCollector collector(*engine_);
  double pages_used = -1, sequences = -1, queued = -1;
  for (const prometheus::MetricFamily& family : collector.Collect()) {
    for (const prometheus::ClientMetric& metric : family.metric) {
      if (family.name == "mlaserve_kv_pages" && metric.label[0].value == "used") {
        pages_used = metric.gauge.value;
      }
      if (family.name == "mlaserve_sequences") sequences = metric.gauge.value;
      if (family.name == "mlaserve_decode_queued") queued = metric.gauge.value;
    }
  }
  EXPECT_EQ(pages_used, 17);
  EXPECT_EQ(sequences, 5);
  EXPECT_EQ(queued, 3);
}

// A counter's series exist before anything is counted (Prometheus' convention: rate() over
// a series that appears at 1 misses that first call): every RPC with code OK, every decode
// query space and formulation.
TEST(ServiceMetricsTest, CountersArePresentFromTheStart) {
  ServiceMetrics metrics;
  std::set<std::string> rpcs;
  int decode_series = 0;
  for (const prometheus::MetricFamily& family : metrics.registry()->Collect()) {
    for (const prometheus::ClientMetric& metric : family.metric) {
      if (family.name == "mlaserve_requests_total") {
        ASSERT_EQ(metric.label.size(), 3u);
        EXPECT_EQ(metric.label[0].name, "code");
        EXPECT_EQ(metric.label[0].value, "OK");
        rpcs.insert(metric.label[1].value);
        EXPECT_EQ(metric.label[2].name, "transport");
        EXPECT_EQ(metric.label[2].value, "grpc");
        EXPECT_EQ(metric.counter.value, 0);
      }
      if (family.name == "mlaserve_decode_queries_total") {
        ++decode_series;
        EXPECT_EQ(metric.counter.value, 0);
      }
    }
  }
  for (const char* rpc : {"Decode", "DecodeStream", "AppendKv", "CreateSequence", "GetServerInfo",
                          "ListSequences", "RegisterPrefix", "ReleaseSequence", "OpenDataPlane"}) {
    EXPECT_TRUE(rpcs.count(rpc)) << rpc;
  }
  EXPECT_EQ(decode_series, 4);
}

}  // namespace
}  // namespace mlaserve::service
