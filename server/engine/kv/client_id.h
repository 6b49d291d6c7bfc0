#ifndef MLASERVE_SERVER_ENGINE_KV_CLIENT_ID_H_
#define MLASERVE_SERVER_ENGINE_KV_CLIENT_ID_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace mlaserve::engine {

// Prefix and sequence ids are client-chosen byte strings of 1..kMaxClientIdBytes bytes.
inline constexpr size_t kMaxClientIdBytes = 1024;

// Tenants (server/service/tenancy.h) each have a namespace of ids: the edge stores a
// tenant's id as kNamespaceMark, the tenant's name, kNamespaceMark, then the id. 0xff never
// occurs in UTF-8, and ids travel as proto3 strings, which must be UTF-8, so no client can
// send an id that reaches into a namespace, its own or another's.
inline constexpr char kNamespaceMark = '\xff';
// The namespace an id lives in ("" for none) and the client's own part of it.
absl::string_view IdNamespace(absl::string_view id);
absl::string_view ClientPart(absl::string_view id);
// `id` in namespace `name` ("" returns `id` as it is).
std::string NamespacedId(absl::string_view name, absl::string_view id);

// OK for an id whose client part is within the limits; INVALID_ARGUMENT naming `field`
// otherwise. Checked before any lookup, so an oversized id costs no more than its length
// check.
absl::Status CheckClientId(absl::string_view field, absl::string_view id);

// The id as error messages quote it (its client part: a tenant never reads a namespace):
// 'id' when short, else its first bytes, an ellipsis and its length, so that a message stays
// readable whatever the client sent.
std::string QuoteId(absl::string_view id);

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_KV_CLIENT_ID_H_
