// The /metrics endpoint on loopback, plaintext and under the gRPC port's TLS settings, with
// certificates the test makes with openssl; scraped by the load generator's HttpGet (what
// `mlaserve-loadgen --soak` uses) and by raw sockets playing a stalled client.

#include "server/service/metrics_endpoint.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/loadgen/http_get.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/counter.h"
#include "prometheus/registry.h"
#include "tests/testing/test_certificates.h"

namespace mlaserve::service {
namespace {

using ::mlaserve::testing::TestCertificates;
using ::testing::HasSubstr;

std::shared_ptr<prometheus::Registry> RegistryWithACounter(double value) {
  auto registry = std::make_shared<prometheus::Registry>();
  prometheus::BuildCounter()
      .Name("scrapes_seen_total")
      .Help("a counter the test set")
      .Register(*registry)
      .Add({{"tenant", "a"}})
      .Increment(value);
  return registry;
}

std::unique_ptr<MetricsEndpoint> StartOrDie(const TlsOptions& tls, double counter = 7) {
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint =
      MetricsEndpoint::Start("127.0.0.1:0", tls, {RegistryWithACounter(counter)});
  EXPECT_TRUE(endpoint.ok()) << endpoint.status();
  return endpoint.ok() ? *std::move(endpoint) : nullptr;
}

std::string Target(const MetricsEndpoint& endpoint) {
  return absl::StrCat("127.0.0.1:", endpoint.port());
}

absl::StatusOr<std::string> Scrape(const MetricsEndpoint& endpoint,
                                   const client::ClientTls& tls = {}) {
  return loadgen::HttpGet(Target(endpoint), "/metrics", absl::Seconds(5), tls);
}

client::ClientTls Tls(const std::string& ca, const std::string& cert = "",
                      const std::string& key = "") {
  absl::StatusOr<client::ClientTls> tls = client::LoadClientTls(ca, cert, key);
  EXPECT_TRUE(tls.ok()) << tls.status();
  return tls.ok() ? *tls : client::ClientTls{};
}

TlsOptions ServerTls(const TestCertificates& pki, bool mutual) {
  TlsOptions tls;
  tls.cert_file = pki.server_cert();
  tls.key_file = pki.server_key();
  if (mutual) tls.client_ca_file = pki.ca();
  tls.reload_interval = absl::Seconds(1);
  return tls;
}

TEST(MetricsEndpointTest, ServesTheCollectablesAsPrometheusTextOverHttp) {
  std::unique_ptr<MetricsEndpoint> endpoint = StartOrDie({}, 7);
  ASSERT_NE(endpoint, nullptr);
  EXPECT_STREQ(endpoint->mode(), "HTTP");
  absl::StatusOr<std::string> body = Scrape(*endpoint);
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_THAT(*body, HasSubstr("# TYPE scrapes_seen_total counter"));
  EXPECT_THAT(*body, HasSubstr("scrapes_seen_total{tenant=\"a\"} 7"));
  const absl::StatusOr<std::string> elsewhere =
      loadgen::HttpGet(Target(*endpoint), "/", absl::Seconds(5));
  EXPECT_EQ(elsewhere.status().code(), absl::StatusCode::kInternal) << elsewhere.status();
  EXPECT_THAT(elsewhere.status().message(), HasSubstr("404"));
}

TEST(MetricsEndpointTest, UnderTlsOnlyClientsThatTrustTheCaGetAnAnswer) {
  TestCertificates pki;
  ASSERT_TRUE(pki.status().ok()) << pki.status();
  std::unique_ptr<MetricsEndpoint> endpoint = StartOrDie(ServerTls(pki, false));
  ASSERT_NE(endpoint, nullptr);
  EXPECT_STREQ(endpoint->mode(), "HTTPS");
  absl::StatusOr<std::string> body = Scrape(*endpoint, Tls(pki.ca()));
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_THAT(*body, HasSubstr("scrapes_seen_total"));
  EXPECT_FALSE(Scrape(*endpoint).ok()) << "a plaintext scrape of an HTTPS port";
  EXPECT_EQ(Scrape(*endpoint, Tls(pki.other_ca())).status().code(), absl::StatusCode::kUnavailable);
}

TEST(MetricsEndpointTest, UnderMutualTlsAScraperNeedsACertificateTheClientCaSigned) {
  TestCertificates pki;
  ASSERT_TRUE(pki.status().ok()) << pki.status();
  std::unique_ptr<MetricsEndpoint> endpoint = StartOrDie(ServerTls(pki, true));
  ASSERT_NE(endpoint, nullptr);
  EXPECT_STREQ(endpoint->mode(), "HTTPS with client certificates");
  absl::StatusOr<std::string> body =
      Scrape(*endpoint, Tls(pki.ca(), pki.client_cert(), pki.client_key()));
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_THAT(*body, HasSubstr("scrapes_seen_total"));
  EXPECT_EQ(Scrape(*endpoint, Tls(pki.ca())).status().code(), absl::StatusCode::kUnavailable);
  // A certificate of the scraper's own making (self-signed by the other CA's key).
  EXPECT_EQ(Scrape(*endpoint, Tls(pki.ca(), pki.other_ca(), pki.other_ca_key())).status().code(),
            absl::StatusCode::kUnavailable);
}

TEST(MetricsEndpointTest, ARenewedCertificateIsServedWithoutARestart) {
  TestCertificates pki;
  ASSERT_TRUE(pki.status().ok()) << pki.status();
  std::unique_ptr<MetricsEndpoint> endpoint = StartOrDie(ServerTls(pki, false));
  ASSERT_NE(endpoint, nullptr);
  ASSERT_TRUE(Scrape(*endpoint, Tls(pki.ca())).ok());
  ASSERT_TRUE(pki.RenewServerCertificateWithOtherCa().ok());
  absl::Status renewed;
  for (int attempt = 0; attempt < 50; ++attempt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    renewed = Scrape(*endpoint, Tls(pki.other_ca())).status();
    if (renewed.ok()) break;
  }
  EXPECT_TRUE(renewed.ok()) << renewed;
  EXPECT_EQ(Scrape(*endpoint, Tls(pki.ca())).status().code(), absl::StatusCode::kUnavailable);
}

TEST(MetricsEndpointTest, StalledClientsDoNotKeepAScraperOut) {
  std::unique_ptr<MetricsEndpoint> endpoint = StartOrDie({});
  ASSERT_NE(endpoint, nullptr);
  // Connections that send half a request and then nothing, each holding one of the four
  // workers until the endpoint's 5 s read timeout.
  std::vector<int> stalled;
  for (int i = 0; i < 3; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(endpoint->port()));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    ASSERT_EQ(send(fd, "GET /metr", 9, MSG_NOSIGNAL), 9);
    stalled.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // let them take their workers
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::string> body =
      loadgen::HttpGet(Target(*endpoint), "/metrics", absl::Seconds(10));
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_TRUE(body.ok()) << body.status();
  EXPECT_LT(waited, 2.0) << "the scrape waited for the stalled connections' timeouts";
  for (int fd : stalled) close(fd);
}

TEST(MetricsEndpointTest, AnUnusableAddressOrFileStopsTheStartNamingTheFlag) {
  const absl::Status malformed = MetricsEndpoint::Start("no-port", {}, {}).status();
  EXPECT_EQ(malformed.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(malformed.message(), HasSubstr("--metrics_listen"));

  std::unique_ptr<MetricsEndpoint> first = StartOrDie({});
  ASSERT_NE(first, nullptr);
  const absl::Status taken = MetricsEndpoint::Start(Target(*first), {}, {}).status();
  EXPECT_EQ(taken.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(taken.message(), HasSubstr("--metrics_listen"));

  TestCertificates pki;
  ASSERT_TRUE(pki.status().ok()) << pki.status();
  TlsOptions wrong_key = ServerTls(pki, false);
  wrong_key.key_file = pki.client_key();
  const absl::Status bad_key = MetricsEndpoint::Start("127.0.0.1:0", wrong_key, {}).status();
  EXPECT_EQ(bad_key.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_key.message(), HasSubstr("--tls_key"));
}

}  // namespace
}  // namespace mlaserve::service
