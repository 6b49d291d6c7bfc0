#ifndef MLASERVE_SERVER_SERVICE_PEM_CREDENTIALS_H_
#define MLASERVE_SERVER_SERVICE_PEM_CREDENTIALS_H_

#include <ctime>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/service/transport_security.h"

typedef struct ssl_st SSL;

namespace mlaserve::service {

// The TlsOptions' PEM files as OpenSSL objects, for the listeners that are not gRPC's (the
// metrics port): the certificate chain, its key and the client CA bundle, re-read when one of
// the files' modification times changes (looked at most once per reload_interval), so that a
// renewed certificate reaches new connections without a restart, as on the gRPC port.
class PemCredentials {
 public:
  // Reads the files now; INVALID_ARGUMENT naming the flag (--tls_cert, --tls_key,
  // --tls_client_ca) whose file cannot be read or parsed, or whose key is not the
  // certificate's. `tls` must be enabled.
  static absl::StatusOr<std::unique_ptr<PemCredentials>> Load(const TlsOptions& tls);
  ~PemCredentials();

  // Installs the current certificate, key, chain and (under mutual TLS) client CA store on a
  // connection that is being handshaken; called from OpenSSL's certificate callback.
  // Re-reads the files first if they changed; a renewal that cannot be read (a half-written
  // file) keeps the previous credentials and is retried on the next interval.
  bool InstallOn(SSL* ssl);
  // InstallOn as OpenSSL's certificate callback (SSL_CTX_set_cert_cb with `this` as its arg).
  static int CertificateCallback(SSL* ssl, void* credentials) {
    return static_cast<PemCredentials*>(credentials)->InstallOn(ssl) ? 1 : 0;
  }

  bool mutual() const { return !tls_.client_ca_file.empty(); }

  struct Loaded;  // the parsed files (pem_credentials.cc)

 private:
  PemCredentials(const TlsOptions& tls, std::shared_ptr<const Loaded> loaded);
  std::shared_ptr<const Loaded> Current();

  const TlsOptions tls_;
  absl::Mutex mu_;
  std::shared_ptr<const Loaded> loaded_ ABSL_GUARDED_BY(mu_);
  absl::Time next_check_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mlaserve::service

#endif  // MLASERVE_SERVER_SERVICE_PEM_CREDENTIALS_H_
