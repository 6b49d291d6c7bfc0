#ifndef MLASERVE_SERVER_ENGINE_KV_CLIENT_ID_H_
#define MLASERVE_SERVER_ENGINE_KV_CLIENT_ID_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace mlaserve::engine {

// Prefix and sequence ids are client-chosen byte strings of 1..kMaxClientIdBytes bytes.
inline constexpr size_t kMaxClientIdBytes = 1024;

// OK for an id within the limits; INVALID_ARGUMENT naming `field` otherwise. Checked before
// any lookup, so an oversized id costs no more than its length check.
absl::Status CheckClientId(absl::string_view field, absl::string_view id);

// The id as error messages quote it: 'id' when short, else its first bytes, an ellipsis and
// its length, so that a message stays readable whatever the client sent.
std::string QuoteId(absl::string_view id);

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_KV_CLIENT_ID_H_
