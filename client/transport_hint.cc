#include "client/transport_hint.h"

#include <algorithm>
#include <initializer_list>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/health_check.h"

namespace mlaserve::client {
namespace {

// What gRPC 1.51 over OpenSSL 3 says, as it said it in tls_clients_test: kReset when a TLS
// server resets a connection it cannot read (a plaintext client's HTTP/2 preface, a TLS
// handshake without the client certificate it requires), kTlsIntoPlaintext when a TLS client
// reads HTTP/2 frames where it wanted a ServerHello. Matched in lower case: OpenSSL's builds
// spell them in both cases.
constexpr std::initializer_list<const char*> kReset = {"connection reset by peer",
                                                       "endpoint read failed", "socket closed",
                                                       "end of file", "broken pipe"};
constexpr std::initializer_list<const char*> kTlsIntoPlaintext = {
    "wrong version number", "wrong_version_number", "packet length too long",
    "record layer failure"};

bool Says(const std::string& said, std::initializer_list<const char*> words) {
  return std::any_of(words.begin(), words.end(),
                     [&](const char* word) { return absl::StrContains(said, word); });
}

std::string Hint(const absl::Status& status, bool client_tls) {
  const std::string said = absl::AsciiStrToLower(status.message());
  // A transport failure on the way to a connection, not an error the server answered.
  if (status.code() != absl::StatusCode::kUnavailable ||
      !absl::StrContains(said, "failed to connect")) {
    return "";
  }
  if (!client_tls && Says(said, kReset)) {
    return "the server may expect TLS: pass --tls_ca (the CA that signed its certificate), and "
           "--tls_cert/--tls_key where it requires client certificates";
  }
  if (client_tls && Says(said, kReset)) {
    return "the server may require a client certificate: pass --tls_cert and --tls_key (one its "
           "--tls_client_ca signed)";
  }
  if (client_tls && Says(said, kTlsIntoPlaintext)) {
    return "the server may not speak TLS: drop --tls_ca (and --tls_cert/--tls_key) for a "
           "plaintext server";
  }
  if (client_tls && absl::StrContains(said, "is not in peer certificate")) {
    return "the server's certificate does not name the address dialled: add it to the "
           "certificate's subjectAltName (an IP address as IP:, docs/deploy.md, \"Transport "
           "security\"), or pass --tls_server_name with a name it carries";
  }
  if (client_tls && absl::StrContains(said, "handshake")) {
    return "the TLS handshake failed: check that --tls_ca signed the server's certificate, that "
           "the certificate names the address dialled (else --tls_server_name), and --tls_cert/"
           "--tls_key where the server requires client certificates";
  }
  return "";
}

}  // namespace

absl::Status ExplainTransportError(absl::Status status, bool client_tls) {
  const std::string hint = Hint(status, client_tls);
  if (hint.empty()) return status;
  return absl::Status(status.code(), absl::StrCat(status.message(), "; ", hint));
}

absl::Status WaitForServer(MlaServeClient& client, absl::Duration timeout, bool client_tls) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    const absl::Duration left = deadline - absl::Now();
    if (client.WaitForConnected(std::min(left, absl::Seconds(1)))) return absl::OkStatus();
    // The channel's last failure, through a call that fails at once on a failing channel.
    const absl::StatusOr<ServingStatus> probe = CheckHealth(
        client.channel(), "", std::clamp(left, absl::Milliseconds(100), absl::Seconds(1)));
    if (probe.ok()) return absl::OkStatus();
    if (!Hint(probe.status(), client_tls).empty()) {
      return ExplainTransportError(probe.status(), client_tls);
    }
    if (absl::Now() >= deadline) {
      return absl::Status(probe.status().code(),
                          absl::StrCat("no connection within ", absl::FormatDuration(timeout), ": ",
                                       probe.status().message()));
    }
  }
}

}  // namespace mlaserve::client
