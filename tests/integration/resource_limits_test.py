#!/usr/bin/python3
"""What a hostile client can make the real server binary hold, over the wire:

* a request body far over --max_message_mb is refused once gRPC's buffers reach
  --grpc_memory, not after the whole body has arrived (the server's peak RSS stays within the
  quota);
* an HTTP/2 rapid-reset flood (HEADERS then RST_STREAM, stream after stream, on one raw
  connection: CVE-2023-44487) neither grows the server past its quota nor stalls other
  clients' calls;
* SIGTERM with an idle client connected still exits at once (on a fresh server: the flood's
  backlog of reset calls is its own cost, and a drain after it is timed apart).

    /usr/bin/python3 tests/integration/resource_limits_test.py --server build/bin/mlaserve-server
"""

import argparse
import os
import select
import signal
import socket
import ssl
import subprocess
import tempfile
import sys
import threading
import time
import urllib.request

import grpc
import h2.config
import h2.connection
import h2.events
import h2.exceptions
import numpy as np

import mlaserve
from harness import make_pki

QUOTA_MIB = 96
# What a 5 s rapid-reset flood may add to the server's peak RSS (see rapid_reset), without the
# HTTP/2 guard and with it.
RESET_FLOOD_MAX_MIB = 768
RESET_FLOOD_GUARDED_MIB = 256
SERVING = b"\x08\x01"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def memory_mib(pid, field):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} for {pid}")


def raw_unary(channel, method):
    return channel.unary_unary(method, request_serializer=lambda x: x,
                               response_deserializer=lambda x: x)


def wait_serving(target, timeout=30):
    check = raw_unary(grpc.insecure_channel(target), "/grpc.health.v1.Health/Check")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check(b"", timeout=1.0) == SERVING:
                return True
        except grpc.RpcError:
            time.sleep(0.1)
    return False


def oversized_body(target, pid, baseline):
    """A 600 MiB Decode body through grpcio: refused RESOURCE_EXHAUSTED at its length prefix by
    the HTTP/2 guard (with --http2_guard=false, by gRPC once its buffers reach --grpc_memory)."""
    channel = grpc.insecure_channel(target, options=[("grpc.max_send_message_length", -1)])
    body = b"\x0a" + b"\x00" * (600 << 20)  # 600 MiB against a 16 MiB limit
    start = time.monotonic()
    try:
        raw_unary(channel, "/mlaserve.v1.MlaServe/Decode")(body, timeout=60)
        return ["a 600 MiB Decode body was accepted"]
    except grpc.RpcError as e:
        code, details = e.code(), e.details()
    finally:
        channel.close()
    took = time.monotonic() - start
    failures = []
    if code != grpc.StatusCode.RESOURCE_EXHAUSTED:
        failures.append(f"600 MiB body: {code}, want RESOURCE_EXHAUSTED")
    growth = memory_mib(pid, "VmHWM") - baseline
    print(f"oversized body: {code.name} after {took:.2f} s ({details}), peak RSS +{growth:.0f} MiB "
          f"(quota {QUOTA_MIB} MiB)")
    if growth > QUOTA_MIB + 64:
        failures.append(f"600 MiB body: peak RSS grew {growth:.0f} MiB, quota {QUOTA_MIB} MiB")
    return failures


def raw_connection(port, tls=None):
    """A raw HTTP/2 client connection; `tls`: an ssl.SSLContext (ALPN h2) for a TLS port."""
    sock = socket.create_connection(("127.0.0.1", port))
    if tls is not None:
        sock = tls.wrap_socket(sock, server_hostname="localhost")
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    sock.sendall(conn.data_to_send())
    return sock, conn


def grpc_headers(target, method):
    return [(":method", "POST"), (":scheme", "http"), (":path", f"/mlaserve.v1.MlaServe/{method}"),
            (":authority", target), ("content-type", "application/grpc"), ("te", "trailers")]


def declared_only_body(target, port, pid, guarded, tls=None):
    """A Decode whose prefix declares 1 GiB and which then sends nothing more: the guard answers
    at the prefix (gRPC alone would wait for the body, holding the stream open)."""
    sock, conn = raw_connection(port, tls)
    headers = grpc_headers(target, "Decode")
    before = memory_mib(pid, "VmRSS")
    conn.send_headers(1, headers)
    conn.send_data(1, b"\x00" + (1 << 30).to_bytes(4, "big"))
    start = time.monotonic()
    sock.sendall(conn.data_to_send())
    sock.settimeout(0.1)
    status, message, took = None, "", None
    deadline = start + 2.0
    while status is None and time.monotonic() < deadline:
        try:
            data = sock.recv(1 << 16)
        except (socket.timeout, ssl.SSLWantReadError):
            continue
        if not data:
            break
        for event in conn.receive_data(data):
            block = getattr(event, "headers", None)
            if block and any(k == b"grpc-status" for k, _ in block):
                fields = dict(block)
                status = int(fields[b"grpc-status"])
                message = fields.get(b"grpc-message", b"").decode()
                took = time.monotonic() - start
    sock.close()
    growth = memory_mib(pid, "VmRSS") - before
    failures = []
    if not guarded:
        print(f"a body that only declares 1 GiB, unguarded: "
              f"{'no answer in 2 s' if status is None else f'status {status}'}")
        return failures
    print(f"a body that only declares 1 GiB: grpc-status {status} after "
          f"{(took or float('nan')) * 1000:.1f} ms ({message}); RSS {growth:+.0f} MiB")
    if status != 8:
        failures.append(f"declared 1 GiB: status {status}, want 8 (RESOURCE_EXHAUSTED)")
    elif took > 0.1:
        failures.append(f"declared 1 GiB: refused after {took * 1000:.0f} ms, want <= 100 ms")
    if "16777216" not in message:
        failures.append(f"declared 1 GiB: the message does not name the limit: {message!r}")
    if growth > 64:
        failures.append(f"declared 1 GiB: RSS grew {growth:.0f} MiB")
    return failures


def rapid_reset(target, port, pid, baseline, guarded, seconds=5.0, tls=None, client_tls=None):
    """Opens and resets streams as fast as one Python thread can for `seconds`, reconnecting
    whenever the server closes the connection, while another client decodes every 20 ms (a
    latent query over 64 rows it appended) with a 10 s deadline and no retry.

    With the HTTP/2 guard, each flooding connection ends with GOAWAY after its reset burst
    (--http2_reset_burst; the client's connections together get 4x), so gRPC never holds more
    than a few thousand cancelled calls: RSS within RESET_FLOOD_GUARDED_MIB, the other
    client's p99 within 100 ms (300 under ASan). Without it (Debian's gRPC 1.51 has no reset
    limit) the backlog follows the flood's rate: +170 to +440 MiB seen on two cores, held to
    RESET_FLOOD_MAX_MIB."""
    stop = threading.Event()
    answered, failed = [], []

    client = mlaserve.Client(target, max_attempts=1, **(client_tls or {}))
    model = client.server_info().model
    width = model.dl + model.dr
    rng = np.random.default_rng()
    client.create_sequence("beside-the-flood")
    client.append_kv("beside-the-flood", 0, 0, rng.standard_normal((64, width)).astype(np.float32))
    query = mlaserve.latent_query("beside-the-flood", 0,
                                  rng.standard_normal((1, model.heads, width)).astype(np.float32))

    def other_client():
        while not stop.is_set():
            start = time.monotonic()
            try:
                client.decode([query], timeout=10.0)
                answered.append(time.monotonic() - start)
            except grpc.RpcError as e:
                failed.append(e.code())
            time.sleep(0.02)

    watcher = threading.Thread(target=other_client)
    watcher.start()
    headers = grpc_headers(target, "DecodeStream")
    opened, connections, lifetimes = 0, 0, []
    end = time.monotonic() + seconds
    refused_at_accept = 0
    while time.monotonic() < end:
        began = time.monotonic()
        try:
            sock, conn = raw_connection(port, tls)
        except OSError:  # closed at accept (the guard's cooldown), in or before the handshake
            refused_at_accept += 1
            continue
        connections += 1
        stream, closed = 1, False
        while time.monotonic() < end and not closed:
            try:
                for _ in range(200):
                    conn.send_headers(stream, headers)
                    conn.reset_stream(stream)
                    stream += 2
                    opened += 1
                sock.sendall(conn.data_to_send())  # blocking: a partial send would cut a frame
                if (tls is not None and sock.pending()) or select.select([sock], [], [], 0)[0]:
                    data = sock.recv(1 << 16)
                    closed = not data or any(isinstance(e, h2.events.ConnectionTerminated)
                                             for e in conn.receive_data(data))
            except (OSError, h2.exceptions.ProtocolError):
                closed = True
        if closed:
            lifetimes.append(time.monotonic() - began)
        sock.close()
        if not guarded:
            break  # one connection, as before the guard
    stop.set()
    watcher.join()
    client.close()
    growth = memory_mib(pid, "VmHWM") - baseline
    answered.sort()
    p99 = answered[min(len(answered) - 1, int(0.99 * len(answered)))] if answered else float("nan")
    print(f"rapid reset{' over mutual TLS' if tls else ''}: {opened} streams opened and reset in "
          f"{seconds:.0f} s over {connections} connection(s) ({refused_at_accept} more closed at "
          f"accept), {len(lifetimes)} ended by the server (longest lived "
          f"{max(lifetimes, default=float('nan')):.2f} s); other client: {len(answered)} decodes "
          f"answered (p99 {p99 * 1000:.0f} ms, slowest {answered[-1] * 1000 if answered else 0:.0f} "
          f"ms), {len(failed)} failed; peak RSS +{growth:.0f} MiB")
    failures = []
    if failed or not answered:
        failures.append(f"rapid reset: the other client's calls failed: {failed[:5]}")
    limit = RESET_FLOOD_GUARDED_MIB if guarded else RESET_FLOOD_MAX_MIB
    if growth > limit:
        failures.append(f"rapid reset: peak RSS grew {growth:.0f} MiB, more than {limit} MiB")
    if guarded:
        # The goal is 100 ms; TLS adds the relay's decryption on the same two cores, so CI
        # allows it twice that (measured 25-84 ms), and ASan three times.
        p99_limit = 0.3 if "ASAN_OPTIONS" in os.environ else 0.2 if tls else 0.1
        if p99 > p99_limit:
            failures.append(f"rapid reset: the other client's p99 {p99 * 1000:.0f} ms > "
                            f"{p99_limit * 1000:.0f} ms")
        if not lifetimes or max(lifetimes) > 1.0:
            failures.append(f"rapid reset: a flooding connection lived {max(lifetimes, default=0):.2f} "
                            "s, want it ended within 1 s")
    return failures


def idle_client_does_not_hold_exit(server, target):
    channel = grpc.insecure_channel(target)
    raw_unary(channel, "/mlaserve.v1.MlaServe/GetServerInfo")(b"", timeout=5)
    start = time.monotonic()
    server.send_signal(signal.SIGTERM)
    code = server.wait(timeout=30)
    took = time.monotonic() - start
    channel.close()
    print(f"SIGTERM with an idle client connected: exit {code} after {took:.2f} s")
    failures = []
    if code != 0:
        failures.append(f"exit code {code} after SIGTERM")
    if took > 5:
        failures.append(f"SIGTERM with an idle client took {took:.1f} s")
    return failures


def guard_metrics(metrics):
    """What /metrics says of the guard after the tests above: connections ended for resets,
    and the two refused bodies."""
    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as response:
        text = response.read().decode()
    values = {}
    for line in text.splitlines():
        if line.startswith("mlaserve_http2_guard_"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    print("guard metrics:", {k: int(v) for k, v in sorted(values.items())})
    failures = []
    if values.get('mlaserve_http2_guard_goaways_total{reason="resets"}', 0) < 1:
        failures.append("/metrics: no GOAWAY for resets counted")
    if values.get("mlaserve_http2_guard_refused_messages_total", 0) < 2:
        failures.append("/metrics: the refused bodies are not counted")
    return failures


def start_server(binary, target, env, guarded=True, metrics="", extra=()):
    return subprocess.Popen([
        binary, f"--listen={target}", f"--metrics_listen={metrics}", "--layers=1", "--devices=1",
        "--kv_budget=256MiB", "--max_message_mb=16", f"--grpc_memory={QUOTA_MIB}MiB",
        "--drain_timeout_s=20", "--log_level=warn", f"--http2_guard={str(guarded).lower()}",
        *extra], env=env)


def under_mutual_tls(binary, env):
    """The same bounds when the guard's relay ends TLS: client certificates required, the
    flood and the declared-only body sent over TLS with the client's certificate."""
    failures = []
    with tempfile.TemporaryDirectory(prefix="mlaserve-guard-tls-") as d:
        make_pki(d)
        port = free_port()
        target = f"127.0.0.1:{port}"
        server = start_server(binary, target, env, extra=(
            f"--tls_cert={d}/server.pem", f"--tls_key={d}/server.key",
            f"--tls_client_ca={d}/ca.pem"))
        client_tls = {"tls_ca": f"{d}/ca.pem", "tls_cert": f"{d}/client.pem",
                      "tls_key": f"{d}/client.key"}
        tls = ssl.create_default_context(cafile=f"{d}/ca.pem")
        tls.load_cert_chain(f"{d}/client.pem", f"{d}/client.key")
        tls.set_alpn_protocols(["h2"])
        try:
            with mlaserve.Client(target, **client_tls) as client:
                deadline = time.monotonic() + 30
                while True:
                    try:
                        client.server_info()
                        break
                    except grpc.RpcError:
                        if time.monotonic() > deadline:
                            raise SystemExit("the TLS server did not answer")
                        time.sleep(0.2)
            # Clients that hang up right after their handshake, while the relay sends its
            # session tickets (once a SIGPIPE that ended the server), then a call.
            for _ in range(5):
                raw = tls.wrap_socket(socket.create_connection(("127.0.0.1", port)),
                                      server_hostname="localhost")
                raw.close()
            with mlaserve.Client(target, max_attempts=1, **client_tls) as client:
                try:
                    client.server_info()
                except grpc.RpcError as e:
                    failures.append(f"after clients that hung up at once: {e.code()}")
            baseline = memory_mib(server.pid, "VmHWM")
            failures += declared_only_body(target, port, server.pid, guarded=True, tls=tls)
            failures += rapid_reset(target, port, server.pid, baseline, guarded=True, seconds=2.0,
                                    tls=tls, client_tls=client_tls)
        finally:
            stop(server)
    return failures


def stop(server):
    if server.poll() is None:
        server.kill()
        server.wait()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    binary = parser.parse_args().server
    # Under the sanitizer stage, ASan holds up to 256 MiB of freed memory back from reuse (its
    # quarantine, for use-after-free detection), which this test would count as the server's;
    # a small quarantine keeps the memory figures the server's own.
    env = dict(os.environ)
    if "ASAN_OPTIONS" in env:
        env["ASAN_OPTIONS"] += ":quarantine_size_mb=16"
    failures = []
    port = free_port()
    target = f"127.0.0.1:{port}"
    metrics = f"127.0.0.1:{free_port()}"
    server = start_server(binary, target, env, metrics=metrics)
    try:
        if not wait_serving(target):
            raise SystemExit("the server did not become SERVING")
        baseline = memory_mib(server.pid, "VmHWM")
        failures += oversized_body(target, server.pid, baseline)
        failures += declared_only_body(target, port, server.pid, guarded=True)
        failures += rapid_reset(target, port, server.pid, baseline, guarded=True)
        failures += guard_metrics(metrics)
        start = time.monotonic()
        server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=90 if "ASAN_OPTIONS" in env else 30)
        print(f"SIGTERM after the flood: exit {code} after {time.monotonic() - start:.2f} s")
        if code != 0:
            failures.append(f"exit code {code} after SIGTERM following the flood")
    finally:
        stop(server)
    failures += under_mutual_tls(binary, env)
    # Without the guard (--http2_guard=false, or a unix socket), gRPC's memory quota is what
    # bounds a big body.
    port = free_port()
    target = f"127.0.0.1:{port}"
    server = start_server(binary, target, env, guarded=False)
    try:
        if not wait_serving(target):
            raise SystemExit("the unguarded server did not become SERVING")
        baseline = memory_mib(server.pid, "VmHWM")
        failures += oversized_body(target, server.pid, baseline)
    finally:
        stop(server)
    target = f"127.0.0.1:{free_port()}"
    server = start_server(binary, target, env)
    try:
        if not wait_serving(target):
            raise SystemExit("the second server did not become SERVING")
        failures += idle_client_does_not_hold_exit(server, target)
    finally:
        stop(server)
    for failure in failures:
        print("FAIL:", failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
