#include "client/loadgen/continuous.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/loadgen/continuous_report.h"
#include "gtest/gtest.h"
#include "tests/client/loadgen/fake_load_target.h"

namespace mlaserve::loadgen {
namespace {

ContinuousOptions Options(absl::string_view context, absl::string_view steps,
                          absl::string_view prompts) {
  ContinuousOptions o;
  o.context = *LengthDistribution::Parse(context, "context-dist", 64);
  o.steps = *LengthDistribution::Parse(steps, "steps-dist", 1000);
  o.prompts = *PromptMix::Parse(prompts);
  o.arrivals = *ArrivalProcess::Create(0, 1);
  o.warmup = absl::Milliseconds(100);
  o.duration = absl::Milliseconds(600);
  o.run_id = "test";
  return o;
}

TEST(ContinuousTest, AClosedPopulationKeepsRanksFullAndRetiresSequencesAfterTheirSteps) {
  FakeTarget target(std::chrono::microseconds(500));
  ContinuousOptions o = Options("fixed:4", "fixed:5", "16:1,32:1");
  o.ranks = 2;
  o.sequences = 3;
  absl::StatusOr<ContinuousResult> r = RunContinuous(target, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(target.breaches_.empty()) << absl::StrJoin(target.breaches_, "; ");
  EXPECT_TRUE(target.sequences_.empty()) << "sequences left on the server";
  EXPECT_TRUE(target.prefixes_.empty()) << "prompts left on the server";
  EXPECT_EQ(target.starts_on_.size(), 2u) << "both system prompts used";
  // A rank decodes what it holds, never more than --sequences, in one call per layer.
  EXPECT_LE(*std::max_element(target.batch_sizes_.begin(), target.batch_sizes_.end()), 3);
  int finished = 0;
  for (const SequenceRecord& s : r->sequences) {
    if (s.finished_s < 0) continue;
    ++finished;
    EXPECT_EQ(s.steps, 5);
    // A step is both layers' calls one after another, each at least the decode time.
    EXPECT_GE(s.step_ms_sum / s.steps, 2 * 0.5);
  }
  EXPECT_GT(finished, 10);
  for (const auto& [id, n] : target.steps_by_sequence_) {
    EXPECT_LE(n, 5 * FakeTarget::kLayers) << id << " decoded past its planned steps";
  }
  EXPECT_EQ(static_cast<int>(r->sequences.size()), target.created_);
}

TEST(ContinuousTest, ArrivalsComeAtTheirRateAndWaitForRoom) {
  FakeTarget target(std::chrono::microseconds(200));
  ContinuousOptions o = Options("uniform:1,8", "uniform:2,6", "");
  o.arrivals = *ArrivalProcess::Create(400, 1);
  o.ranks = 2;
  o.sequences = 4;
  o.warmup = absl::ZeroDuration();
  o.duration = absl::Seconds(1);
  absl::StatusOr<ContinuousResult> r = RunContinuous(target, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(target.breaches_.empty()) << absl::StrJoin(target.breaches_, "; ");
  EXPECT_TRUE(target.sequences_.empty());
  // Poisson(400) arrivals in the second: standard deviation 20.
  EXPECT_NEAR(static_cast<double>(r->sequences.size()), 400, 100);
  for (const SequenceRecord& s : r->sequences) {
    ASSERT_GE(s.context_tokens, 1);
    ASSERT_LE(s.context_tokens, 8);
    if (s.admitted_s >= 0) {
      EXPECT_GE(s.admitted_s, s.arrived_s);
    }
  }
  EXPECT_LE(*std::max_element(target.batch_sizes_.begin(), target.batch_sizes_.end()), 4);
}

TEST(ContinuousTest, AFailedCallRetiresTheRanksSequencesAndLeavesNothingOnTheServer) {
  FakeTarget target(std::chrono::microseconds(100));
  target.decode_error = absl::StatusCode::kInternal;
  ContinuousOptions o = Options("fixed:2", "fixed:3", "8");
  o.ranks = 2;
  o.sequences = 2;
  o.warmup = absl::ZeroDuration();
  o.duration = absl::Milliseconds(300);
  absl::StatusOr<ContinuousResult> r = RunContinuous(target, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(target.breaches_.empty()) << absl::StrJoin(target.breaches_, "; ");
  EXPECT_TRUE(target.sequences_.empty());
  EXPECT_TRUE(target.prefixes_.empty());
  const PointSummary p = SummarizePoint(*r, std::nullopt, std::nullopt);
  EXPECT_GT(p.failed_calls, 0);
  EXPECT_EQ(p.failed_calls, p.calls);
  EXPECT_EQ(p.errors.at("INTERNAL"), p.failed_calls);
  EXPECT_EQ(p.finished, 0);
  EXPECT_GT(p.abandoned, 0);
  EXPECT_EQ(p.unfinished, 0);
}

TEST(ContinuousTest, OptionsTheTargetCannotTakeAreRefused) {
  FakeTarget target(std::chrono::microseconds(0));
  ContinuousOptions o = Options("fixed:1", "fixed:1", "");
  o.sequences = FakeTarget::kMaxBatch + 1;
  absl::StatusOr<ContinuousResult> r = RunContinuous(target, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("--sequences"), std::string::npos);
}

// Records made by hand, the summary's figures worked out from them.
ContinuousResult HandMadeResult() {
  ContinuousResult r;
  r.warmup_s = 1;
  r.end_s = 3;  // a 2-second window
  auto sequence = [](double arrived, double admitted, double finished, int steps, double sum) {
    SequenceRecord s;
    s.arrived_s = arrived;
    s.admitted_s = admitted;
    s.finished_s = finished;
    s.steps = steps;
    s.planned_steps = steps;
    s.step_ms_sum = sum;
    return s;
  };
  r.sequences = {
      sequence(0.5, 0.6, 0.9, 2, 20),  // finished before the window: left out
      sequence(0.8, 1.2, 2.0, 4, 40),  // TPOT 10 ms
      sequence(1.5, 1.5, 2.5, 2, 60),  // TPOT 30 ms
      sequence(2.0, 2.5, -1, 1, 5),    // still decoding at the end
      sequence(2.1, 2.2, -1, 1, 5),    // abandoned after a failed call
  };
  r.sequences.back().abandoned = true;
  r.steps = {{0.9, 10, 3}, {1.5, 10, 2}, {2.0, 25, 2}, {2.9, 10, 1}};
  CallRecord ok;
  ok.start_s = 1.1;
  ok.latency_us = 100;
  ok.queries = 2;
  LoadAnswer a;
  a.queue_us = 20;
  a.device_host_us = 50;
  a.hybrid = true;
  LoadAnswer b = a;
  b.hybrid = false;
  ok.answers = {a, b};
  CallRecord failed;
  failed.start_s = 2.0;
  failed.code = absl::StatusCode::kUnavailable;
  CallRecord early = ok;
  early.start_s = 0.5;
  r.calls = {early, ok, failed};
  r.admission_errors = {{0.5, "RESOURCE_EXHAUSTED"},  // before the window
                        {1.5, "RESOURCE_EXHAUSTED"},
                        {2.5, "RESOURCE_EXHAUSTED"}};
  return r;
}

TEST(PointSummaryTest, CountsTheWindowOnlyAndMeasuresGoodputAgainstTheSlo) {
  const PointSummary p = SummarizePoint(HandMadeResult(), 4.0, /*slo_tpot_ms=*/20.0);
  EXPECT_DOUBLE_EQ(p.measured_s, 2);
  EXPECT_EQ(p.arrived, 3);  // at 1.5, 2.0 and 2.1
  EXPECT_EQ(p.abandoned, 1);
  EXPECT_EQ(p.refused_admissions, 2);
  EXPECT_EQ(p.finished, 2);
  EXPECT_EQ(p.unfinished, 1);
  EXPECT_EQ(p.tokens, 2 + 2 + 1);  // the steps ending at 1.5, 2.0 and 2.9
  EXPECT_DOUBLE_EQ(p.tokens_per_s, 5.0 / 2);
  // The two finished (10 and 30 ms) and the one still decoding (one step of 5 ms).
  EXPECT_DOUBLE_EQ(p.tpot_ms.mean, 15);
  EXPECT_EQ(p.tpot_cdf_ms, (std::vector<double>{5, 10, 30}));
  EXPECT_EQ(p.calls, 2);
  EXPECT_EQ(p.failed_calls, 1);
  EXPECT_EQ(p.errors.at("UNAVAILABLE"), 1);
  EXPECT_EQ(p.errors.at("RESOURCE_EXHAUSTED"), 2);
  EXPECT_DOUBLE_EQ(p.queries_per_s, 2.0 / 2);
  EXPECT_DOUBLE_EQ(p.share_queue, 0.2);
  EXPECT_DOUBLE_EQ(p.share_device, 0.5);
  EXPECT_NEAR(p.share_overhead, 0.3, 1e-12);
  EXPECT_DOUBLE_EQ(p.hybrid_fraction, 0.5);
  EXPECT_DOUBLE_EQ(p.goodput_sequences, 2.0 / 3);  // 5 and 10 ms within 20, 30 ms not
  EXPECT_DOUBLE_EQ(p.goodput_tokens, 3.0 / 5);     // the 25 ms step's 2 tokens miss
  EXPECT_DOUBLE_EQ(p.goodput_tokens_per_s, 1.5);
  EXPECT_FALSE(p.slo_met);  // p99 TPOT 30 ms
  EXPECT_TRUE(SummarizePoint(HandMadeResult(), 4.0, 30.0).slo_met);
  EXPECT_FALSE(SummarizePoint(HandMadeResult(), 4.0, std::nullopt).slo_met);
}

PointSummary Point(double value, double tokens_per_s, double p50, double p99,
                   std::optional<double> slo) {
  PointSummary p;
  p.value = value;
  p.tokens_per_s = tokens_per_s;
  p.tpot_ms.p50 = p50;
  p.tpot_ms.p99 = p99;
  p.finished = 10;
  p.slo_tpot_ms = slo;
  p.slo_met = slo.has_value() && p99 <= *slo;
  return p;
}

TEST(SweepTest, TheKneeIsTheBestThroughputWithinTheSlo) {
  const std::vector<PointSummary> points = {Point(1, 100, 5, 8, 20), Point(2, 190, 8, 15, 20),
                                            Point(4, 250, 15, 30, 20), Point(8, 260, 40, 90, 20)};
  std::optional<Knee> knee = FindKnee(points);
  ASSERT_TRUE(knee.has_value());
  EXPECT_EQ(knee->index, 1);
  EXPECT_FALSE(SloLostForGood({points[0], points[1], points[2]}));  // p50 15 ms still within
  EXPECT_FALSE(SloLostForGood({points[2], points[3]}));
  EXPECT_TRUE(SloLostForGood({points[3], Point(16, 255, 80, 200, 20)}));
  // Without an SLO: throughput per ms of p99 TPOT, where 190/15 = 12.7 beats 100/8 = 12.5
  // and 250/30 = 8.3.
  const std::vector<PointSummary> free = {Point(1, 100, 5, 8, {}), Point(2, 190, 8, 15, {}),
                                          Point(4, 250, 15, 30, {})};
  EXPECT_EQ(FindKnee(free)->index, 1);
}

TEST(SweepTest, SpecsParseAndBadOnesNameTheFlag) {
  absl::StatusOr<SweepSpec> rate = SweepSpec::Parse("rate:0.5,1,4");
  ASSERT_TRUE(rate.ok()) << rate.status();
  EXPECT_EQ(rate->values, (std::vector<double>{0.5, 1, 4}));
  ContinuousOptions o = Options("fixed:1", "fixed:1", "");
  EXPECT_DOUBLE_EQ(rate->Apply(o, 4).arrivals.rate(), 4);
  EXPECT_EQ(SweepSpec::Parse("ranks:1,2,3")->Apply(o, 3).ranks, 3);
  EXPECT_EQ(SweepSpec::Parse("sequences:8,16")->Apply(o, 16).sequences, 16);
  for (const char* bad : {"rate", "rate:", "load:1,2", "rate:1,x", "rate:2,1", "ranks:1.5",
                          "sequences:0,4", "rate:-1"}) {
    absl::StatusOr<SweepSpec> s = SweepSpec::Parse(bad);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.status().message().find("--sweep"), std::string::npos) << bad;
  }
}

// One CSV line's fields (RFC 4180: a quoted field may hold commas and doubled quotes).
std::vector<std::string> CsvFields(const std::string& line) {
  std::vector<std::string> fields(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted && c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
      fields.back() += '"';
      ++i;
    } else if (c == '"') {
      quoted = !quoted;
    } else if (c == ',' && !quoted) {
      fields.emplace_back();
    } else {
      fields.back() += c;
    }
  }
  return fields;
}

TEST(SweepTest, TheCsvHasOneRowPerPointWithEveryHeaderColumn) {
  const std::vector<PointSummary> points = {SummarizePoint(HandMadeResult(), 1.0, 20.0),
                                            SummarizePoint(HandMadeResult(), 2.0, 20.0)};
  // The context as main builds it: the client machine, GetServerInfo's flat facts and its
  // whole answer (the instance id is only in the latter). A CPU name with a comma and a quote
  // must stay one field.
  const SweepContext context{
      "cmd",
      {{"cpu", "Acme \"Turbo\" CPU, 2 GHz"}, {"isa", "AVX2"}, {"cores", 2}, {"hostname", "h1"}},
      {{"model", "deepseek-v3"},
       {"layers", 2},
       {"devices", 2},
       {"device", "ascend910-die"},
       {"version", "0.1.0"},
       {"cpu", "Server CPU"},
       {"matrix_unit", "oneDNN avx512"},
       {"info", {{"state", {{"instance_id", "abc123"}}}}}}};
  const std::vector<std::string> lines =
      absl::StrSplit(SweepCsv(context, points), '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u);
  const std::vector<std::string> header = CsvFields(lines[0]);
  EXPECT_EQ(lines[0], SweepCsvHeader());
  for (const std::string& line : lines) {
    EXPECT_EQ(CsvFields(line).size(), header.size()) << line;
  }
  EXPECT_TRUE(absl::StartsWith(lines[1], "1,"));
  const std::map<std::string, std::string> expected = {{"server_version", "0.1.0"},
                                                       {"server_instance_id", "abc123"},
                                                       {"server_model", "deepseek-v3"},
                                                       {"server_layers", "2"},
                                                       {"server_devices", "2"},
                                                       {"server_device", "ascend910-die"},
                                                       {"server_cpu", "Server CPU"},
                                                       {"server_matrix_unit", "oneDNN avx512"},
                                                       {"servers", "1"},
                                                       {"client_cpu", "Acme \"Turbo\" CPU, 2 GHz"},
                                                       {"client_isa", "AVX2"},
                                                       {"client_cores", "2"},
                                                       {"client_hostname", "h1"}};
  for (int row = 1; row <= 2; ++row) {
    const std::vector<std::string> fields = CsvFields(lines[row]);
    for (const auto& [column, value] : expected) {
      const auto at = std::find(header.begin(), header.end(), column);
      ASSERT_NE(at, header.end()) << column << " missing from the header";
      EXPECT_EQ(fields[at - header.begin()], value) << column << " on row " << row;
    }
  }
  // A server whose GetServerInfo failed leaves its columns empty, the row still whole.
  const std::vector<std::string> bare =
      absl::StrSplit(SweepCsv({"cmd", {}, {{"error", "down"}}}, points), '\n', absl::SkipEmpty());
  ASSERT_EQ(bare.size(), 3u);
  EXPECT_EQ(CsvFields(bare[1]).size(), header.size()) << bare[1];

  const SweepSpec spec = *SweepSpec::Parse("rate:1,2");
  const nlohmann::json j =
      SweepJson({"cmd", {{"cpu", "x"}}, {{"model", "m"}}}, &spec, points, false, "");
  EXPECT_EQ(j["schema"], "mlaserve-loadgen-sweep/1");
  EXPECT_EQ(j["points"].size(), 2u);
  EXPECT_EQ(j["sweep"]["variable"], "rate");
  EXPECT_EQ(j["points"][0]["tpot_cdf_ms"].size(), 3u);
}

}  // namespace
}  // namespace mlaserve::loadgen
