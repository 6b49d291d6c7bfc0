#include "server/service/transport_security.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "server/service/pem_credentials.h"

namespace mlaserve::service {
namespace {

absl::Status BadFile(absl::string_view flag, absl::string_view path, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, " ", path, ": ", problem));
}

unsigned int ReloadSeconds(absl::Duration interval) {
  return static_cast<unsigned int>(std::max<int64_t>(1, absl::ToInt64Seconds(interval)));
}

}  // namespace

absl::Status CheckTlsFiles(const TlsOptions& tls) {
  if (!tls.enabled()) {
    if (!tls.key_file.empty()) return BadFile("tls_key", tls.key_file, "needs --tls_cert");
    if (!tls.client_ca_file.empty()) {
      return BadFile("tls_client_ca", tls.client_ca_file, "needs --tls_cert and --tls_key");
    }
    return absl::OkStatus();
  }
  if (tls.key_file.empty()) return BadFile("tls_cert", tls.cert_file, "needs --tls_key");
  // Parsing them as the metrics port does checks every file and the key against the leaf.
  return PemCredentials::Load(tls).status();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsOptions& tls) {
  RETURN_IF_ERROR(CheckTlsFiles(tls));
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  const unsigned int reload = ReloadSeconds(tls.reload_interval);
  auto provider = tls.client_ca_file.empty()
                      ? std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
                            tls.key_file, tls.cert_file, reload)
                      : std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
                            tls.key_file, tls.cert_file, tls.client_ca_file, reload);
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (tls.client_ca_file.empty()) {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  } else {
    options.watch_root_certs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  }
  return grpc::experimental::TlsServerCredentials(options);
}

}  // namespace mlaserve::service
