"""What a connection failure means when client and server disagree about TLS.

A plaintext client against a TLS server sees only "recvmsg:Connection reset by peer", a TLS
client against a plaintext one "Ssl handshake failed: ... wrong version number": gRPC's and
OpenSSL's words, which do not say what to change. `explain` adds that, in this package's
argument names, to such a failure (the C++ tools do the same in client/transport_hint.h)."""

import grpc

from mlaserve.errors import StatusError

_RESET = ("connection reset by peer", "endpoint read failed", "socket closed", "end of file",
          "broken pipe")
_TLS_INTO_PLAINTEXT = ("wrong version number", "wrong_version_number", "packet length too long",
                       "record layer failure")


def hint(code, details, client_tls):
    """What to change for a failure with this code and details, or None."""
    said = (details or "").lower()
    if code != grpc.StatusCode.UNAVAILABLE or "failed to connect" not in said:
        return None
    if not client_tls and any(w in said for w in _RESET):
        return ("the server may expect TLS: pass tls_ca= (the CA that signed its certificate), "
                "and tls_cert=/tls_key= where it requires client certificates")
    if client_tls and any(w in said for w in _RESET):
        return ("the server may require a client certificate: pass tls_cert= and tls_key= (one "
                "its --tls_client_ca signed)")
    if client_tls and any(w in said for w in _TLS_INTO_PLAINTEXT):
        return "the server may not speak TLS: leave out tls_ca= (and tls_cert=/tls_key=)"
    if client_tls and "is not in peer certificate" in said:
        return ("the server's certificate does not name the address dialled: add it to the "
                "certificate's subjectAltName (an IP address as IP:), or pass tls_server_name= "
                "with a name it carries")
    if client_tls and "handshake" in said:
        return ("the TLS handshake failed: check that tls_ca= signed the server's certificate, "
                "that it names the address dialled (else tls_server_name=), and tls_cert=/"
                "tls_key= where the server requires client certificates")
    return None


class TransportError(StatusError):
    """A grpc.RpcError (same code()) whose details() end with what to change; the original
    error is its __cause__."""

    def __init__(self, error, advice):
        super().__init__(error.code(), f"{error.details()}; {advice}")


def explain(error, client_tls):
    """`error`, or a TransportError saying what to change when it reads like a TLS
    disagreement. Raise the result `from error`."""
    try:
        code, details = error.code(), error.details()
    except AttributeError:  # an RpcError that is not a call's (no code)
        return error
    advice = hint(code, details, client_tls)
    return error if advice is None else TransportError(error, advice)
