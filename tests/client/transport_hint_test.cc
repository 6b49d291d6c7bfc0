#include "client/transport_hint.h"

#include <string>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace mlaserve::client {
namespace {

// The words gRPC 1.51 over OpenSSL 3 gave in tls_clients_test, each way round.
constexpr char kPlainIntoTls[] =
    "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:34511: "
    "recvmsg:Connection reset by peer";
constexpr char kTlsIntoPlain[] =
    "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:36521: Ssl "
    "handshake failed: SSL_ERROR_SSL: error:0A00010B:SSL routines::wrong version number";

std::string Explained(absl::StatusCode code, const char* message, bool tls) {
  return std::string(ExplainTransportError(absl::Status(code, message), tls).message());
}

TEST(TransportHintTest, APlaintextClientResetByATlsServerIsToldToPassTheCa) {
  const std::string said = Explained(absl::StatusCode::kUnavailable, kPlainIntoTls, false);
  EXPECT_EQ(said.find(kPlainIntoTls), 0u) << said;  // the transport's words kept, first
  EXPECT_NE(said.find("the server may expect TLS: pass --tls_ca"), std::string::npos) << said;
}

TEST(TransportHintTest, ATlsClientAnsweredInPlaintextIsToldToDropTheCa) {
  const std::string said = Explained(absl::StatusCode::kUnavailable, kTlsIntoPlain, true);
  EXPECT_NE(said.find("the server may not speak TLS: drop --tls_ca"), std::string::npos) << said;
}

TEST(TransportHintTest, ATlsClientResetByAMutualTlsServerIsToldToPassACertificate) {
  const std::string said = Explained(absl::StatusCode::kUnavailable, kPlainIntoTls, true);
  EXPECT_NE(said.find("the server may require a client certificate: pass --tls_cert"),
            std::string::npos)
      << said;
}

TEST(TransportHintTest, ACertificateWithoutTheAddressDialledIsToldToNameIt) {
  const std::string said = Explained(
      absl::StatusCode::kUnavailable,
      "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:60005: Peer name "
      "127.0.0.1 is not in peer certificate",
      true);
  EXPECT_NE(said.find("does not name the address dialled"), std::string::npos) << said;
}

TEST(TransportHintTest, AnotherHandshakeFailureNamesWhatToCheck) {
  const std::string said = Explained(
      absl::StatusCode::kUnavailable,
      "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Ssl handshake "
      "failed: SSL_ERROR_SSL: error:0A000086:SSL routines::certificate verify failed",
      true);
  EXPECT_NE(said.find("check that --tls_ca signed the server's certificate"), std::string::npos)
      << said;
}

TEST(TransportHintTest, EverythingElseComesBackUnchanged) {
  // A plaintext client told "wrong version number", a refused connection (no server), an
  // established connection reset later, and errors the server answered.
  const struct {
    absl::StatusCode code;
    const char* message;
    bool tls;
  } unchanged[] = {
      {absl::StatusCode::kUnavailable, kTlsIntoPlain, false},
      {absl::StatusCode::kUnavailable,
       "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Failed to "
       "connect to remote host: Connection refused",
       false},
      {absl::StatusCode::kUnavailable, "Socket closed", false},
      {absl::StatusCode::kUnavailable, "server is draining", true},
      {absl::StatusCode::kNotFound, kPlainIntoTls, false},
  };
  for (const auto& c : unchanged) {
    EXPECT_EQ(Explained(c.code, c.message, c.tls), c.message) << c.message << " tls " << c.tls;
  }
  EXPECT_TRUE(ExplainTransportError(absl::OkStatus(), false).ok());
}

}  // namespace
}  // namespace mlaserve::client
