#include "client/loadgen/http_get.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <memory>

#include "absl/strings/str_cat.h"
#include "common/host_port.h"
#include "common/openssl_ptr.h"
#include "httplib.h"

namespace mlaserve::loadgen {
namespace {

// The CA bundle as a store; httplib's client takes ownership of it.
X509_STORE* CaStore(const std::string& ca_pem) {
  X509_STORE* store = X509_STORE_new();
  auto bio = MemoryBio(ca_pem);
  while (X509* cert = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
    X509_STORE_add_cert(store, cert);
    X509_free(cert);
  }
  ERR_clear_error();
  return store;
}

std::unique_ptr<httplib::ClientImpl> NewClient(const HostPort& at, const client::ClientTls& tls) {
  if (!tls.enabled()) return std::make_unique<httplib::ClientImpl>(at.host, at.port);
  std::unique_ptr<httplib::SSLClient> https;
  if (!tls.cert_pem.empty()) {
    auto cert_bio = MemoryBio(tls.cert_pem);
    X509Ptr cert(PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr));
    auto key_bio = MemoryBio(tls.key_pem);
    KeyPtr key(PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr));
    ERR_clear_error();
    https = std::make_unique<httplib::SSLClient>(at.host, at.port, cert.get(), key.get());
  } else {
    https = std::make_unique<httplib::SSLClient>(at.host, at.port);
  }
  https->set_ca_cert_store(CaStore(tls.ca_pem));
  https->enable_server_certificate_verification(true);
  return https;
}

}  // namespace

absl::StatusOr<std::string> HttpGet(const std::string& host_port, const std::string& path,
                                    absl::Duration timeout, const client::ClientTls& tls) {
  absl::StatusOr<HostPort> at = ParseHostPort(host_port, "--metrics-target");
  if (!at.ok()) return at.status();
  std::unique_ptr<httplib::ClientImpl> http = NewClient(*at, tls);
  if (!http->is_valid()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls_cert/--tls_key: cannot use them to reach ", host_port));
  }
  const std::chrono::microseconds limit = absl::ToChronoMicroseconds(timeout);
  http->set_connection_timeout(limit);
  http->set_read_timeout(limit);
  http->set_write_timeout(limit);
  const httplib::Result answer = http->Get(path.c_str());
  const std::string url = absl::StrCat(tls.enabled() ? "https://" : "http://", host_port, path);
  if (!answer) {
    return absl::UnavailableError(
        absl::StrCat("GET ", url, ": ", httplib::to_string(answer.error())));
  }
  if (answer->status != 200) {
    return absl::InternalError(absl::StrCat("GET ", url, ": HTTP status ", answer->status));
  }
  return answer->body;
}

}  // namespace mlaserve::loadgen
