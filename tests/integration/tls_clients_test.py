#!/usr/bin/python3
"""The server binary under mutual TLS with certificates made by openssl at run time, and
every client that can reach it: the Python client, the FlashMLA-compatible entry point, the
health probe (deploy/mlaserve-health) and mlaserve-loadgen. A plaintext client and a client
without a certificate are refused. A client and a server that disagree about TLS are told
so: mlaserve-ctl, mlaserve-loadgen and the Python client, plaintext against the TLS server
and with TLS against a plaintext one, each fail with what to change (a plaintext loadgen at
once, not after its connect timeout).

    /usr/bin/python3 tests/integration/tls_clients_test.py --server build/bin/mlaserve-server \
        --loadgen build/bin/mlaserve-loadgen --ctl build/bin/mlaserve-ctl \
        --health deploy/mlaserve-health  (PYTHONPATH=build/python)
"""

import argparse
import subprocess
import sys
import tempfile
import time

import grpc
import numpy as np

import mlaserve
from harness import Server, free_port, make_pki

EXPECT_TLS = "the server may expect TLS"
NOT_TLS = "the server may not speak TLS"
NEEDS_CERTIFICATE = "the server may require a client certificate"
from mlaserve import flash_mla


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--loadgen", required=True)
    parser.add_argument("--ctl", required=True)
    parser.add_argument("--health", required=True)
    args = parser.parse_args()
    failures = []
    with tempfile.TemporaryDirectory(prefix="mlaserve-tls-") as d:
        make_pki(d)
        tls = {"tls_ca": f"{d}/ca.pem", "tls_cert": f"{d}/client.pem",
               "tls_key": f"{d}/client.key"}
        target = f"127.0.0.1:{free_port()}"
        server = subprocess.Popen([
            args.server, f"--listen={target}", "--metrics_listen=", "--layers=1",
            "--devices=1", "--kv_budget=256MiB", f"--tls_cert={d}/server.pem",
            f"--tls_key={d}/server.key", f"--tls_client_ca={d}/ca.pem", "--log_level=warn"])
        try:
            probe = [sys.executable, args.health, "--target", target, "--tls-ca", tls["tls_ca"],
                     "--tls-cert", tls["tls_cert"], "--tls-key", tls["tls_key"]]
            ready = subprocess.run(probe + ["--wait", "30"], capture_output=True, text=True)
            print("health probe:", ready.stdout.strip())
            if ready.returncode != 0:
                failures.append(f"mlaserve-health over mTLS: {ready.stdout} {ready.stderr}")
            no_cert = subprocess.run(probe[:6], capture_output=True, text=True)
            if no_cert.returncode != 2:
                failures.append(f"mlaserve-health without a client certificate: {no_cert.stdout}")

            with mlaserve.Client(target, **tls) as client:
                heads = client.server_info().model.heads
                client.create_sequence("s")
                rng = np.random.default_rng()
                client.append_kv("s", 0, 0, rng.standard_normal((40, 576)).astype(np.float32))
                answers = client.decode([mlaserve.latent_query(
                    "s", 0, rng.standard_normal((1, heads, 576)).astype(np.float32))])
                print("python client over mTLS: decode out", answers[0].out.shape)
            for name, kwargs in (("plaintext", {}), ("no client certificate",
                                                     {"tls_ca": tls["tls_ca"]})):
                try:
                    with mlaserve.Client(target, timeout=3, max_attempts=1, **kwargs) as c:
                        c.server_info()
                    failures.append(f"a {name} client was answered")
                except grpc.RpcError as e:
                    print(f"{name} client refused: {e.code()}: {e.details()}")
                    needle = EXPECT_TLS if name == "plaintext" else NEEDS_CERTIFICATE
                    if needle not in e.details():
                        failures.append(f"the {name} Python client was not told {needle!r}: "
                                        f"{e.details()}")
            check_plaintext_tools(args, target, failures)

            flash_mla.configure(target=target, **tls)
            seqlens = np.array([50], dtype=np.int32)
            q = mlaserve.float_to_bf16_bits(rng.standard_normal((1, 1, heads, 576)))
            cache = mlaserve.float_to_bf16_bits(rng.standard_normal((1, 64, 1, 576)))
            metadata, splits = flash_mla.get_mla_metadata(seqlens, heads, 1)
            out, lse = flash_mla.flash_mla_with_kvcache(q, cache, np.zeros((1, 1), np.int32),
                                                        seqlens, 512, metadata, splits)
            print("flash_mla over mTLS: out", out.shape, "lse", lse.shape)
            if not np.all(np.isfinite(lse)):
                failures.append("flash_mla over mTLS: non-finite lse")

            loadgen = subprocess.run([
                args.loadgen, f"--target={target}", f"--tls_ca={tls['tls_ca']}",
                f"--tls_cert={tls['tls_cert']}", f"--tls_key={tls['tls_key']}",
                "--workers=1", "--sequences=2", "--prefix_tokens=32", "--context_tokens=8",
                "--duration_s=1", "--connect_timeout_s=10", "--json"],
                capture_output=True, text=True, timeout=120)
            print("loadgen over mTLS: exit", loadgen.returncode)
            if loadgen.returncode != 0:
                failures.append(f"mlaserve-loadgen over mTLS: {loadgen.stderr[-500:]}")
        finally:
            server.terminate()
            server.wait(timeout=60)
        check_tls_into_plaintext(args, tls, failures)
    for failure in failures:
        print("FAIL:", failure, file=sys.stderr)
    return 1 if failures else 0


def tool(argv, needle, failures, what, within=None):
    """Runs a tool that must fail with `needle` in what it prints (within `within` s)."""
    started = time.monotonic()
    run = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    took = time.monotonic() - started
    said = (run.stderr + run.stdout).strip().splitlines()
    print(f"{what}: exit {run.returncode} after {took:.1f} s: {said[-1] if said else ''}")
    if run.returncode == 0 or needle not in run.stderr:
        failures.append(f"{what}: exit {run.returncode}, no {needle!r} in: {run.stderr[-500:]}")
    if within is not None and took > within:
        failures.append(f"{what}: took {took:.1f} s, more than {within} s")


def check_plaintext_tools(args, target, failures):
    """mlaserve-ctl and mlaserve-loadgen without --tls_ca against the TLS server."""
    tool([args.ctl, f"--target={target}", "--timeout_s=5", "info"], EXPECT_TLS, failures,
         "plaintext mlaserve-ctl against TLS")
    # The connect timeout is the default 30 s: a TLS disagreement must end the wait at once.
    tool([args.loadgen, f"--target={target}", "--duration_s=1"], EXPECT_TLS, failures,
         "plaintext mlaserve-loadgen against TLS", within=15)


def check_tls_into_plaintext(args, tls, failures):
    """Every client with TLS against a plaintext server."""
    target = f"127.0.0.1:{free_port()}"
    server = Server(args.server, [f"--listen={target}", "--metrics_listen=", "--layers=1",
                                  "--devices=1", "--kv_budget=64MiB"])
    try:
        if not server.ready(60):
            failures.append("the plaintext server did not start: " + "".join(server.log[-20:]))
            return
        flags = [f"--tls_ca={tls['tls_ca']}"]
        tool([args.ctl, f"--target={target}", "--timeout_s=5", *flags, "info"], NOT_TLS,
             failures, "mlaserve-ctl with TLS against plaintext")
        tool([args.loadgen, f"--target={target}", "--duration_s=1", *flags], NOT_TLS, failures,
             "mlaserve-loadgen with TLS against plaintext", within=15)
        try:
            with mlaserve.Client(target, timeout=3, max_attempts=1,
                                 tls_ca=tls["tls_ca"]) as client:
                client.server_info()
            failures.append("a TLS Python client was answered by a plaintext server")
        except grpc.RpcError as e:
            print(f"Python client with TLS against plaintext: {e.code()}: {e.details()}")
            if NOT_TLS not in e.details():
                failures.append(f"the TLS Python client was not told the server may not speak "
                                f"TLS: {e.details()}")
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
