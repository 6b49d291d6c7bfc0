// TLS and mutual TLS on the gRPC port, with certificates the test makes with openssl: who
// gets in, who does not, a renewed certificate served without a restart, and files that
// stop the start.

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/health_check.h"
#include "client/loadgen/http_get.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "tests/integration/integration_server.h"
#include "tests/testing/test_certificates.h"

namespace mlaserve::integration {
namespace {

using ::mlaserve::testing::TestCertificates;
using ::testing::HasSubstr;

service::ServerOptions TlsServerOptions(const TestCertificates& pki, bool mutual) {
  service::ServerOptions options;
  options.tls.cert_file = pki.server_cert();
  options.tls.key_file = pki.server_key();
  if (mutual) options.tls.client_ca_file = pki.ca();
  options.tls.reload_interval = absl::Seconds(1);
  return options;
}

// A client of the server with `tls` (plaintext when empty), failing fast.
absl::Status GetServerInfo(const IntegrationServer& server, client::ClientTls tls) {
  client::ClientOptions options;
  options.timeout = absl::Seconds(5);
  options.max_attempts = 1;
  options.tls = std::move(tls);
  return server.NewClient(options)->GetServerInfo().status();
}

client::ClientTls Tls(const std::string& ca, const std::string& cert = "",
                      const std::string& key = "") {
  absl::StatusOr<client::ClientTls> tls = client::LoadClientTls(ca, cert, key);
  EXPECT_TRUE(tls.ok()) << tls.status();
  return tls.ok() ? *tls : client::ClientTls{};
}

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(pki_.status().ok()) << pki_.status(); }
  TestCertificates pki_;
};

TEST_F(TlsTest, ATlsServerAnswersClientsThatTrustItsCaOnly) {
  IntegrationServer server(SmallEngineOptions(TinyModel()), "", TlsServerOptions(pki_, false));
  EXPECT_TRUE(GetServerInfo(server, Tls(pki_.ca())).ok());
  const absl::Status plaintext = GetServerInfo(server, {});
  EXPECT_EQ(plaintext.code(), absl::StatusCode::kUnavailable) << plaintext;
  const absl::Status wrong_ca = GetServerInfo(server, Tls(pki_.other_ca()));
  EXPECT_EQ(wrong_ca.code(), absl::StatusCode::kUnavailable) << wrong_ca;
  // Probes keep working: the health service is on the same port, over TLS.
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = TestCertificates::Read(pki_.ca());
  auto health =
      client::CheckHealth(grpc::CreateChannel(server.target(), grpc::SslCredentials(ssl)), "");
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, client::ServingStatus::kServing);
}

TEST_F(TlsTest, UnderMutualTlsAClientNeedsACertificateTheClientCaSigned) {
  IntegrationServer server(SmallEngineOptions(TinyModel()), "", TlsServerOptions(pki_, true));
  EXPECT_TRUE(GetServerInfo(server, Tls(pki_.ca(), pki_.client_cert(), pki_.client_key())).ok());
  const absl::Status no_certificate = GetServerInfo(server, Tls(pki_.ca()));
  EXPECT_EQ(no_certificate.code(), absl::StatusCode::kUnavailable) << no_certificate;
  // A certificate of its own making (self-signed by the other CA's key) is not enough.
  const absl::Status foreign =
      GetServerInfo(server, Tls(pki_.ca(), pki_.other_ca(), pki_.other_ca_key()));
  EXPECT_EQ(foreign.code(), absl::StatusCode::kUnavailable) << foreign;
  EXPECT_EQ(GetServerInfo(server, {}).code(), absl::StatusCode::kUnavailable);
}

// TLS ends in the HTTP/2 guard's relay, so gRPC sees plaintext socket pairs: the certificate's
// common name still reaches tenancy (one tenant per name), or every call would be
// UNAUTHENTICATED "needs a client certificate".
TEST_F(TlsTest, BehindTheGuardAClientCertificatesNameIsItsTenant) {
  service::ServerOptions options = TlsServerOptions(pki_, true);
  options.tenancy = service::Tenancy::ByCertificate({});
  IntegrationServer server(SmallEngineOptions(TinyModel()), "", options);
  ASSERT_NE(server.server().guard(), nullptr) << "TLS ports are behind the guard";
  client::ClientOptions client_options;
  client_options.timeout = absl::Seconds(5);
  client_options.max_attempts = 1;
  client_options.tls = Tls(pki_.ca(), pki_.client_cert(), pki_.client_key());
  auto client = server.NewClient(client_options);
  ASSERT_TRUE(client->CreateSequence("s").ok());
  auto sequence = client->GetSequence("s");
  ASSERT_TRUE(sequence.ok()) << sequence.status();
  EXPECT_EQ(options.tenancy->unauthenticated(), 0);
}

TEST_F(TlsTest, TheMetricsPortFollowsTheGrpcPortsSecurity) {
  IntegrationServer server(SmallEngineOptions(TinyModel()), "127.0.0.1:0",
                           TlsServerOptions(pki_, true));
  EXPECT_STREQ(server.server().metrics_mode(), "HTTPS with client certificates");
  const std::string metrics = absl::StrCat("127.0.0.1:", server.server().metrics_port());
  absl::StatusOr<std::string> body = loadgen::HttpGet(
      metrics, "/metrics", absl::Seconds(5), Tls(pki_.ca(), pki_.client_cert(), pki_.client_key()));
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_THAT(*body, HasSubstr("mlaserve_kv_bytes"));
  EXPECT_FALSE(loadgen::HttpGet(metrics, "/metrics", absl::Seconds(5)).ok());
  EXPECT_EQ(loadgen::HttpGet(metrics, "/metrics", absl::Seconds(5), Tls(pki_.ca())).status().code(),
            absl::StatusCode::kUnavailable);
}

TEST_F(TlsTest, ARenewedCertificateIsServedWithoutARestart) {
  IntegrationServer server(SmallEngineOptions(TinyModel()), "", TlsServerOptions(pki_, false));
  ASSERT_TRUE(GetServerInfo(server, Tls(pki_.ca())).ok());
  ASSERT_TRUE(pki_.RenewServerCertificateWithOtherCa().ok());
  // Re-read every second; new connections get the new certificate.
  absl::Status renewed;
  for (int attempt = 0; attempt < 50; ++attempt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    renewed = GetServerInfo(server, Tls(pki_.other_ca()));
    if (renewed.ok()) break;
  }
  EXPECT_TRUE(renewed.ok()) << renewed;
  EXPECT_EQ(GetServerInfo(server, Tls(pki_.ca())).code(), absl::StatusCode::kUnavailable);
}

TEST_F(TlsTest, UnusableFilesStopTheStartNamingTheFlag) {
  struct Case {
    std::string cert, key, client_ca, flag;
  };
  const Case cases[] = {
      {"/nonexistent/server.pem", pki_.server_key(), "", "--tls_cert /nonexistent/server.pem"},
      {pki_.server_key(), pki_.server_key(), "", "holds no PEM certificate"},
      {pki_.server_cert(), pki_.client_key(), "", "--tls_key"},
      {pki_.server_cert(), "", "", "needs --tls_key"},
      {pki_.server_cert(), pki_.server_key(), pki_.server_key(), "--tls_client_ca"},
      {"", "", pki_.ca(), "--tls_client_ca"},
  };
  for (const Case& c : cases) {
    service::ServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.metrics_address = "";
    options.tls.cert_file = c.cert;
    options.tls.key_file = c.key;
    options.tls.client_ca_file = c.client_ca;
    auto server =
        service::MlaServer::Start(engine::CreateEngine, SmallEngineOptions(TinyModel()), options);
    ASSERT_FALSE(server.ok()) << c.flag;
    EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(server.status().message(), HasSubstr(c.flag));
  }
}

}  // namespace
}  // namespace mlaserve::integration
