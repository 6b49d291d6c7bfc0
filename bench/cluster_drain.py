#!/usr/bin/python3
"""The time to drain a server holding N tokens (docs/performance.md, "Cluster"), side by side.

For each size: Debian's etcd and two mlaserve servers on loopback (a scratch directory this
removes), the first filled with sequences (some on a shared prompt) through the Python
client, then `mlaserve-ctl drain` moves them to the second and stops the first. The table:
tokens and bytes moved, the drain's wall time (ctl's clock, the server's own), the rate, and
how long calls naming the sequences were held for their last rows.

    PYTHONPATH=build/python /usr/bin/python3 bench/cluster_drain.py --build build
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "integration"))
import mlaserve  # noqa: E402
from etcd_harness import Etcd, wait_for  # noqa: E402
from harness import Server, free_port  # noqa: E402

CLUSTER = "drain-bench"
LAYERS = 2
PROMPT_TOKENS = 1024


def start(args, etcd):
    port = free_port()
    server = Server(os.path.join(args.build, "bin", "mlaserve-server"), [
        f"--listen=127.0.0.1:{port}", "--metrics_listen=127.0.0.1:0", f"--layers={LAYERS}",
        "--kv_budget=4GiB", f"--etcd_endpoints={etcd.endpoint()}", f"--cluster={CLUSTER}",
        "--etcd_lease_ttl_s=3"])
    if not server.ready(120):
        raise RuntimeError("".join(server.log[-20:]))
    server.address = f"127.0.0.1:{port}"
    return server


def fill(address, sequences, tokens, rng):
    """`sequences` sequences of `tokens` own tokens per layer, half on a 1024-token prompt."""
    client = mlaserve.Client(address, timeout=300)
    width = client.server_info().model.kv_row_width
    prompt = rng.standard_normal((LAYERS, PROMPT_TOKENS, width)).astype(np.float32)
    client.register_prefix("prompt", prompt)
    rows = rng.standard_normal((tokens, width)).astype(np.float32)
    for s in range(sequences):
        on_prompt = s % 2 == 0
        client.create_sequence(f"s{s}", prefix_id="prompt" if on_prompt else "")
        for layer in range(LAYERS):
            client.append_kv(f"s{s}", layer, PROMPT_TOKENS if on_prompt else 0, rows)
    client.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--etcd", default="/usr/bin/etcd")
    parser.add_argument("--sequences", type=int, default=16)
    parser.add_argument("--tokens", default="512,2048,8192",
                        help="own tokens per sequence and layer, one drain each")
    args = parser.parse_args()
    ctl = os.path.join(args.build, "bin", "mlaserve-ctl")
    rng = np.random.default_rng(1)
    scratch = tempfile.mkdtemp(prefix="mlaserve-drain-bench-")
    etcd = Etcd(args.etcd, scratch, f"/mlaserve/{CLUSTER}/servers/")
    rows = []
    try:
        etcd.start()
        for tokens in (int(t) for t in args.tokens.split(",")):
            servers = [start(args, etcd), start(args, etcd)]
            try:
                if not wait_for(lambda: len(etcd.members()) == 2, 30):
                    raise RuntimeError("the servers did not register")
                fill(servers[0].address, args.sequences, tokens, rng)
                done = subprocess.run(
                    [ctl, f"--etcd_endpoints={etcd.endpoint()}", f"--cluster={CLUSTER}",
                     f"--target={servers[0].address}", "--json", "drain"],
                    capture_output=True, text=True, timeout=600)
                if done.returncode != 0:
                    raise RuntimeError(done.stderr)
                report = json.loads(done.stdout)
                moves = report["moves"]
                servers[0].process.wait(timeout=60)
                rows.append({
                    "sequences": sum(m["sequences"] for m in moves),
                    "tokens": sum(m["tokens"] for m in moves),
                    "bytes": sum(m["bytes"] for m in moves),
                    "drain_s": report["seconds"],
                    "move_s": sum(m["seconds"] for m in moves),
                    "held_ms": max(m["held_seconds"] for m in moves) * 1000,
                })
            finally:
                for server in servers:
                    server.stop()
    finally:
        etcd.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), "unknown")
    print(f"drain of one server to another on loopback, {cpu}, {os.cpu_count()} cores; "
          f"{args.sequences} sequences, half on a {PROMPT_TOKENS}-token prompt, {LAYERS} layers")
    print(f"{'sequences':>9} {'tokens':>10} {'MiB':>9} {'drain s':>8} {'move s':>8} "
          f"{'MiB/s':>8} {'held ms':>8}")
    for r in rows:
        print(f"{r['sequences']:>9} {r['tokens']:>10} {r['bytes'] / 2**20:>9.1f} "
              f"{r['drain_s']:>8.2f} {r['move_s']:>8.2f} "
              f"{r['bytes'] / 2**20 / r['move_s']:>8.1f} {r['held_ms']:>8.1f}")


if __name__ == "__main__":
    main()
