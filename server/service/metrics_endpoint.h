#ifndef MLASERVE_SERVER_SERVICE_METRICS_ENDPOINT_H_
#define MLASERVE_SERVER_SERVICE_METRICS_ENDPOINT_H_

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "prometheus/collectable.h"
#include "server/service/transport_security.h"

namespace httplib {
class Server;
}

namespace mlaserve::service {

class PemCredentials;

// The Prometheus scrape endpoint: GET /metrics answers the collectables' families in the text
// exposition format; every other path is 404. It follows the gRPC port's transport security
// (docs/deploy.md, "Transport security"): plaintext HTTP without a certificate, HTTPS with
// one, and HTTPS that requires a client certificate the client CA signed under mutual TLS,
// from the same files, re-read the same way.
//
// Served by cpp-httplib over OpenSSL rather than prometheus-cpp's civetweb exposer, whose
// TLS crashes against Debian 12's OpenSSL 3 (docs/dependencies.md).
class MetricsEndpoint {
 public:
  // Binds `address` ("host:port", port 0 for any) and serves until destroyed. INVALID_ARGUMENT
  // naming --metrics_listen for a malformed address, or the --tls_* flag whose file is bad;
  // UNAVAILABLE when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(
      const std::string& address, const TlsOptions& tls,
      std::vector<std::shared_ptr<prometheus::Collectable>> collectables);

  // Stops listening and waits for the scrapes in progress.
  ~MetricsEndpoint();
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  int port() const { return port_; }
  // "HTTP", "HTTPS" or "HTTPS with client certificates", for the log.
  const char* mode() const { return mode_; }

 private:
  MetricsEndpoint() = default;
  std::string Scrape() const;

  std::vector<std::shared_ptr<prometheus::Collectable>> collectables_;
  std::unique_ptr<PemCredentials> credentials_;  // null for plaintext
  std::unique_ptr<httplib::Server> http_;
  std::thread listener_;
  int port_ = 0;
  const char* mode_ = "HTTP";
};

}  // namespace mlaserve::service

#endif  // MLASERVE_SERVER_SERVICE_METRICS_ENDPOINT_H_
