#!/usr/bin/python3
"""A short soak: the server binary (one kimi-k2 layer, one emulated device) under
`mlaserve-loadgen --soak` for two minutes: a churn of sequences (create on the shared prefix
and bare, AppendKv, ForkSequence, Decode with appends, ReleaseSequence), answers checked
against the fp64 golden, the server's RSS, threads and open descriptors read from its
/metrics. Checks the loadgen's verdict and its JSON, the process_* metrics against the
server's own /proc entries, a clean SIGTERM, and that neither process left a file in its
TMPDIR.

    /usr/bin/python3 tests/integration/soak_test.py --server build/bin/mlaserve-server \
        --loadgen build/bin/mlaserve-loadgen [--duration-s 120]
"""

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(metrics):
    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as r:
        body = r.read().decode()
    values = {}
    for line in body.splitlines():
        m = re.match(r"^(process_[a-z_]+) (\S+)$", line)
        if m:
            values[m.group(1)] = float(m.group(2))
    return values


def proc_view(pid):
    """The server as the kernel sees it: RSS bytes, threads, open descriptors."""
    status = open(f"/proc/{pid}/status").read()
    rss = int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) * 1024
    threads = int(re.search(r"Threads:\s+(\d+)", status).group(1))
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    return rss, threads, fds


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--loadgen", required=True)
    parser.add_argument("--duration-s", type=float, default=120)
    args = parser.parse_args()
    failures = []
    with tempfile.TemporaryDirectory(prefix="mlaserve-soak-") as scratch:
        env = dict(os.environ, TMPDIR=scratch)
        target = f"127.0.0.1:{free_port()}"
        metrics = f"127.0.0.1:{free_port()}"
        server = subprocess.Popen(
            [args.server, f"--listen={target}", f"--metrics_listen={metrics}",
             "--model=kimi-k2", "--layers=1", "--devices=1", "--kv_budget=256MiB",
             "--log_level=info"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        log = []
        ready = threading.Event()

        def drain():
            for line in server.stdout:
                log.append(line)
                if "ready: serving" in line:
                    ready.set()

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        try:
            if not ready.wait(120):
                raise RuntimeError("server not ready in 120 s:\n" + "".join(log[-20:]))

            # The process metrics against /proc, taken back to back on the idle server.
            values = scrape(metrics)
            rss, threads, fds = proc_view(server.pid)
            print(f"idle server: /metrics rss {values.get('process_resident_memory_bytes')} "
                  f"threads {values.get('process_threads')} fds {values.get('process_open_fds')}; "
                  f"/proc rss {rss} threads {threads} fds {fds}")
            for name in ("process_resident_memory_bytes", "process_virtual_memory_bytes",
                         "process_threads", "process_open_fds", "process_max_fds",
                         "process_cpu_seconds_total"):
                if name not in values:
                    failures.append(f"/metrics lacks {name}")
            if abs(values.get("process_resident_memory_bytes", 0) - rss) > 0.05 * rss:
                failures.append("process_resident_memory_bytes differs from VmRSS by over 5 %")
            if values.get("process_threads") != threads:
                failures.append("process_threads differs from /proc")
            # The scrape itself holds one more descriptor, its connection, while it is served.
            if abs(values.get("process_open_fds", 0) - fds) > 2:
                failures.append("process_open_fds differs from /proc/<pid>/fd by over 2")

            soak = subprocess.run(
                [args.loadgen, "--soak", f"--target={target}", f"--metrics-target={metrics}",
                 f"--duration-s={args.duration_s}", "--workers=2", "--sequences=6",
                 "--prefix-tokens=256", "--context-tokens=48", "--soak-min-life=2",
                 "--soak-max-life=40", "--soak-fork-fraction=0.3", "--sq=2",
                 "--soak-check-every=10", "--soak-sample-s=2",
                 f"--soak-warmup-s={args.duration_s / 3:.0f}",
                 # 2 minutes cannot tell a leak from glibc's arenas still growing to their working
                 # size (docs/performance.md, "Soak": +7 % between minutes 2 and 15 of the
                 # recorded run, most of it free memory the arenas keep). 15 % over the last
                 # minute still catches a leak of 2 KiB a call (some 13000 calls between the
                 # windows here, against about 135 MiB).
                 "--soak-max-rss-drift=0.15",
                 "--json"],
                capture_output=True, text=True, timeout=args.duration_s + 120, env=env)
            print(soak.stderr, end="")
            if soak.returncode != 0:
                failures.append(f"mlaserve-loadgen --soak exited {soak.returncode}")
            report = json.loads(soak.stdout)
            brief = {k: report[k] for k in ("passed", "failures", "calls", "calls_by_rpc",
                                            "churn", "answers", "errors")}
            brief["drift"] = report["server"].get("drift")
            print(json.dumps(brief, indent=1))
            if not report["passed"]:
                failures.append(f"soak verdict: {report['failures']}")
            answers = report["answers"]
            if answers["wrong"] != 0 or answers["checked"] < 100:
                failures.append(f"answers: {answers}")
            if report["errors"]:
                failures.append(f"errors: {report['errors']}")
            for rpc in ("CreateSequence", "AppendKv", "ForkSequence", "Decode",
                        "ReleaseSequence"):
                if report["calls_by_rpc"].get(rpc, 0) == 0:
                    failures.append(f"the churn made no {rpc} call")
            # The KV pool's resident pages, which the gate sets apart from the rest of the RSS:
            # some were written, never more than the budget, never more than the whole RSS.
            for sample in report["server"]["samples"][-1:]:
                resident = sample["kv_resident_bytes"]
                if not 0 < resident <= min(256 << 20, sample["rss_bytes"]):
                    failures.append(f"kv_resident_bytes {resident} outside (0, budget and RSS]")
            churn = report["churn"]
            if min(churn["created"], churn["forked"], churn["released"]) == 0:
                failures.append(f"churn: {churn}")
            samples = report["server"]["samples"]
            if len(samples) < args.duration_s / 2 * 0.8:
                failures.append(f"only {len(samples)} resource samples in {args.duration_s} s")
            # Everything the run created was released: the server holds no sequence.
            body = urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10).read().decode()
            if not re.search(r"^mlaserve_sequences 0$", body, re.M):
                failures.append("sequences left on the server after the soak")
        finally:
            server.send_signal(signal.SIGTERM)
            code = server.wait(timeout=60)
            reader.join(timeout=5)
        if code != 0:
            failures.append(f"server exited {code} on SIGTERM")
        left = os.listdir(scratch)
        if left:
            failures.append(f"files left in TMPDIR: {left}")
    for failure in failures:
        print("FAIL:", failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
