#include "server/engine/kv/client_id.h"

#include "absl/strings/str_cat.h"

namespace mlaserve::engine {
namespace {

// Long enough for the ids frameworks generate (request ids, UUIDs with a suffix).
constexpr size_t kQuotedIdBytes = 64;

}  // namespace

absl::string_view IdNamespace(absl::string_view id) {
  if (id.empty() || id.front() != kNamespaceMark) return {};
  const size_t end = id.find(kNamespaceMark, 1);
  return end == absl::string_view::npos ? absl::string_view() : id.substr(1, end - 1);
}

absl::string_view ClientPart(absl::string_view id) {
  if (id.empty() || id.front() != kNamespaceMark) return id;
  const size_t end = id.find(kNamespaceMark, 1);
  return end == absl::string_view::npos ? id : id.substr(end + 1);
}

std::string NamespacedId(absl::string_view name, absl::string_view id) {
  if (name.empty()) return std::string(id);
  return absl::StrCat(absl::string_view(&kNamespaceMark, 1), name,
                      absl::string_view(&kNamespaceMark, 1), id);
}

absl::Status CheckClientId(absl::string_view field, absl::string_view full_id) {
  const absl::string_view id = ClientPart(full_id);
  if (id.empty()) return absl::InvalidArgumentError(absl::StrCat(field, " is empty"));
  if (id.size() > kMaxClientIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " is ", id.size(), " bytes; the limit is ", kMaxClientIdBytes));
  }
  return absl::OkStatus();
}

std::string QuoteId(absl::string_view full_id) {
  const absl::string_view id = ClientPart(full_id);
  if (id.size() <= kQuotedIdBytes) return absl::StrCat("'", id, "'");
  return absl::StrCat("'", id.substr(0, kQuotedIdBytes), "...' (", id.size(), " bytes)");
}

}  // namespace mlaserve::engine
