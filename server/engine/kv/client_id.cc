#include "server/engine/kv/client_id.h"

#include "absl/strings/str_cat.h"

namespace mlaserve::engine {
namespace {

// Long enough for the ids frameworks generate (request ids, UUIDs with a suffix).
constexpr size_t kQuotedIdBytes = 64;

}  // namespace

absl::Status CheckClientId(absl::string_view field, absl::string_view id) {
  if (id.empty()) return absl::InvalidArgumentError(absl::StrCat(field, " is empty"));
  if (id.size() > kMaxClientIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " is ", id.size(), " bytes; the limit is ", kMaxClientIdBytes));
  }
  return absl::OkStatus();
}

std::string QuoteId(absl::string_view id) {
  if (id.size() <= kQuotedIdBytes) return absl::StrCat("'", id, "'");
  return absl::StrCat("'", id.substr(0, kQuotedIdBytes), "...' (", id.size(), " bytes)");
}

}  // namespace mlaserve::engine
