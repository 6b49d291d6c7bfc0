#include "client/loadgen/prometheus_text.h"

#include <cmath>
#include <string>

#include "gtest/gtest.h"

namespace mlaserve::loadgen {
namespace {

// What prometheus-cpp's exposer serves, trimmed: HELP/TYPE lines, labelled and unlabelled
// samples, a histogram, a label value holding '}' and an escaped quote, a timestamp, and the
// special values as Prometheus and prometheus-cpp spell them (NaN, -Inf, Nan).
constexpr char kBody[] = R"(# HELP process_resident_memory_bytes Resident memory size in bytes
# TYPE process_resident_memory_bytes gauge
process_resident_memory_bytes 123498496
# HELP process_open_fds Number of open file descriptors
# TYPE process_open_fds gauge
process_open_fds 23
process_threads 1.700000e+01
mlaserve_requests_total{code="OK",rpc="Decode"} 42
mlaserve_host_info{cpu="Weird } \"CPU\"",isa="AVX2"} 1
mlaserve_decode_queue_seconds_bucket{le="+Inf"} 5
mlaserve_decode_queue_seconds_sum 0.25 1700000000000
odd_value NaN
neg_value -Inf
exposer_request_latencies{quantile="0.5"} Nan

)";

TEST(PrometheusTextTest, ParsesSamplesLabelsAndValues) {
  absl::StatusOr<std::vector<PrometheusSample>> s = ParsePrometheusText(kBody);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->size(), 10u);
  EXPECT_EQ(FindSample(*s, "process_resident_memory_bytes"), 123498496.0);
  EXPECT_EQ(FindSample(*s, "process_open_fds"), 23.0);
  EXPECT_EQ(FindSample(*s, "process_threads"), 17.0);
  EXPECT_EQ(FindSample(*s, "mlaserve_decode_queue_seconds_sum"), 0.25);  // timestamp ignored
  EXPECT_TRUE(std::isnan(*FindSample(*s, "odd_value")));
  EXPECT_EQ(FindSample(*s, "neg_value"), -INFINITY);
  // prometheus-cpp's own spelling for a summary's empty quantile.
  EXPECT_TRUE(std::isnan((*s)[9].value));
  // Labelled samples are not taken for the unlabelled name.
  EXPECT_FALSE(FindSample(*s, "mlaserve_requests_total").has_value());
  EXPECT_FALSE(FindSample(*s, "process_max_fds").has_value());
  EXPECT_EQ((*s)[3].labels, R"(code="OK",rpc="Decode")");
  EXPECT_EQ((*s)[4].name, "mlaserve_host_info");
  EXPECT_EQ((*s)[4].labels, R"(cpu="Weird } \"CPU\"",isa="AVX2")");
  EXPECT_EQ((*s)[4].value, 1.0);
  EXPECT_EQ((*s)[5].value, 5.0);
}

TEST(PrometheusTextTest, MalformedLinesAreErrorsNamingTheLine) {
  for (const char* body : {"process_threads\n", "process_threads abc\n", "x{a=\"1\" 3\n",
                           "{a=\"1\"} 3\n", "x 1 2 3\n", "<html>Not Found</html>\n"}) {
    absl::StatusOr<std::vector<PrometheusSample>> s = ParsePrometheusText(body);
    ASSERT_FALSE(s.ok()) << body;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.status().message().find("line 1"), std::string::npos) << s.status();
  }
  EXPECT_TRUE(ParsePrometheusText("").ok());
  EXPECT_TRUE(ParsePrometheusText("# only a comment\n\n").ok());
}

}  // namespace
}  // namespace mlaserve::loadgen
