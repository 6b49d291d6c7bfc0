#include "server/service/tenancy.h"

#include <openssl/sha.h>

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "nlohmann/json.hpp"

namespace mlaserve::service {
namespace {

constexpr size_t kMaxTenantNameBytes = 64;
constexpr char kBearer[] = "Bearer ";

bool ValidName(absl::string_view name) {
  if (name.empty() || name.size() > kMaxTenantNameBytes) return false;
  for (const char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_') {
      return false;
    }
  }
  return true;
}

bool ValidHash(absl::string_view hash) {
  if (hash.size() != 2 * SHA256_DIGEST_LENGTH) return false;
  for (const char c : hash) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c)) || absl::ascii_isupper(c)) {
      return false;
    }
  }
  return true;
}

absl::Status Bad(absl::string_view path, absl::string_view where, absl::string_view problem) {
  return absl::InvalidArgumentError(
      absl::StrCat("--auth_tokens_file ", path, ": ", where, problem));
}

}  // namespace

bool Tenant::TryQueue(int64_t n) {
  int64_t queued = queued_queries.load(std::memory_order_relaxed);
  do {
    if (queued + n > max_queued_queries) return false;
  } while (!queued_queries.compare_exchange_weak(queued, queued + n, std::memory_order_relaxed));
  return true;
}

std::string TokenHash(absl::string_view token) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), digest);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex(2 * SHA256_DIGEST_LENGTH, '0');
  for (int i = 0; i < SHA256_DIGEST_LENGTH; ++i) {
    hex[2 * i] = kHex[digest[i] >> 4];
    hex[2 * i + 1] = kHex[digest[i] & 15];
  }
  return hex;
}

std::unique_ptr<Tenancy> Tenancy::SingleTenant() {
  return std::unique_ptr<Tenancy>(new Tenancy(Mode::kSingleTenant));
}

std::unique_ptr<Tenancy> Tenancy::ByCertificate(Defaults defaults) {
  auto tenancy = std::unique_ptr<Tenancy>(new Tenancy(Mode::kCertificates));
  tenancy->defaults_ = defaults;
  return tenancy;
}

absl::StatusOr<std::unique_ptr<Tenancy>> Tenancy::FromTokensFile(absl::string_view json,
                                                                 absl::string_view path,
                                                                 Defaults defaults) {
  nlohmann::json root = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return Bad(path, "", "is not JSON");
  if (!root.is_object() || !root.contains("tenants") || !root["tenants"].is_array() ||
      root["tenants"].empty()) {
    return Bad(path, "", "needs a non-empty \"tenants\" array");
  }
  auto tenancy = std::unique_ptr<Tenancy>(new Tenancy(Mode::kTokens));
  tenancy->defaults_ = defaults;
  const nlohmann::json& entries = root["tenants"];
  for (size_t i = 0; i < entries.size(); ++i) {
    const nlohmann::json& e = entries[i];
    const std::string at = absl::StrCat("tenants[", i, "]");
    if (!e.is_object()) return Bad(path, at, " is not an object");
    for (const auto& [key, value] : e.items()) {
      static constexpr const char* kKeys[] = {
          "name",           "token_sha256",       "certificate_cn",
          "kv_quota_bytes", "max_queued_queries", "rights"};
      if (std::find(std::begin(kKeys), std::end(kKeys), key) == std::end(kKeys)) {
        return Bad(path, at, absl::StrCat(" has an unknown field \"", key, "\""));
      }
    }
    auto tenant = std::make_unique<Tenant>();
    if (!e.contains("name") || !e["name"].is_string() || !ValidName(e["name"].get<std::string>())) {
      return Bad(path, at, ".name must be 1-64 characters of A-Z a-z 0-9 . - _");
    }
    tenant->name = e["name"].get<std::string>();
    for (const std::unique_ptr<Tenant>& other : tenancy->tenants_) {
      if (other->name == tenant->name) return Bad(path, at, ".name is used twice");
    }
    bool named = false;
    if (e.contains("token_sha256")) {
      if (!e["token_sha256"].is_string() || !ValidHash(e["token_sha256"].get<std::string>())) {
        return Bad(path, at,
                   ".token_sha256 must be 64 lower-case hex digits (sha256sum of the token)");
      }
      if (!tenancy->by_token_hash_.emplace(e["token_sha256"].get<std::string>(), tenant.get())
               .second) {
        return Bad(path, at, ".token_sha256 is another tenant's too");
      }
      named = true;
    }
    if (e.contains("certificate_cn")) {
      if (!e["certificate_cn"].is_string() || e["certificate_cn"].get<std::string>().empty()) {
        return Bad(path, at, ".certificate_cn must be a non-empty string");
      }
      if (!tenancy->by_common_name_.emplace(e["certificate_cn"].get<std::string>(), tenant.get())
               .second) {
        return Bad(path, at, ".certificate_cn is another tenant's too");
      }
      named = true;
    }
    if (!named) return Bad(path, at, " needs token_sha256 or certificate_cn");
    if (e.contains("kv_quota_bytes")) {
      if (!e["kv_quota_bytes"].is_number_integer() || e["kv_quota_bytes"].get<int64_t>() < 0) {
        return Bad(path, at, ".kv_quota_bytes must be a non-negative integer");
      }
      tenancy->kv_quotas_[tenant->name] = e["kv_quota_bytes"].get<int64_t>();
    }
    tenant->max_queued_queries = defaults.max_queued_queries;
    if (e.contains("max_queued_queries")) {
      if (!e["max_queued_queries"].is_number_integer() ||
          e["max_queued_queries"].get<int64_t>() < 1) {
        return Bad(path, at, ".max_queued_queries must be a positive integer");
      }
      tenant->max_queued_queries = e["max_queued_queries"].get<int64_t>();
    }
    if (e.contains("rights")) {
      if (!e["rights"].is_array()) return Bad(path, at, ".rights must be an array");
      tenant->rights = 0;
      for (const nlohmann::json& right : e["rights"]) {
        const std::string r = right.is_string() ? right.get<std::string>() : "";
        if (r == "read") {
          tenant->rights |= kRead;
        } else if (r == "write") {
          tenant->rights |= kWrite;
        } else if (r == "decode") {
          tenant->rights |= kDecode;
        } else {
          return Bad(path, at,
                     ".rights holds something other than \"read\", \"write\", \"decode\"");
        }
      }
    }
    tenancy->tenants_.push_back(std::move(tenant));
  }
  return tenancy;
}

std::map<std::string, int64_t> Tenancy::KvQuotas() const { return kv_quotas_; }

std::vector<const Tenant*> Tenancy::Known() const {
  absl::MutexLock lock(&certificates_mu_);
  std::vector<const Tenant*> known;
  for (const std::unique_ptr<Tenant>& t : tenants_) known.push_back(t.get());
  return known;
}

Tenant* Tenancy::ByCommonName(absl::string_view name) {
  absl::MutexLock lock(&certificates_mu_);
  if (const auto it = by_common_name_.find(name); it != by_common_name_.end()) return it->second;
  if (mode_ != Mode::kCertificates || !ValidName(name)) return nullptr;
  auto tenant = std::make_unique<Tenant>();
  tenant->name = std::string(name);
  tenant->max_queued_queries = defaults_.max_queued_queries;
  Tenant* raw = tenant.get();
  tenants_.push_back(std::move(tenant));
  by_common_name_.emplace(raw->name, raw);
  return raw;
}

absl::StatusOr<Tenant*> Tenancy::Authenticate(const grpc::CallbackServerContext& context) {
  if (mode_ == Mode::kSingleTenant) return nullptr;
  absl::StatusOr<Tenant*> tenant = Identify(context);
  if (!tenant.ok()) unauthenticated_.fetch_add(1, std::memory_order_relaxed);
  return tenant;
}

absl::StatusOr<Tenant*> Tenancy::Identify(const grpc::CallbackServerContext& context) {
  const auto& metadata = context.client_metadata();
  if (const auto it = metadata.find("authorization"); it != metadata.end()) {
    const absl::string_view value(it->second.data(), it->second.size());
    if (mode_ == Mode::kTokens && absl::StartsWith(value, kBearer)) {
      const auto tenant = by_token_hash_.find(TokenHash(value.substr(sizeof(kBearer) - 1)));
      if (tenant != by_token_hash_.end()) return tenant->second;
    }
    return absl::UnauthenticatedError("the authorization token is not one this server knows");
  }
  if (const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
      auth != nullptr && auth->IsPeerAuthenticated()) {
    for (const grpc::string_ref& cn : auth->FindPropertyValues("x509_common_name")) {
      if (Tenant* tenant = ByCommonName(absl::string_view(cn.data(), cn.size()))) return tenant;
    }
    return absl::UnauthenticatedError(
        "the client certificate's common name is not a tenant of this server");
  }
  if (certificate_name_of_) {
    if (const std::optional<std::string> cn = certificate_name_of_(context.peer())) {
      if (Tenant* tenant = ByCommonName(*cn)) return tenant;
      return absl::UnauthenticatedError(
          "the client certificate's common name is not a tenant of this server");
    }
  }
  return absl::UnauthenticatedError(mode_ == Mode::kTokens
                                        ? "this server needs 'authorization: Bearer TOKEN' metadata"
                                        : "this server needs a client certificate");
}

}  // namespace mlaserve::service
