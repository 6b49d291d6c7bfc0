#!/usr/bin/python3
"""mlaserve-ctl drain, then a kill -9, under load, every part a real process: Debian's etcd
on loopback, three server binaries in one cluster, mlaserve-loadgen driving make demo's
workload through the cluster client. Midway, `mlaserve-ctl drain` moves one server's
sequences to the others and stops it: the server exits cleanly and leaves etcd, the load
generator finishes with no failed call (its client follows the moved sequences), `mlaserve-ctl
members` lists the two left. Then, under a second load run, one of those two is killed: only
calls carrying its sequences fail (UNAVAILABLE), new sequences go to the survivor, and a run
after it has no error.

    /usr/bin/python3 tests/integration/cluster_drain_test.py --build build --etcd /usr/bin/etcd
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from etcd_harness import Etcd, wait_for
from harness import Server, free_port

CLUSTER = "drain-test"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", required=True)
    parser.add_argument("--etcd", default="/usr/bin/etcd")
    args = parser.parse_args()
    binary = lambda name: os.path.join(args.build, "bin", name)
    scratch = tempfile.mkdtemp(prefix="mlaserve-drain-test-")
    etcd = Etcd(args.etcd, scratch, f"/mlaserve/{CLUSTER}/servers/")
    servers = []
    loadgen = None
    try:
        etcd.start()
        for _ in range(3):
            port = free_port()
            server = Server(binary("mlaserve-server"), [
                f"--listen=127.0.0.1:{port}", "--metrics_listen=127.0.0.1:0", "--layers=2",
                # The three share this machine's CPUs rather than each sizing to all of them.
                f"--devices={max(1, len(os.sched_getaffinity(0)) // 3)}", "--host_threads=1",
                f"--etcd_endpoints={etcd.endpoint()}", f"--cluster={CLUSTER}",
                "--etcd_lease_ttl_s=3"])
            server.address = f"127.0.0.1:{port}"
            servers.append(server)
        for server in servers:
            assert server.ready(120), "".join(server.log[-20:])
        assert wait_for(lambda: len(etcd.members()) == 3, 30), etcd.members()
        cluster = [f"--etcd_endpoints={etcd.endpoint()}", f"--cluster={CLUSTER}"]

        loadgen = subprocess.Popen(
            [binary("mlaserve-loadgen"), *cluster, "--continuous", "--workers=2",
             "--sequences=24", "--system-prompts=256", "--context-tokens=64",
             "--steps-dist=uniform:8,32", "--duration-s=8", "--warmup-s=1", "--json", "--quiet"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(4)
        # The busiest server goes (it holds the prompt's group).
        ctl = subprocess.run([binary("mlaserve-ctl"), *cluster, "--json", "members"],
                             capture_output=True, text=True, timeout=30)
        assert ctl.returncode == 0, ctl.stderr
        members = json.loads(ctl.stdout)["members"]
        assert len(members) == 3, members
        busiest = max(members, key=lambda m: m["load"]["sequences"])
        assert busiest["load"]["sequences"] > 0, members
        drained = next(s for s in servers if s.address == busiest["address"])
        start = time.time()
        ctl = subprocess.run([binary("mlaserve-ctl"), *cluster, f"--target={drained.address}",
                              "--json", "drain"], capture_output=True, text=True, timeout=120)
        assert ctl.returncode == 0, f"drain failed: {ctl.stderr}"
        report = json.loads(ctl.stdout)
        moved = sum(m["sequences"] for m in report["moves"])
        print(f"drain: {moved} sequences, "
              f"{sum(m['tokens'] for m in report['moves'])} tokens in {report['seconds']:.3f} s "
              f"(held {max([m['held_seconds'] for m in report['moves']] or [0]) * 1000:.1f} ms)")
        assert moved > 0, report
        assert drained.process.wait(timeout=60) == 0, "".join(drained.log[-20:])
        drain_s = time.time() - start
        assert busiest["instance_id"] not in "".join(etcd.members()), etcd.members()

        out, err = loadgen.communicate(timeout=120)
        if loadgen.returncode != 0:
            try:  # the failed calls by code, which the report's head would cut off
                summary = json.dumps([p.get("errors_by_code") for p in json.loads(out)["points"]])
            except (ValueError, KeyError):
                summary = out[-1500:]
            raise AssertionError(f"loadgen failed ({loadgen.returncode}): {err[-2000:]} "
                                 f"errors by code: {summary}")
        point = json.loads(out)["points"][0]
        assert point["errors"] == 0, point["errors_by_code"]
        assert point["tokens"] > 0, point
        ctl = subprocess.run([binary("mlaserve-ctl"), *cluster, "--json", "members"],
                             capture_output=True, text=True, timeout=30)
        assert ctl.returncode == 0, ctl.stderr
        left = json.loads(ctl.stdout)["members"]
        assert len(left) == 2 and drained.address not in [m["address"] for m in left], left
        print(f"drained {drained.address} in {drain_s:.2f} s to exit; load: "
              f"{point['tokens']} tokens, 0 errors")

        # kill -9 of one of the two left, under load: calls that carry its sequences fail
        # (UNAVAILABLE, and nothing else), the run goes on placing new sequences on the
        # survivor and ends on time; a run after it sees no error at all.
        def run_load(duration_s):
            return subprocess.Popen(
                [binary("mlaserve-loadgen"), *cluster, "--client_per_rank", "--continuous",
                 "--workers=2", "--sequences=16", "--system-prompts=256",
                 "--context-tokens=64", "--steps-dist=uniform:8,32",
                 f"--duration-s={duration_s}", "--warmup-s=1", "--json", "--quiet"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

        loadgen = run_load(8)
        time.sleep(4)
        victim = next(s for s in servers if s is not drained and s.process.poll() is None)
        survivor = next(s for s in servers if s is not drained and s is not victim)
        victim.process.kill()
        victim.process.wait()
        out, err = loadgen.communicate(timeout=120)
        point = json.loads(out)["points"][0]
        assert set(point["errors_by_code"]) <= {"UNAVAILABLE"}, point["errors_by_code"]
        assert point["tokens"] > 0, point
        assert wait_for(lambda: len(etcd.members()) == 1, 30), etcd.members()
        loadgen = run_load(3)
        out, err = loadgen.communicate(timeout=120)
        assert loadgen.returncode == 0, err[-2000:]
        after = json.loads(out)["points"][0]
        assert after["errors"] == 0 and after["tokens"] > 0, after["errors_by_code"]
        print(f"kill -9 of {victim.address} under load: {point['errors']} calls failed "
              f"(UNAVAILABLE), {point['tokens']} tokens; after it, on {survivor.address}: "
              f"{after['tokens']} tokens, 0 errors")
        print("PASS")
    finally:
        if loadgen is not None and loadgen.poll() is None:
            loadgen.kill()
            loadgen.wait()
        for server in servers:
            server.stop()
        etcd.stop()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
