#!/usr/bin/python3
"""Cluster membership in a real etcd (Debian's etcd-server, started here on loopback with a
data directory the test removes): the server binary registers its record under a lease,
keeps its load fresh there, leaves at once on SIGTERM, disappears within the lease after a
kill -9, and starts and serves with etcd down, registering once etcd is back.

    /usr/bin/python3 tests/integration/cluster_membership_test.py \
        --server build/bin/mlaserve-server --etcd /usr/bin/etcd   (PYTHONPATH=build/python)
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

import mlaserve
from etcd_harness import Etcd, wait_for
from harness import Server, free_port, make_pki

CLUSTER = "test-cluster"
PREFIX = f"/mlaserve/{CLUSTER}/servers/"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--etcd", required=True)
    args = parser.parse_args()
    failures = []
    directory = tempfile.mkdtemp(prefix="mlaserve-cluster-test-")
    etcd = Etcd(args.etcd, directory, PREFIX)
    servers = []

    def start_server(ttl=3, extra=()):
        target = f"127.0.0.1:{free_port()}"
        server = Server(args.server, [
            f"--listen={target}", "--metrics_listen=", "--layers=1", "--devices=1",
            "--kv_budget=64MiB", "--model=kimi-k2", f"--etcd_endpoints={etcd.endpoint()}",
            f"--cluster={CLUSTER}", f"--etcd_lease_ttl_s={ttl}", *extra])
        servers.append(server)
        if not server.ready(60):
            raise RuntimeError("the server did not become ready: " + "".join(server.log))
        with mlaserve.Client(target) as client:
            instance = client.server_info().state.instance_id
        return server, target, instance

    def check(condition, message):
        if not condition:
            failures.append(message)
        return condition

    try:
        etcd.start()
        # 1. Registration: the record names the server as clients must dial it.
        server, target, instance = start_server()
        key = PREFIX + instance
        members = wait_for(lambda: key in etcd.members() and etcd.members(), 10)
        record = members.get(key, {}) if members else {}
        check(record.get("address") == target, f"record address {record.get('address')}, "
              f"expected {target}")
        check(record.get("instance_id") == instance, "record instance id")
        check(record.get("model", {}).get("name") == "kimi-k2", f"record model {record}")
        check(record.get("devices", {}).get("count") == 1, "record device count")
        check(record.get("kv_budget_bytes") == 64 << 20, "record KV budget")
        check(set(record.get("kv_formats", [])) == {"bf16", "fp8"}, "record KV formats")

        # Three members at once, each under its own key with its own address.
        others = [start_server() for _ in range(2)]
        members = wait_for(lambda: len(etcd.members()) == 3 and etcd.members(), 10) or {}
        check(len(members) == 3, f"{len(members)} members, expected 3")
        check(sorted(m["address"] for m in members.values()) ==
              sorted([target] + [o[1] for o in others]), "the members' addresses")
        for other, _, other_instance in others:
            other.stop()
            check(PREFIX + other_instance not in etcd.members(), "a stopped member stayed")

        # 2. Load kept fresh: sequences and decodes show within a refresh or two.
        rng = np.random.default_rng()
        with mlaserve.Client(target) as client:
            info = client.server_info()
            width = info.model.dl + info.model.dr
            for i in range(3):
                client.create_sequence(f"s{i}")
                client.append_kv(f"s{i}", 0, 0, rng.standard_normal((20, width)).astype(
                    np.float32))
            q = rng.standard_normal((1, info.model.heads, width)).astype(np.float32)
            for _ in range(20):
                client.decode([mlaserve.latent_query(f"s{i}", 0, q) for i in range(3)])
        loaded = wait_for(lambda: etcd.members().get(key, {}).get("load", {}).get(
            "sequences") == 3 and etcd.members()[key], 10)
        check(bool(loaded), f"load not refreshed: {etcd.members().get(key)}")
        if loaded:
            check(loaded["load"]["kv_used_bytes"] > 0, "load.kv_used_bytes")

        # 3. SIGTERM: the record goes at once (before the drain ends), the exit is clean.
        server.process.send_signal(signal.SIGTERM)
        server.process.wait(timeout=60)
        server.stop()  # reads the log to its end
        check(server.process.returncode == 0, f"exit {server.process.returncode}")
        check(key not in etcd.members(), "the record outlived a SIGTERM")
        check(any("cluster: left" in line for line in server.log), "no 'cluster: left' line")

        # 4. kill -9: the record disappears when its lease (3 s) runs out.
        server, target, instance = start_server(ttl=3)
        key = PREFIX + instance
        check(bool(wait_for(lambda: key in etcd.members(), 10)), "second server not registered")
        killed = time.time()
        server.process.kill()
        server.process.wait()
        gone = wait_for(lambda: key not in etcd.members(), 15)
        waited = time.time() - killed
        check(gone, "the record of a killed server did not expire")
        print(f"killed server's record gone after {waited:.1f} s (lease 3 s)")
        check(waited < 10, f"record expired only after {waited:.1f} s")

        # 5. etcd down: the server starts and serves, says so once, and registers when etcd
        # is back (with the same data directory: an etcd restart).
        etcd.stop()
        server, target, instance = start_server(ttl=3)
        key = PREFIX + instance
        # The first try comes right after "ready"; its warning may be a moment behind.
        check(bool(wait_for(lambda: any("unreachable" in line for line in server.log), 10)),
              "no warning with etcd down")
        with mlaserve.Client(target) as client:
            check(client.server_info().state.instance_id == instance, "serving with etcd down")
        etcd.start()
        check(bool(wait_for(lambda: key in etcd.members(), 20)),
              "not registered after etcd came back")
        server.stop()
        check(server.process.returncode == 0, "exit after etcd came back")
        check(key not in etcd.members(), "record left after the last SIGTERM")
        etcd.stop()

        # 6. etcd over TLS requiring client certificates (made here with openssl): a server
        # with the CA and a client certificate registers; one with the CA only is refused by
        # etcd's handshake and serves on, warning; a CA file that is no PEM stops the start
        # naming --etcd_ca.
        pki = os.path.join(directory, "pki")
        os.makedirs(pki)
        make_pki(pki)
        tls_dir = os.path.join(directory, "tls")
        os.makedirs(tls_dir)
        etcd = Etcd(args.etcd, tls_dir, PREFIX, pki=pki)
        etcd.start()
        server, target, instance = start_server(extra=[
            f"--etcd_ca={pki}/ca.pem", f"--etcd_cert={pki}/client.pem",
            f"--etcd_key={pki}/client.key"])
        check(bool(wait_for(lambda: PREFIX + instance in etcd.members(), 10)),
              "not registered in a TLS etcd")
        server.stop()
        check(PREFIX + instance not in etcd.members(), "record left in the TLS etcd")
        server, target, instance = start_server(extra=[f"--etcd_ca={pki}/ca.pem"])
        check(bool(wait_for(lambda: any("unreachable" in line for line in server.log), 10)),
              "no warning without a client certificate")
        check(PREFIX + instance not in etcd.members(), "registered without a client certificate")
        server.stop()
        bad = subprocess.run([args.server, "--listen=127.0.0.1:0", "--metrics_listen=",
                              f"--etcd_endpoints={etcd.endpoint()}",
                              f"--etcd_ca={pki}/ca.srl"], capture_output=True, text=True,
                             timeout=60)
        check(bad.returncode != 0 and "etcd_ca" in bad.stdout + bad.stderr,
              f"a bad --etcd_ca: exit {bad.returncode}, {bad.stdout + bad.stderr}")
    except Exception as error:  # a failure to report, with the logs
        failures.append(f"{type(error).__name__}: {error}")
    finally:
        for server in servers:
            server.stop()
        if etcd.process is not None:
            etcd.stop()
        shutil.rmtree(directory, ignore_errors=True)

    if failures:
        for server in servers:
            print("".join(server.log[-20:]), file=sys.stderr)
        for failure in failures:
            print("FAIL:", failure, file=sys.stderr)
        print(f"0 passed, {len(failures)} failed")
        return 1
    print("cluster_membership_test: 1 passed, 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
