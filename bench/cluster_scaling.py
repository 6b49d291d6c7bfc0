#!/usr/bin/python3
"""Scaling of a cluster on etcd, side by side in one run (docs/performance.md, "Cluster").

Starts Debian's etcd and up to three mlaserve servers on loopback (in a scratch directory it
removes), and runs two workloads through mlaserve-loadgen's cluster client on 1, 2 and 3
servers: make demo's (sequences on a shared system prompt) and a KV-bound one (no shared
prompt, long contexts), in two forms: the same traffic on every cluster size (6 ranks, so
that whole rank groups can spread) and traffic grown with the cluster (2 ranks a server).
Each size runs through one cluster client for every rank, through a client per rank, through
clients that each place alone (--placement_groups=false, the rule before placement groups),
and by plain hashing of sequence ids (the loadgen's --target list).

Where the machine has the cores (--cores-per-server, auto: (CPUs - 4) / 3 when that is at
least 2), each server runs pinned to its own CPUs with cores / --host-threads emulated devices
of --host-threads host threads each, and the load generator and etcd on the CPUs left, so
servers do not fight over cores; otherwise every process shares them.

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
import shutil
import subprocess
import sys
import tempfile
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

TITLES = {
    "prompt": "make demo's workload: ranks x 72 sequences on a 1024-token prompt, 128 own tokens, "
              "16-64 steps",
    "kv": "KV-bound: ranks x 24 sequences, no shared prompt, 4096 own tokens, 16-64 steps",
}
FORMS = {
    "same": "the same traffic on every size (6 ranks)",
    "grown": "traffic grown with the cluster (2 ranks a server)",
}


def loadgen(binary, destination, workload, workers, duration_s, warmup_s, cpus=None):
    flags = ["--continuous", f"--workers={workers}", *WORKLOADS[workload], f"--duration-s={duration_s}",
             f"--warmup-s={warmup_s}", "--json", "--quiet"]
    pinned = ["taskset", "-c", cpus] if cpus else []
    done = subprocess.run([*pinned, binary, *destination, *flags], capture_output=True, text=True,
                          timeout=duration_s + warmup_s + 300)
    if done.returncode != 0:
        raise RuntimeError(f"mlaserve-loadgen {' '.join(destination)} failed "
                           f"({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout)["points"][0]


def measure(args, workload, form, name, servers, destination, ranks):
    before = [scrape(s["metrics"]) for s in servers]
    point = loadgen(args.loadgen, destination, workload, ranks, args.duration_s, args.warmup_s,
                    args.client_cpus)
    after = [scrape(s["metrics"]) for s in servers]
    # Device time per server over its devices: the makespan if the devices were the limit.
    makespan = max((a[0] - b[0]) / max(1, a[1]) for a, b in zip(after, before))
    queries = [a[2] - b[2] for a, b in zip(after, before)]
    measured = point["measured_s"] + point["warmup_s"]
    tokens = point["tokens_per_s"] * point["measured_s"]
    mean = sum(queries) / max(1, len(queries))
    return {
        "workload": workload,
        "form": form,
        "ranks": ranks,
        "run": name,
        "servers": len(servers),
        "busiest_over_mean": max(queries) / mean if mean > 0 else 0.0,
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
    flags = [f"--listen=127.0.0.1:{port}", f"--metrics_listen=127.0.0.1:{metrics}", "--layers=2",
             f"--etcd_endpoints={etcd.endpoint()}", f"--cluster={CLUSTER}", "--etcd_lease_ttl_s=3"]
    if args.cores_per_server:
        first = index * args.cores_per_server
        cpus = f"{first}-{first + args.cores_per_server - 1}"
        devices = max(1, args.cores_per_server // args.host_threads)
        server = Server("taskset", ["-c", cpus, args.server, *flags, f"--devices={devices}",
                                    f"--host_threads={args.host_threads}"])
    else:
        server = Server(args.server, flags)
    if not server.ready(120):
        raise RuntimeError("server did not start:\n" + "".join(server.log[-20:]))
    return {"server": server, "address": f"127.0.0.1:{port}", "metrics": f"127.0.0.1:{metrics}"}


def print_table(rows, args):
    where = (f"each server pinned to {args.cores_per_server} CPUs of its own, "
             f"{max(1, args.cores_per_server // args.host_threads)} emulated devices x "
             f"{args.host_threads} host threads, the load generator and etcd on CPUs "
             f"{args.client_cpus}"
             if args.cores_per_server else
             "default devices per server; servers and load generator share the cores")
    print(f"cluster scaling on {cpu_line()}, {args.duration_s:g} s per run (2 layers; {where})")
    for workload in WORKLOADS:
        for form in FORMS:
            chosen = [r for r in rows if r["workload"] == workload and r["form"] == form]
            if chosen:
                print()
                print(f"{TITLES[workload]}; {FORMS[form]}")
                print_rows(chosen)


def print_rows(rows):
    head = (f"{'run':<40} {'servers':>7} {'ranks':>5} {'tok/s':>8} {'x1':>6} {'TPOT p50':>9} "
            f"{'TPOT p99':>9} {'hybrid':>7} {'modelled tok/s':>15} {'x1':>6} {'errors':>6} "
            f"{'max/mean':>8}  queries per server")
    print(head)
    base = rows[0]

    def ratio(value, of):
        return value / of if of > 0 else 0.0
    for r in rows:
        print(f"{r['run']:<40} {r['servers']:>7} {r['ranks']:>5} {r['tokens_per_s']:>8.1f} "
              f"{ratio(r['tokens_per_s'], base['tokens_per_s']):>6.2f} {r['tpot_p50_ms']:>7.1f}ms "
              f"{r['tpot_p99_ms']:>7.1f}ms {r['hybrid_fraction']:>7.2f} "
              f"{r['modeled_tokens_per_s']:>15.0f} "
              f"{ratio(r['modeled_tokens_per_s'], base['modeled_tokens_per_s']):>6.2f} {r['errors']:>6} "
              f"{r['busiest_over_mean']:>8.2f}  "
              f"{' / '.join(str(int(q)) for q in r['queries_per_server'])}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--etcd", default="/usr/bin/etcd")
    parser.add_argument("--duration-s", type=float, default=10)
    parser.add_argument("--warmup-s", type=float, default=2)
    parser.add_argument("--workloads", default="prompt,kv",
                        help="comma-separated: prompt (make demo's), kv (KV-bound)")
    parser.add_argument("--forms", default="same,grown",
                        help="comma-separated: same (6 ranks on every size), grown (2 ranks a "
                             "server)")
    parser.add_argument("--variants", default="shared,per-rank,alone,hashing",
                        help="comma-separated, for 2 and 3 servers: shared (one cluster client), "
                             "per-rank (a client per rank), alone (a client per rank, without "
                             "placement groups), hashing (plain hashing of sequence ids)")
    parser.add_argument("--sizes", default="1,2,3", help="cluster sizes, comma-separated")
    parser.add_argument("--cores-per-server", default="auto",
                        help="CPUs each server is pinned to (0: no pinning; auto: (CPUs - 4) / 3 "
                             "when at least 2)")
    parser.add_argument("--host-threads", type=int, default=1,
                        help="with pinned servers: host threads per emulated device (the "
                             "server then has cores-per-server / host-threads devices)")
    parser.add_argument("--json", action="store_true", help="print the rows as one JSON list")
    args = parser.parse_args()
    args.workloads = args.workloads.split(",")
    args.forms = args.forms.split(",")
    args.variants = args.variants.split(",")
    args.sizes = [int(n) for n in args.sizes.split(",")]
    cpus = sorted(os.sched_getaffinity(0))
    if args.cores_per_server == "auto":
        args.cores_per_server = (len(cpus) - 4) // 3 if (len(cpus) - 4) // 3 >= 2 else 0
    args.cores_per_server = int(args.cores_per_server)
    args.client_cpus = None
    if args.cores_per_server:
        left = cpus[max(args.sizes) * args.cores_per_server:]
        if not left:
            parser.error("--cores-per-server leaves no CPU for the load generator")
        args.client_cpus = ",".join(str(c) for c in left)
    args.server = os.path.join(args.build, "bin", "mlaserve-server")
    args.loadgen = os.path.join(args.build, "bin", "mlaserve-loadgen")

    scratch = tempfile.mkdtemp(prefix="mlaserve-cluster-scaling-")
    etcd = Etcd(args.etcd, scratch, f"/mlaserve/{CLUSTER}/servers/")
    rows = []
    try:
        etcd.start()
        through_cluster = ["--etcd_endpoints", etcd.endpoint(), f"--cluster={CLUSTER}"]
        # (workload, form, name, servers, ranks, flags): each run on servers started for it,
        # so none carries KV or statistics from the one before.
        plan = []
        for workload in args.workloads:
            for form in args.forms:
                for n in args.sizes:
                    ranks = 6 if form == "same" else 2 * n
                    s_ = "s" * (n > 1)
                    plan.append((workload, form, f"cluster client, {n} server{s_}", n, ranks,
                                 through_cluster))
                    if n == 1:
                        continue
                    if "per-rank" in args.variants:
                        # Each rank its own client, as data-parallel ranks.
                        plan.append((workload, form, f"client per rank, {n} servers", n, ranks,
                                     [*through_cluster, "--client_per_rank"]))
                    if "alone" in args.variants:
                        plan.append((workload, form, f"client per rank, alone, {n} servers", n,
                                     ranks, [*through_cluster, "--client_per_rank",
                                             "--placement_groups=false"]))
                    if "hashing" in args.variants:
                        plan.append((workload, form, f"plain hashing of ids, {n} servers", n,
                                     ranks, "sequence"))
                if workload == "kv" and form == "same" and "context" in args.variants:
                    # Context parallel: every sequence cut in three parts of 1366 positions,
                    # one per server, each decode fanned out to the three and merged by LSE.
                    plan.append((workload, form, "context parallel (3 parts), 3 servers", 3,
                                 6, [*through_cluster, "--context_part_tokens=1366"]))
        if "shared" not in args.variants:
            plan = [p for p in plan if not p[2].startswith("cluster client") or p[3] == 1]
        for workload, form, name, n, ranks, flags in plan:
            servers = []
            try:
                for i in range(n):
                    servers.append(start_server(args, etcd, scratch, i))
                if not wait_for(lambda: len(etcd.members()) == n, 30):
                    raise RuntimeError(f"{n} servers did not all register")
                if isinstance(flags, str):  # a --target list, spread by MultiTarget
                    flags = [f"--target={','.join(s['address'] for s in servers)}",
                             f"--spread={flags}"]
                rows.append(measure(args, workload, form, name, servers, flags, ranks))
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
        print_table(rows, args)


if __name__ == "__main__":
    main()
