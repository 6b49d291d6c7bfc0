#include "client/loadgen/prometheus_text.h"

#include <cmath>
#include <limits>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace mlaserve::loadgen {
namespace {

bool IsNameChar(char c, bool first) {
  return absl::ascii_isalpha(static_cast<unsigned char>(c)) || c == '_' || c == ':' ||
         (!first && absl::ascii_isdigit(static_cast<unsigned char>(c)));
}

bool ParseValue(absl::string_view text, double& value) {
  // Go's ParseFloat reads the exposition format, so the special values may come in any case:
  // prometheus-cpp writes its summaries' empty quantiles as "Nan". SimpleAtod knows none of
  // "+Inf", "Nan".
  const std::string lower = absl::AsciiStrToLower(text);
  if (lower == "+inf" || lower == "inf") {
    value = std::numeric_limits<double>::infinity();
    return true;
  }
  if (lower == "-inf") {
    value = -std::numeric_limits<double>::infinity();
    return true;
  }
  if (lower == "nan") {
    value = std::numeric_limits<double>::quiet_NaN();
    return true;
  }
  return absl::SimpleAtod(text, &value) && !std::isnan(value);
}

}  // namespace

absl::StatusOr<std::vector<PrometheusSample>> ParsePrometheusText(absl::string_view body) {
  std::vector<PrometheusSample> samples;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(body, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line.front() == '#') continue;
    auto malformed = [&](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat("metrics line ", line_number, " (", line.substr(0, 80), "): ", why));
    };
    size_t end = 0;
    while (end < line.size() && IsNameChar(line[end], end == 0)) ++end;
    if (end == 0) return malformed("no metric name");
    PrometheusSample sample;
    sample.name = std::string(line.substr(0, end));
    absl::string_view rest = line.substr(end);
    if (!rest.empty() && rest.front() == '{') {
      // Label values are quoted and may hold '}' (escaped quotes inside them too).
      size_t i = 1;
      bool quoted = false;
      for (; i < rest.size(); ++i) {
        if (quoted && rest[i] == '\\') {
          ++i;
        } else if (rest[i] == '"') {
          quoted = !quoted;
        } else if (!quoted && rest[i] == '}') {
          break;
        }
      }
      if (i >= rest.size()) return malformed("unterminated labels");
      sample.labels = std::string(rest.substr(1, i - 1));
      rest = rest.substr(i + 1);
    }
    std::vector<absl::string_view> words = absl::StrSplit(rest, ' ', absl::SkipWhitespace());
    if (words.empty() || words.size() > 2)
      return malformed("expected a value and a timestamp at most");
    if (!ParseValue(words[0], sample.value)) return malformed("value is not a number");
    samples.push_back(std::move(sample));
  }
  return samples;
}

std::optional<double> FindSample(const std::vector<PrometheusSample>& samples,
                                 absl::string_view name, absl::string_view labels) {
  for (const PrometheusSample& s : samples) {
    if (s.name == name && s.labels == labels) return s.value;
  }
  return std::nullopt;
}

}  // namespace mlaserve::loadgen
