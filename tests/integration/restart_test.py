#!/usr/bin/python3
"""Restarts that keep the cache, on the real server binary with --state_dir:

* SIGTERM, then a new start on the same directory: every sequence (bf16 and FP8, on a prefix
  tree, forked, long) answers the same decode bit for bit, GetServerInfo.state says which
  instance the state came from, and every answer's initial metadata carries the new
  instance id;
* kill -9 at random moments while --snapshot_interval_s saves run (a long sequence makes
  each save take a while, so kills land inside saves): every start after it restores a whole
  state, never a torn one, and answers bit for bit as before;
* a corrupt state file: the server starts empty, says so in one log line, keeps the file
  aside, and serves.

The server runs with tenants (--auth_tokens_file) and the state is a tenant's, so this is also
the Python client's bearer token end to end, and tenants kept across restarts: after each one
the tenant's ids are its own again, and a caller without the token gets UNAUTHENTICATED.

    /usr/bin/python3 tests/integration/restart_test.py --server build/bin/mlaserve-server
        (PYTHONPATH=build/python)
"""

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import grpc
import numpy as np

import mlaserve
from mlaserve.v1 import server_info_pb2

SERVING = b"\x08\x01"
LAYERS = 2
LONG_TOKENS = 12000  # ~28 MB of bf16 rows over both layers: a save takes tens of ms
TOKEN = "restart-test-tenant-token"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_serving(target, timeout=120):
    check = grpc.insecure_channel(target).unary_unary(
        "/grpc.health.v1.Health/Check", request_serializer=lambda x: x,
        response_deserializer=lambda x: x)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check(b"", timeout=1.0) == SERVING:
                return True
        except grpc.RpcError:
            time.sleep(0.05)
    return False


class Server:
    def __init__(self, binary, state_dir, log, extra=()):
        self.target = f"127.0.0.1:{free_port()}"
        tokens = state_dir.rstrip("/") + "-tokens.json"
        with open(tokens, "w") as f:
            json.dump({"tenants": [{"name": "team", "token_sha256":
                                    hashlib.sha256(TOKEN.encode()).hexdigest()}]}, f)
        self.process = subprocess.Popen(
            [binary, f"--listen={self.target}", "--metrics-listen=", f"--layers={LAYERS}",
             "--kv-budget=256MiB", "--devices=1", "--page-size=64", f"--state_dir={state_dir}",
             f"--auth_tokens_file={tokens}", *extra], stdout=log, stderr=subprocess.STDOUT)
        if not wait_serving(self.target):
            self.process.kill()
            raise RuntimeError("the server never became SERVING")
        self.client = mlaserve.Client(self.target, token=TOKEN)

    def stop(self):
        self.client.close()
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=60)

    def kill(self):
        self.client.close()
        self.process.kill()
        self.process.wait(timeout=30)


def state_and_metadata(client):
    """GetServerInfo's state, and the instance id in the answer's initial metadata."""
    info, call = client._stub.GetServerInfo.with_call(server_info_pb2.GetServerInfoRequest(),
                                                      timeout=10, metadata=client._metadata)
    metadata = dict(call.initial_metadata())
    return info.state, metadata.get("mlaserve-instance-id")


def populate(client, rng):
    info = client.server_info()
    heads, width = info.model.heads, info.model.kv_row_width

    def rows(n):
        return (rng.standard_normal((n, width)) * 0.5).astype(np.float32)

    client.register_prefix("system", np.stack([rows(100) for _ in range(LAYERS)]))
    client.register_prefix("tools", np.stack([rows(37) for _ in range(LAYERS)]),
                           parent_id="system")
    client.register_prefix("p8", np.stack([rows(80) for _ in range(LAYERS)]), kv_dtype="fp8")
    client.create_sequence("a", "system")
    client.create_sequence("b", "tools")
    client.create_sequence("f8", "p8")
    client.create_sequence("long")
    for layer in range(LAYERS):
        client.append_kv("a", layer, 100, rows(21))
        client.append_kv("b", layer, 137, rows(70))
        client.append_kv("f8", layer, 80, rows(9))
        client.append_kv("long", layer, 0, rows(LONG_TOKENS))
    client.fork_sequence("a", "a-fork")
    client.append_kv("a-fork", 0, 121, rows(3))
    client.release_prefix("tools")  # b keeps it alive, anonymous
    queries = []
    for sequence in ("a", "a-fork", "b", "f8", "long"):
        for layer in range(LAYERS):
            q = (rng.standard_normal((1, heads, width)) * 0.5).astype(np.float32)
            queries.append(mlaserve.latent_query(sequence, layer, q))
    return queries


def answers(client, queries):
    results = client.decode(queries, output_dtype="fp32")
    return [(r.out.tobytes(), r.lse.tobytes()) for r in results]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--loadgen", help="mlaserve-loadgen, run as the tenant at the end")
    args = parser.parse_args()
    rng = np.random.default_rng()
    failures = []
    state_dir = tempfile.mkdtemp(prefix="mlaserve-restart-test-")
    log = tempfile.TemporaryFile(mode="w+")
    try:
        # 1. SIGTERM keeps everything.
        first = Server(args.server, state_dir, log)
        queries = populate(first.client, rng)
        before = answers(first.client, queries)
        first_state, first_meta = state_and_metadata(first.client)
        if first_state.restored_from_instance_id:
            failures.append("a first start on an empty directory says it restored a state")
        if first_meta != first_state.instance_id or len(first_meta or "") != 32:
            failures.append(f"metadata instance id {first_meta!r}, info {first_state.instance_id!r}")
        if first.stop() != 0:
            failures.append("the first server did not exit 0 after SIGTERM")

        second = Server(args.server, state_dir, log, ["--snapshot_interval_s=0.05"])
        state, meta = state_and_metadata(second.client)
        if state.instance_id == first_state.instance_id:
            failures.append("the instance id did not change across a restart")
        if state.restored_from_instance_id != first_state.instance_id:
            failures.append(f"restored from {state.restored_from_instance_id!r}, "
                            f"want {first_state.instance_id!r}")
        if state.restored_sequences != 5 or state.restored_prefixes != 3:
            failures.append(f"restored {state.restored_sequences} sequences and "
                            f"{state.restored_prefixes} prefixes, want 5 and 3")
        if meta != state.instance_id:
            failures.append("the answer's metadata does not carry the new instance id")
        if answers(second.client, queries) != before:
            failures.append("after SIGTERM and a restart the answers differ")
        try:
            mlaserve.Client(second.target).get_sequence("a")
            failures.append("a caller without the token reached the tenant's sequence")
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.UNAUTHENTICATED:
                failures.append(f"a caller without the token: {error.code()}")
        second.client.create_sequence("a", "system")  # a retried create is still a retry

        # 2. kill -9 while periodic saves run: each start restores a whole state.
        server, torn = second, 0
        for kill in range(args.kills):
            time.sleep(random.uniform(0.1, 0.6))
            server.kill()
            if os.path.exists(os.path.join(state_dir, "kv-state.mlakv.tmp")):
                torn += 1
            server = Server(args.server, state_dir, log, ["--snapshot_interval_s=0.05"])
            state, _ = state_and_metadata(server.client)
            if state.restored_sequences != 5:
                failures.append(f"kill {kill}: restored {state.restored_sequences} sequences")
            if answers(server.client, queries) != before:
                failures.append(f"kill {kill}: the answers differ after kill -9 and a restart")
        print(f"kill -9 x {args.kills}: {torn} landed inside a save (a temporary file left)")

        # 3. A corrupt file: start empty, say so, keep it aside.
        if server.stop() != 0:
            failures.append("the server did not exit 0 after SIGTERM")
        path = os.path.join(state_dir, "kv-state.mlakv")
        with open(path, "r+b") as f:
            f.seek(os.path.getsize(path) // 2)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0xFF]))
        empty = Server(args.server, state_dir, log)
        state, _ = state_and_metadata(empty.client)
        if state.restored_from_instance_id or state.restored_sequences:
            failures.append("a corrupt state file was restored")
        try:
            empty.client.get_sequence("a")
            failures.append("a sequence from the corrupt file is served")
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.NOT_FOUND:
                failures.append(f"get_sequence after a corrupt file: {error.code()}")
        if not os.path.exists(path + ".bad"):
            failures.append("the corrupt file was not kept aside as kv-state.mlakv.bad")
        if args.loadgen:
            # The load generator as the tenant (its token from a file), and without a token.
            token_file = state_dir + "/loadgen.token"
            with open(token_file, "w") as f:
                f.write(TOKEN + "\n")
            common = [args.loadgen, f"--target={empty.target}", "--duration-s=2", "--workers=1",
                      "--sequences=4", "--prefix-tokens=64", "--context-tokens=16"]
            run = subprocess.run(common + [f"--auth_token_file={token_file}"],
                                 capture_output=True, text=True, timeout=120)
            if run.returncode != 0:
                failures.append(f"loadgen with the tenant's token exited {run.returncode}: "
                                f"{run.stderr[-2000:]}")
            run = subprocess.run(common, capture_output=True, text=True, timeout=120)
            if run.returncode == 0 or "UNAUTHENTICATED" not in run.stdout + run.stderr:
                failures.append("loadgen without a token was not refused UNAUTHENTICATED")
        empty.stop()
    finally:
        log.seek(0)
        output = log.read()
        log.close()
        shutil.rmtree(state_dir, ignore_errors=True)
        tokens = state_dir + "-tokens.json"
        if os.path.exists(tokens):
            os.remove(tokens)
    for line in ("state: no saved KV state", "state: saved", "state: restored",
                 "state: cannot restore the KV state"):
        if line not in output:
            failures.append(f"the server's log lacks a '{line}' line")
    if failures:
        print("server log:\n" + output[-20000:])
        for failure in failures:
            print("FAILED:", failure)
        return 1
    print("restart test: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
