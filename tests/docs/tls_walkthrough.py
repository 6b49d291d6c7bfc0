"""docs/deploy.md's certificate walkthrough, tried as written: its marked sh block (openssl's
CA, server and client certificates) has run in a scratch directory of its own (docs_test's
check_snippets); here a server serves mutual TLS on the files it made, and mlaserve-ctl calls
it with the client's certificate at 127.0.0.1 and at localhost, the IP and DNS names the
server certificate must carry, and without TLS (refused, told the server may expect TLS).
A certificate without the address dialled fails with mlaserve-ctl's hint to name it (tried:
IP:127.0.0.1 taken out of the walkthrough)."""

import os
import subprocess

from doc_servers import run
from harness import Server, free_port

FILES = ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")


def check_tls_walkthrough(bin_dir, made, failures):
    """made: the directory the walkthrough's snippet ran in (None: it was not found)."""
    if made is None:
        failures.append("docs/deploy.md: no marked sh block makes the TLS certificates")
        return
    absent = [f for f in FILES if not os.path.isfile(os.path.join(made, f))]
    if absent:
        failures.append(f"docs/deploy.md's TLS walkthrough made no {', '.join(absent)}")
        return
    port = free_port()
    server = Server(os.path.join(bin_dir, "mlaserve-server"), [
        f"--listen=127.0.0.1:{port}", "--metrics_listen=", "--layers=1", "--devices=1",
        "--kv_budget=64MiB", f"--tls_cert={made}/server.pem", f"--tls_key={made}/server.key",
        f"--tls_client_ca={made}/ca.pem"])
    try:
        if not server.ready(60):
            failures.append("the server did not start on the walkthrough's certificates: " +
                            "".join(server.log[-10:]))
            return
        ctl = os.path.join(bin_dir, "mlaserve-ctl")
        client = [f"--tls_ca={made}/ca.pem", f"--tls_cert={made}/client.pem",
                  f"--tls_key={made}/client.key"]
        for host in ("127.0.0.1", "localhost"):
            done = run([ctl, f"--target={host}:{port}", "--timeout_s=10", *client, "health"])
            print(f"tls walkthrough: mlaserve-ctl over mutual TLS at {host}: exit "
                  f"{done.returncode} {done.stdout.strip()}")
            if done.returncode != 0 or done.stdout.strip() != "SERVING":
                failures.append(f"docs/deploy.md's certificates at {host}: exit "
                                f"{done.returncode}: {done.stderr.strip()[-400:]}")
        plain = run([ctl, f"--target=127.0.0.1:{port}", "--timeout_s=10", "health"])
        if plain.returncode != 2 or "the server may expect TLS" not in plain.stderr:
            failures.append(f"a plaintext mlaserve-ctl against the walkthrough's server: exit "
                            f"{plain.returncode}: {plain.stderr.strip()[-400:]}")
    except (OSError, subprocess.TimeoutExpired) as error:
        failures.append(f"tls walkthrough: {error}")
    finally:
        server.stop()
