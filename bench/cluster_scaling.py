#!/usr/bin/python3
"""Scaling of a cluster on etcd, side by side in one run (docs/performance.md, "Cluster").

Starts Debian's etcd and up to three mlaserve servers on loopback (in a scratch directory it
removes), and runs two workloads through mlaserve-loadgen's cluster client on 1, 2 and 3
servers: make demo's (sequences on a shared system prompt) and a KV-bound one (no shared
prompt, long contexts). make demo's also runs on the 3 servers by plain hashing of sequence
ids and by one server per system prompt (the loadgen's --target list), for the hybrid
fraction each placement keeps.

For each run: output tokens/s and p99 time per output token (wall clock, on this machine's
cores, shared by every server and the load generator), the fraction of queries that ran
TyphoonMLA's hybrid form, how the decode queries spread over the servers, and the modelled
device rate: output tokens over the busiest server's modelled device time (its
mlaserve_device_modeled_busy_seconds_total over its devices), what the emulated NPUs would
sustain when the host is not the limit.

    /usr/bin/python3 bench/cluster_scaling.py --build build [--duration-s 10] [--json]
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "integration"))
from etcd_harness import Etcd, wait_for  # noqa: E402
from harness import Server, free_port  # noqa: E402
from machine import cpu_line  # noqa: E402  (beside this script)

CLUSTER = "scaling"


def scrape(metrics):
    """(modelled busy seconds summed over devices, devices, decode queries) of one server."""
    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as page:
        text = page.read().decode()
    busy = devices = queries = 0.0
    for line in text.splitlines():
        if line.startswith("mlaserve_device_modeled_busy_seconds_total"):
            busy += float(line.split()[-1])
            devices += 1
        elif line.startswith("mlaserve_decode_queries_total"):
            queries += float(line.split()[-1])
    return busy, int(devices), queries


# make demo's workload (ranks x sequences on one system prompt), and one bound by KV reads:
# no shared prompt, long own contexts, every query absorb-only over its own cache.
WORKLOADS = {
    "prompt": ["--sequences=72", "--system-prompts=1024", "--context-tokens=128",
               "--steps-dist=uniform:16,64"],
    "kv": ["--sequences=24", "--system-prompts=0", "--context-tokens=4096",
           "--max-context-tokens=4096", "--steps-dist=uniform:16,64"],
}


def loadgen(binary, destination, workload, workers, duration_s, warmup_s):
    flags = ["--continuous", f"--workers={workers}", *WORKLOADS[workload], f"--duration-s={duration_s}",
             f"--warmup-s={warmup_s}", "--json", "--quiet"]
    done = subprocess.run([binary, *destination, *flags], capture_output=True, text=True,
                          timeout=duration_s + warmup_s + 300)
    if done.returncode != 0:
        raise RuntimeError(f"mlaserve-loadgen {' '.join(destination)} failed "
                           f"({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout)["points"][0]


def measure(args, workload, name, servers, destination):
    before = [scrape(s["metrics"]) for s in servers]
    # The same traffic on every cluster size (two ranks): what adding servers does to it. (Two
    # ranks per server instead drowns this machine's two cores: the TPOT grows sevenfold.)
    point = loadgen(args.loadgen, destination, workload, 2, args.duration_s, args.warmup_s)
    after = [scrape(s["metrics"]) for s in servers]
    # Device time per server over its devices: the makespan if the devices were the limit.
    makespan = max((a[0] - b[0]) / max(1, a[1]) for a, b in zip(after, before))
    queries = [a[2] - b[2] for a, b in zip(after, before)]
    measured = point["measured_s"] + point["warmup_s"]
    tokens = point["tokens_per_s"] * point["measured_s"]
    return {
        "workload": workload,
        "run": name,
        "servers": len(servers),
        "tokens_per_s": point["tokens_per_s"],
        "tpot_p50_ms": point["tpot_ms"]["p50"],
        "tpot_p99_ms": point["tpot_ms"]["p99"],
        "hybrid_fraction": point["hybrid_fraction"],
        "errors": point["errors"],
        "queries_per_server": queries,
        # Output tokens of the whole run (warm-up included, as the busy counters are) over the
        # busiest server's device time.
        "modeled_tokens_per_s": (point["tokens_per_s"] * measured / makespan
                                 if makespan > 0 else 0.0),
        "tokens": tokens,
    }


def start_server(args, etcd, scratch, index):
    port, metrics = free_port(), free_port()
    server = Server(args.server, [
        f"--listen=127.0.0.1:{port}", f"--metrics_listen=127.0.0.1:{metrics}", "--layers=2",
        f"--etcd_endpoints={etcd.endpoint()}", f"--cluster={CLUSTER}", "--etcd_lease_ttl_s=3"])
    if not server.ready(120):
        raise RuntimeError("server did not start:\n" + "".join(server.log[-20:]))
    return {"server": server, "address": f"127.0.0.1:{port}", "metrics": f"127.0.0.1:{metrics}"}


def print_table(rows, duration_s):
    print(f"cluster scaling on {cpu_line()}, {duration_s:g} s per run (2 layers, 2 emulated "
          "devices per server; servers and load generator share the cores)")
    for workload in WORKLOADS:
        chosen = [r for r in rows if r["workload"] == workload]
        if chosen:
            print()
            print(TITLES[workload])
            print_rows(chosen)


def print_rows(rows):
    head = (f"{'run':<34} {'servers':>7} {'tok/s':>8} {'x1':>6} {'TPOT p50':>9} "
            f"{'TPOT p99':>9} {'hybrid':>7} {'modelled tok/s':>15} {'x1':>6} {'errors':>6}  queries per server")
    print(head)
    base = rows[0]
    for r in rows:
        print(f"{r['run']:<34} {r['servers']:>7} {r['tokens_per_s']:>8.1f} "
              f"{r['tokens_per_s'] / base['tokens_per_s']:>6.2f} {r['tpot_p50_ms']:>7.1f}ms "
              f"{r['tpot_p99_ms']:>7.1f}ms {r['hybrid_fraction']:>7.2f} "
              f"{r['modeled_tokens_per_s']:>15.0f} "
              f"{r['modeled_tokens_per_s'] / base['modeled_tokens_per_s']:>6.2f} {r['errors']:>6}  "
              f"{' / '.join(str(int(q)) for q in r['queries_per_server'])}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--etcd", default="/usr/bin/etcd")
    parser.add_argument("--duration-s", type=float, default=10)
    parser.add_argument("--warmup-s", type=float, default=2)
    parser.add_argument("--workloads", default="prompt,kv",
                        help="comma-separated: prompt (make demo's), kv (KV-bound)")
    parser.add_argument("--json", action="store_true", help="print the rows as one JSON list")
    args = parser.parse_args()
    args.workloads = args.workloads.split(",")
    args.server = os.path.join(args.build, "bin", "mlaserve-server")
    args.loadgen = os.path.join(args.build, "bin", "mlaserve-loadgen")

    scratch = tempfile.mkdtemp(prefix="mlaserve-cluster-scaling-")
    etcd = Etcd(args.etcd, scratch, f"/mlaserve/{CLUSTER}/servers/")
    rows = []
    try:
        etcd.start()
        through_cluster = ["--etcd_endpoints", etcd.endpoint(), f"--cluster={CLUSTER}"]
        # (workload, name, servers, flags): each run on servers started for it, so none
        # carries KV or statistics from the one before.
        plan = []
        for workload in args.workloads:
            for n in (1, 2, 3):
                plan.append((workload, f"cluster client, {n} server{'s' * (n > 1)}", n, through_cluster))
                if workload == "prompt" and n > 1:
                    # Each rank its own client, as data-parallel ranks: a rank's sequences on
                    # the prompt stay together in its calls, where TyphoonMLA's groups form.
                    plan.append((workload, f"client per rank, {n} servers", n,
                                 [*through_cluster, "--client_per_rank"]))
            if workload == "prompt":
                plan.append((workload, "3 servers, plain hashing of ids", 3, "sequence"))
                plan.append((workload, "3 servers, one server per prompt", 3, "prefix"))
            if workload == "kv":
                # Context parallel: every sequence cut in three parts of 1366 positions, one
                # per server, each decode fanned out to the three and merged by LSE.
                plan.append((workload, "3 servers, context parallel (3 parts)", 3,
                             [*through_cluster, "--context_part_tokens=1366"]))
        for workload, name, n, flags in plan:
            servers = []
            try:
                for i in range(n):
                    servers.append(start_server(args, etcd, scratch, i))
                if not wait_for(lambda: len(etcd.members()) == n, 30):
                    raise RuntimeError(f"{n} servers did not all register")
                if isinstance(flags, str):  # a --target list, spread by MultiTarget
                    flags = [f"--target={','.join(s['address'] for s in servers)}",
                             f"--spread={flags}"]
                rows.append(measure(args, workload, name, servers, flags))
            finally:
                for s_ in servers:
                    s_["server"].stop()
                wait_for(lambda: len(etcd.members()) == 0, 30)
    finally:
        etcd.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    if args.json:
        print(json.dumps(rows))
    else:
        print_table(rows, args.duration_s)


if __name__ == "__main__":
    main()
