#ifndef MLASERVE_SERVER_SERVICE_TENANCY_H_
#define MLASERVE_SERVER_SERVICE_TENANCY_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/server_context.h"

namespace mlaserve::service {

// What a tenant may call (docs/api.md, "Tenants").
enum TenantRight : int {
  kRead = 1,    // GetServerInfo, GetSequence, ListPrefixes, ListSequences, GetStats
  kWrite = 2,   // RegisterPrefix, ReleasePrefix, CreateSequence, ForkSequence,
                // ReleaseSequence, AppendKv, and a Decode query that carries an append
  kDecode = 4,  // Decode, DecodeStream
  kAllRights = kRead | kWrite | kDecode,
};

// One tenant: its own namespace of prefix and sequence ids (engine/kv/client_id.h), its KV
// quota (held by the KV store), its share of the decode queue (held here) and its rights.
struct Tenant {
  std::string name;
  int rights = kAllRights;
  // Queries it may have queued or running at once; past it a Decode is UNAVAILABLE.
  int64_t max_queued_queries = 0;
  std::atomic<int64_t> queued_queries{0};
  // For /metrics (mlaserve_tenant_*).
  std::atomic<int64_t> decode_queries{0};  // accepted into the queue
  std::atomic<int64_t> queue_refusals{0};  // Decode calls refused: its share was full
  std::atomic<int64_t> permission_denials{0};

  // Takes room for `n` queries in the tenant's share, or says no.
  bool TryQueue(int64_t n);
  void Unqueue(int64_t n) { queued_queries.fetch_sub(n, std::memory_order_relaxed); }
};

// How callers are told apart (docs/deploy.md, "Tenants"):
//   * a tokens file (--auth_tokens_file): every call carries `authorization: Bearer TOKEN`,
//     whose SHA-256 the file maps to a tenant; under mutual TLS a tenant may instead be
//     named by its client certificate's common name. Anything else is UNAUTHENTICATED;
//   * mutual TLS without a file: each client certificate's common name is a tenant, with the
//     default share and no quota but the global budget;
//   * neither: one tenant that every client is ("single-tenant"), today's behaviour.
class Tenancy {
 public:
  enum class Mode { kSingleTenant, kTokens, kCertificates };

  struct Defaults {
    int64_t max_queued_queries = 0;  // the share of a tenant that names none
  };

  // Single-tenant.
  static std::unique_ptr<Tenancy> SingleTenant();
  // Every client certificate's common name a tenant.
  static std::unique_ptr<Tenancy> ByCertificate(Defaults defaults);
  // The tokens file's JSON text (`path` names it in errors): INVALID_ARGUMENT naming the entry
  // and field for anything malformed (docs/deploy.md has the format).
  static absl::StatusOr<std::unique_ptr<Tenancy>> FromTokensFile(absl::string_view json,
                                                                 absl::string_view path,
                                                                 Defaults defaults);

  Mode mode() const { return mode_; }
  // The KV quotas by namespace, for KvStoreOptions::namespace_budget_bytes.
  std::map<std::string, int64_t> KvQuotas() const;
  // Tenants known up front (tokens file), in file order.
  std::vector<const Tenant*> Known() const;

  // The caller's tenant: nullptr when single-tenant; UNAUTHENTICATED (no or unknown
  // credentials) otherwise. Thread-safe.
  absl::StatusOr<Tenant*> Authenticate(const grpc::CallbackServerContext& context);
  // Where a call's verified client certificate name comes from when TLS ends before gRPC (the
  // HTTP/2 guard's listener terminates it: GuardedListener::CommonNameOf by the call's peer).
  // Set before serving; gRPC's own auth context is read first.
  void set_certificate_name_of(
      std::function<std::optional<std::string>(const std::string& peer)> name_of) {
    certificate_name_of_ = std::move(name_of);
  }

  // Calls refused UNAUTHENTICATED so far.
  int64_t unauthenticated() const { return unauthenticated_.load(std::memory_order_relaxed); }

 private:
  explicit Tenancy(Mode mode) : mode_(mode) {}
  Tenant* ByCommonName(absl::string_view name);
  absl::StatusOr<Tenant*> Identify(const grpc::CallbackServerContext& context);

  const Mode mode_;
  Defaults defaults_;
  std::vector<std::unique_ptr<Tenant>> tenants_;
  absl::flat_hash_map<std::string, Tenant*> by_token_hash_;  // hex SHA-256
  absl::flat_hash_map<std::string, Tenant*> by_common_name_;
  std::map<std::string, int64_t> kv_quotas_;
  std::atomic<int64_t> unauthenticated_{0};
  std::function<std::optional<std::string>(const std::string&)> certificate_name_of_;
  // Certificate tenants are made on first sight (kCertificates).
  mutable absl::Mutex certificates_mu_;
};

// SHA-256 of `token`, as 64 lower-case hex digits (the tokens file's token_sha256).
std::string TokenHash(absl::string_view token);

}  // namespace mlaserve::service

#endif  // MLASERVE_SERVER_SERVICE_TENANCY_H_
