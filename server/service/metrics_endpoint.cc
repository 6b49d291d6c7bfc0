#include "server/service/metrics_endpoint.h"

#include <openssl/ssl.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/host_port.h"
#include "common/status_macros.h"
#include "httplib.h"
#include "prometheus/text_serializer.h"
#include "server/service/pem_credentials.h"

namespace mlaserve::service {
namespace {

// What one scraper may send or hold: a GET has no body, and a client that stalls mid-request
// gives its worker back after the read timeout.
constexpr size_t kMaxRequestBody = 4096;
constexpr int kReadTimeoutSeconds = 5;
// Each connection holds a worker while it is read (cpp-httplib is thread-per-connection): with
// four, three stalled connections still leave Prometheus one. More stalled connections than
// workers delay a scrape by up to the read timeout per round (docs/deploy.md).
constexpr size_t kWorkers = 4;

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& address, const TlsOptions& tls,
    std::vector<std::shared_ptr<prometheus::Collectable>> collectables) {
  ASSIGN_OR_RETURN(const HostPort bind, ParseHostPort(address, "--metrics_listen"));
  std::unique_ptr<MetricsEndpoint> endpoint(new MetricsEndpoint());
  endpoint->collectables_ = std::move(collectables);
  if (!tls.enabled()) {
    endpoint->http_ = std::make_unique<httplib::Server>();
  } else {
    ASSIGN_OR_RETURN(endpoint->credentials_, PemCredentials::Load(tls));
    PemCredentials* credentials = endpoint->credentials_.get();
    endpoint->mode_ = credentials->mutual() ? "HTTPS with client certificates" : "HTTPS";
    // The certificate is chosen per handshake (OpenSSL's certificate callback) so that a
    // renewal is served without a restart, as gRPC's file watcher does on the gRPC port.
    auto https = std::make_unique<httplib::SSLServer>([credentials](SSL_CTX& ctx) {
      SSL_CTX_set_min_proto_version(&ctx, TLS1_2_VERSION);
      SSL_CTX_set_cert_cb(&ctx, &PemCredentials::CertificateCallback, credentials);
      if (credentials->mutual()) {
        SSL_CTX_set_verify(&ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
      }
      return true;
    });
    if (!https->is_valid()) return absl::InternalError("metrics: cannot set up an OpenSSL context");
    endpoint->http_ = std::move(https);
  }
  httplib::Server& http = *endpoint->http_;
  http.new_task_queue = [] { return new httplib::ThreadPool(kWorkers); };
  http.set_payload_max_length(kMaxRequestBody);
  http.set_read_timeout(kReadTimeoutSeconds, 0);
  http.set_write_timeout(kReadTimeoutSeconds, 0);
  // SO_REUSEADDR for restarts over TIME_WAIT, but not cpp-httplib's default SO_REUSEPORT,
  // which would let a second server bind the port and take half the scrapes.
  http.set_socket_options([](int socket) {
    const int on = 1;
    setsockopt(socket, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  });
  const MetricsEndpoint* self = endpoint.get();
  http.Get("/metrics", [self](const httplib::Request&, httplib::Response& response) {
    response.set_content(self->Scrape(), "text/plain; version=0.0.4");
  });

  if (bind.port == 0) {
    endpoint->port_ = http.bind_to_any_port(bind.host);
  } else if (http.bind_to_port(bind.host, bind.port)) {
    endpoint->port_ = bind.port;
  }
  if (endpoint->port_ <= 0) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", address,
                                               " (--metrics_listen): the address cannot be bound"));
  }
  auto listener_ended = std::make_shared<std::atomic<bool>>(false);
  endpoint->listener_ = std::thread([&http, listener_ended] {
    http.listen_after_bind();
    *listener_ended = true;
  });
  // stop() before the listener runs would be lost, and the destructor's join would hang.
  while (!http.is_running() && !*listener_ended) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return endpoint;
}

MetricsEndpoint::~MetricsEndpoint() {
  if (http_ != nullptr) http_->stop();
  if (listener_.joinable()) listener_.join();
}

std::string MetricsEndpoint::Scrape() const {
  std::vector<prometheus::MetricFamily> families;
  for (const std::shared_ptr<prometheus::Collectable>& collectable : collectables_) {
    std::vector<prometheus::MetricFamily> collected = collectable->Collect();
    families.insert(families.end(), std::make_move_iterator(collected.begin()),
                    std::make_move_iterator(collected.end()));
  }
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace mlaserve::service
