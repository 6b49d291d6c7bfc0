#!/usr/bin/python3
"""The server's own pool sizing against pools sized by hand, and one device's host threads,
side by side in one run (docs/performance.md, "Sizing the pool"; issue 25).

pool     make demo's workload (2-layer DeepSeek-V3, 72 sequences a rank on one 1024-token
         system prompt, 128 own tokens) through gRPC on the server binary with no pool flags
         (--devices=auto --host_threads=auto) and the load generator's default ranks
         (--workers=auto), beside hand-sized pools (N devices x C/N threads, N ranks) for N
         from the machine's CPU count C down to 1; rounds alternate the configurations, the
         best round of each counts.
threads  one emulated device with T host threads and one rank of 72 sequences, so every step
         is one 72-query batch: the device's host time per batch (p50 of the calls), and its
         speed-up over one thread.

Every figure is this machine's, named in the header (CPU model, logical cores, matrix ISA).

    python3 bench/pool_sizing.py --bin build/bin [--duration-s 10] [--rounds 2] [--json]
"""

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "integration"))
from harness import Server, free_port  # noqa: E402
from machine import cpu_line  # noqa: E402  (beside this script)

DEMO = ["--sequences=72", "--prefix-tokens=1024", "--context-tokens=128"]


def run_load(args, pool_flags, load_flags):
    """(load generator's JSON summary, the server's pool line) of one run on a fresh server."""
    target = f"127.0.0.1:{free_port()}"
    server = Server(os.path.join(args.bin, "mlaserve-server"),
                    [f"--listen={target}", "--metrics_listen=", "--layers=2", *pool_flags])
    try:
        if not server.ready(120):
            raise RuntimeError("the server did not start: " + "".join(server.log[-20:]))
        done = subprocess.run(
            [os.path.join(args.bin, "mlaserve-loadgen"), f"--target={target}",
             f"--duration-s={args.duration_s}", "--warmup-s=2", "--json", *load_flags],
            capture_output=True, text=True, timeout=args.duration_s + 300)
        if done.returncode != 0:
            raise RuntimeError(f"mlaserve-loadgen {load_flags}: exit {done.returncode}: "
                               f"{done.stderr[-400:]}")
        pool = next((line.split("pool: ", 1)[1].strip() for line in server.log
                     if "pool: " in line), "")
        return json.loads(done.stdout), pool
    finally:
        server.stop()


def pool_stage(args, cpus):
    configs = [("no flags (auto)", [], [])]
    hand = [int(d) for d in args.hand_pools.split(",")] if args.hand_pools else []
    if not hand:
        devices = cpus
        while devices >= 1:
            hand.append(devices)
            devices //= 2
    for devices in hand:
        configs.append((f"{devices} x {cpus // devices} by hand",
                        [f"--devices={devices}", f"--host_threads={cpus // devices}"],
                        [f"--workers={devices}"]))
    best = {name: None for name, _, _ in configs}
    pools = {}
    for _ in range(args.rounds):
        for name, pool_flags, load_flags in configs:
            summary, pools[name] = run_load(args, pool_flags, [*DEMO, *load_flags])
            if best[name] is None or summary["queries_per_s"] > best[name]["queries_per_s"]:
                best[name] = summary
    top = max(s["queries_per_s"] for s in best.values())
    rows = [{"pool": name, "chosen": pools[name], "workers": best[name]["workers"],
             "queries_per_s": best[name]["queries_per_s"],
             "of_best": best[name]["queries_per_s"] / top,
             "latency_p50_ms": best[name]["latency_ms"]["p50"]} for name, _, _ in configs]
    return rows


def threads_stage(args, cpus):
    rows = []
    threads = 1
    while threads <= cpus:
        summary, _ = run_load(args, ["--devices=1", f"--host_threads={threads}"],
                              [*DEMO, "--workers=1"])
        rows.append({"host_threads": threads, "batch": summary["mean_batch_size"],
                     "device_host_ms_p50": summary["device_host_ms"]["p50"],
                     "queries_per_s": summary["queries_per_s"]})
        threads *= 2
    for row in rows:
        row["speedup"] = rows[0]["device_host_ms_p50"] / row["device_host_ms_p50"]
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", default="build/bin", help="the build's bin/ folder")
    parser.add_argument("--duration-s", type=float, default=10, help="measured seconds a run")
    parser.add_argument("--rounds", type=int, default=2, help="pool stage: rounds (best counts)")
    parser.add_argument("--stages", default="pool,threads", help="pool and/or threads")
    parser.add_argument("--hand-pools", default="",
                        help="pool: device counts of the hand-sized pools (default: C, C/2, .., 1)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    args = parser.parse_args()
    cpus = len(os.sched_getaffinity(0))
    result = {"machine": cpu_line(), "duration_s": args.duration_s}
    stages = args.stages.split(",")
    if "pool" in stages:
        result["pool"] = pool_stage(args, cpus)
    if "threads" in stages:
        result["threads"] = threads_stage(args, cpus)
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"pool sizing on {result['machine']}, {args.duration_s:g} s a run")
    if "pool" in result:
        print(f"\nmake demo's workload, best of {args.rounds} rounds")
        print("| pool | ranks | queries/s | of the best | p50 ms | the server's choice |")
        print("|---|---|---|---|---|---|")
        for r in result["pool"]:
            print(f"| {r['pool']} | {r['workers']} | {r['queries_per_s']:.0f} | "
                  f"{r['of_best']:.2f}x | {r['latency_p50_ms']:.1f} | {r['chosen']} |")
    if "threads" in result:
        print("\none device, one rank of 72 sequences (a 72-query batch a step)")
        print("| host threads | mean batch | device host ms p50 | speed-up | queries/s |")
        print("|---|---|---|---|---|")
        for r in result["threads"]:
            print(f"| {r['host_threads']} | {r['batch']:.1f} | {r['device_host_ms_p50']:.2f} | "
                  f"{r['speedup']:.2f}x | {r['queries_per_s']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
