#ifndef MLASERVE_SERVER_SERVICE_TRANSPORT_SECURITY_H_
#define MLASERVE_SERVER_SERVICE_TRANSPORT_SECURITY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/security/server_credentials.h"

namespace mlaserve::service {

// The gRPC port's transport security (docs/deploy.md, "Transport security"). No certificate:
// plaintext. A certificate and key: TLS. With a client CA as well: mutual TLS, where every
// client must present a certificate that CA signed.
struct TlsOptions {
  std::string cert_file;       // PEM certificate chain, leaf first
  std::string key_file;        // PEM private key of the leaf
  std::string client_ca_file;  // PEM CA bundle clients' certificates must chain to
  // How often the files are re-read; a renewed certificate (same paths, new contents) is
  // served to new connections from then on, without a restart.
  absl::Duration reload_interval = absl::Seconds(10);

  bool enabled() const { return !cert_file.empty(); }
  // "plaintext", "TLS" or "mutual TLS", for the log.
  const char* mode() const {
    return !enabled() ? "plaintext" : client_ca_file.empty() ? "TLS" : "mutual TLS";
  }
};

// Checks the files now, so that a wrong path, a key that is not the certificate's or a CA
// file without a certificate stops the start with INVALID_ARGUMENT naming the flag
// (--tls_cert, --tls_key, --tls_client_ca), rather than failing every handshake later.
absl::Status CheckTlsFiles(const TlsOptions& tls);

// Insecure credentials when `tls` is not enabled; otherwise gRPC's TLS credentials over a
// provider that re-reads the files every reload_interval. Checks the files first.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsOptions& tls);

}  // namespace mlaserve::service

#endif  // MLASERVE_SERVER_SERVICE_TRANSPORT_SECURITY_H_
