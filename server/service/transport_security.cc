#include "server/service/transport_security.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"

namespace mlaserve::service {
namespace {

absl::Status BadFile(absl::string_view flag, absl::string_view path, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, " ", path, ": ", problem));
}

absl::StatusOr<std::string> ReadFile(absl::string_view flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return BadFile(flag, path, "cannot be read");
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

struct BioDeleter {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
struct X509Deleter {
  void operator()(X509* x509) const { X509_free(x509); }
};
struct KeyDeleter {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};

std::unique_ptr<BIO, BioDeleter> MemoryBio(const std::string& pem) {
  return std::unique_ptr<BIO, BioDeleter>(
      BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// The first certificate of a PEM file; nullptr if there is none.
std::unique_ptr<X509, X509Deleter> FirstCertificate(const std::string& pem) {
  auto bio = MemoryBio(pem);
  std::unique_ptr<X509, X509Deleter> cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  ERR_clear_error();
  return cert;
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
  ASSIGN_OR_RETURN(const std::string cert_pem, ReadFile("tls_cert", tls.cert_file));
  const auto cert = FirstCertificate(cert_pem);
  if (cert == nullptr) return BadFile("tls_cert", tls.cert_file, "holds no PEM certificate");
  ASSIGN_OR_RETURN(const std::string key_pem, ReadFile("tls_key", tls.key_file));
  auto key_bio = MemoryBio(key_pem);
  std::unique_ptr<EVP_PKEY, KeyDeleter> key(
      PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr));
  ERR_clear_error();
  if (key == nullptr) {
    return BadFile("tls_key", tls.key_file, "holds no PEM private key (or it is encrypted)");
  }
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    ERR_clear_error();
    return BadFile("tls_key", tls.key_file,
                   absl::StrCat("is not the private key of --tls_cert ", tls.cert_file));
  }
  if (!tls.client_ca_file.empty()) {
    ASSIGN_OR_RETURN(const std::string ca_pem, ReadFile("tls_client_ca", tls.client_ca_file));
    if (FirstCertificate(ca_pem) == nullptr) {
      return BadFile("tls_client_ca", tls.client_ca_file, "holds no PEM certificate");
    }
  }
  return absl::OkStatus();
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
