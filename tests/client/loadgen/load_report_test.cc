#include "client/loadgen/load_report.h"

#include <sstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mlaserve::loadgen {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string ReportOf(const LoadResult& result) {
  std::ostringstream out;
  PrintReport(result, Summarize(result), "127.0.0.1:1", out);
  return out.str();
}

LoadResult ARun(std::optional<KvDtype> asked, std::optional<KvDtype> server_default) {
  LoadResult result;
  result.model = TargetModel{"deepseek-v3", 2, 128, 128, 64, 512, 256, server_default};
  result.options.kv_dtype = asked;
  return result;
}

// `make demo KV_DTYPE=fp8` sets the server's default and leaves the load generator's
// --kv-dtype empty: the report names the format the run was really held in.
TEST(LoadReportTest, AnUnaskedFormatIsNamedFromTheServersDefault) {
  const LoadResult fp8_server = ARun(std::nullopt, KvDtype::kFp8);
  EXPECT_THAT(ReportOf(fp8_server), HasSubstr("KV fp8 (the server's default)"));
  EXPECT_EQ(ToJson(fp8_server, Summarize(fp8_server))["kv_dtype"], "fp8");

  const LoadResult bf16_server = ARun(std::nullopt, KvDtype::kBf16);
  EXPECT_THAT(ReportOf(bf16_server), HasSubstr("KV bf16 (the server's default)"));
}

TEST(LoadReportTest, AnAskedFormatIsNamedAsAsked) {
  const std::string report = ReportOf(ARun(KvDtype::kFp8, KvDtype::kBf16));
  EXPECT_THAT(report, HasSubstr("KV fp8,"));
  EXPECT_THAT(report, Not(HasSubstr("server's default")));
}

TEST(LoadReportTest, AServerThatDoesNotSayIsReportedSo) {
  EXPECT_THAT(ReportOf(ARun(std::nullopt, std::nullopt)),
              HasSubstr("KV in the server's default format"));
}

}  // namespace
}  // namespace mlaserve::loadgen
