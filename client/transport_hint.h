#ifndef MLASERVE_CLIENT_TRANSPORT_HINT_H_
#define MLASERVE_CLIENT_TRANSPORT_HINT_H_

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/mlaserve_client.h"

namespace mlaserve::client {

// A client and a server that disagree about TLS see only the transport's words: a plaintext
// client against a TLS server "recvmsg:Connection reset by peer", a TLS client against a
// plaintext one "Ssl handshake failed: ... wrong version number". The command-line tools
// (mlaserve-ctl, mlaserve-loadgen) pass their failures through here, which adds what to
// change, in their flags' words, to a connection failure that reads like one of those
// (`client_tls`: whether this client spoke TLS), or like a mutual-TLS server refusing a client
// without a certificate. Every other status comes back unchanged.
absl::Status ExplainTransportError(absl::Status status, bool client_tls);

// Waits up to `timeout` for `client`'s channel to connect. A connection failure that reads
// like a TLS disagreement ends the wait at once (it will not heal, unlike a server that is
// not listening yet); otherwise UNAVAILABLE after `timeout` with the last failure's words.
// Either way explained as above.
absl::Status WaitForServer(MlaServeClient& client, absl::Duration timeout, bool client_tls);

}  // namespace mlaserve::client

#endif  // MLASERVE_CLIENT_TRANSPORT_HINT_H_
