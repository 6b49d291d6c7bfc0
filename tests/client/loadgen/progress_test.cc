#include "client/loadgen/progress.h"

#include <chrono>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mlaserve::loadgen {
namespace {

using ::testing::HasSubstr;

TEST(ProgressTest, FormatsElapsedCallsRateP99AndErrors) {
  const std::string line = FormatProgress(
      {.elapsed_s = 12, .calls = 340, .queries = 14814, .errors = 2, .p99_ms = 45.214});
  EXPECT_EQ(line, "[  12.0 s] 340 calls, 1234.5 queries/s, p99 45.21 ms, 2 errors");
}

TEST(ProgressTest, TheP99IsOfTheCallsRecordedAndErrorsAreCounted) {
  std::ostringstream out;
  Progress progress(ProgressMode::kQuiet, out);
  for (int i = 1; i <= 1000; ++i) progress.Record(i * 1000.0, 8, /*ok=*/i % 100 != 0);
  const ProgressSnapshot s = progress.Snapshot();
  EXPECT_EQ(s.calls, 1000);
  EXPECT_EQ(s.errors, 10);
  EXPECT_EQ(s.queries, 990 * 8);
  EXPECT_DOUBLE_EQ(s.p99_ms, 991.0);  // the 991st smallest of 1..1000 ms
}

TEST(ProgressTest, PlainLinesWhenNotATerminalAndNothingWhenQuiet) {
  std::ostringstream lines;
  {
    Progress progress(ProgressMode::kLines, lines, absl::Milliseconds(5));  // a line per 50 ms
    progress.Record(2000, 4, true);
    std::this_thread::sleep_for(std::chrono::milliseconds(180));
  }
  const std::vector<std::string> printed = absl::StrSplit(lines.str(), '\n', absl::SkipEmpty());
  ASSERT_GE(printed.size(), 2u) << lines.str();
  EXPECT_THAT(printed.front(), HasSubstr("1 calls"));
  EXPECT_FALSE(absl::StrContains(lines.str(), "\r"));

  std::ostringstream terminal;
  {
    Progress progress(ProgressMode::kTerminal, terminal, absl::Milliseconds(20));
    std::this_thread::sleep_for(std::chrono::milliseconds(90));
  }
  EXPECT_THAT(terminal.str(), HasSubstr("\r\033[K["));
  EXPECT_TRUE(absl::EndsWith(terminal.str(), "\n"));

  std::ostringstream quiet;
  {
    Progress progress(ProgressMode::kQuiet, quiet, absl::Milliseconds(5));
    progress.Record(1000, 1, true);
    std::this_thread::sleep_for(std::chrono::milliseconds(40));
  }
  EXPECT_EQ(quiet.str(), "");
}

}  // namespace
}  // namespace mlaserve::loadgen
