#!/usr/bin/python3
"""mlaserve-ctl against the server binary: info, health, prefixes, sequences and stats as
tables and as JSON, checked against what the test put in the server through the Python
client; paging through more entries than one call returns; exit status 0 on success and 2
with a message that says what is wrong on errors (a bad command or flag, no server); --limit
says when more entries exist than it listed. Then a server left to size its own pool (no
--devices) under an affinity mask of one CPU: info reports one usable CPU and a pool of one
device, chosen by the auto rule; and a server on a unix socket, which its start-up line names
(no port) and mlaserve-ctl reaches.

    /usr/bin/python3 tests/integration/ctl_test.py --server build/bin/mlaserve-server \
        --ctl build/bin/mlaserve-ctl   (PYTHONPATH=build/python)
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

import mlaserve
from harness import Server, free_port


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--ctl", required=True)
    args = parser.parse_args()
    failures = []
    target = f"127.0.0.1:{free_port()}"
    server = Server(args.server, [f"--listen={target}", "--metrics_listen=", "--layers=2",
                                  "--devices=1", "--kv_budget=256MiB"])

    def ctl(*argv, expect=0):
        run = subprocess.run([args.ctl, f"--target={target}", *argv], capture_output=True,
                             text=True, timeout=60)
        if run.returncode != expect:
            failures.append(f"mlaserve-ctl {' '.join(argv)}: exit {run.returncode}, "
                            f"expected {expect}: {run.stderr.strip()}")
        return run

    try:
        if not server.ready(60):
            raise RuntimeError("the server did not become ready: " + "".join(server.log))
        rng = np.random.default_rng()
        with mlaserve.Client(target) as client:
            info = client.server_info()
            layers, width = info.model.layers, 576
            client.register_prefix("system", rng.standard_normal((layers, 100, width)).astype(
                np.float32))
            for i in range(7):
                client.create_sequence(f"req-{i}", "system" if i % 2 == 0 else "")
            for layer in range(layers):
                client.append_kv("req-1", layer, 0,
                                 rng.standard_normal((40, width)).astype(np.float32))
            client.fork_sequence("req-1", "req-1-beam")

        text = ctl("info").stdout
        print(text)
        for needle in (info.model.name, "max_batch", "matrix unit", info.state.instance_id):
            if needle not in text:
                failures.append(f"info lacks {needle!r}")
        as_json = json.loads(ctl("info", "--json").stdout)
        if as_json["model"]["layers"] != layers:
            failures.append(f"info --json: {as_json['model']}")

        health = ctl("health")
        if health.stdout.strip() != "SERVING":
            failures.append(f"health: {health.stdout!r}")

        prefixes = json.loads(ctl("prefixes", "--json").stdout).get("prefixes", [])
        if [p["prefix_id"] for p in prefixes] != ["system"] or prefixes[0]["tokens"] != 100:
            failures.append(f"prefixes --json: {prefixes}")
        print(ctl("prefixes").stdout)

        # Pages of 3 through 8 sequences.
        listed = json.loads(ctl("sequences", "--json", "--page_size=3").stdout)["sequences"]
        ids = [s["sequence"]["sequence_id"] for s in listed]
        expected = sorted([f"req-{i}" for i in range(7)] + ["req-1-beam"])
        if ids != expected:
            failures.append(f"sequences --json --page_size=3: {ids}, expected {expected}")
        beam = next(s for s in listed if s["sequence"]["sequence_id"] == "req-1-beam")
        if beam["sequence"]["layer_lengths"] != [40] * layers or int(beam["shared_pages"]) < 1:
            failures.append(f"the fork as listed: {beam}")
        on_system = json.loads(ctl("sequences", "--json", "--prefix=system").stdout)
        on_ids = [s["sequence"]["sequence_id"] for s in on_system.get("sequences", [])]
        if on_ids != ["req-0", "req-2", "req-4", "req-6"]:
            failures.append(f"sequences --prefix=system: {on_ids}")
        limited = json.loads(ctl("sequences", "--json", "--limit=2").stdout)
        if len(limited["sequences"]) != 2 or limited.get("next_page_token") != \
                limited["sequences"][-1]["sequence"]["sequence_id"]:
            failures.append(f"sequences --limit=2 --json: {limited}")
        # --limit at the count, with pages of its size: nothing more, so nothing said of more.
        for argv, more in ((["--limit=2"], True), (["--limit=8", "--page_size=4"], False),
                           (["--limit=7", "--page_size=7"], True)):
            shown = ctl("sequences", *argv).stdout.strip().splitlines()[-1]
            if ("the server holds more" in shown) != more:
                failures.append(f"sequences {' '.join(argv)}: last line {shown!r}")
        if "next_page_token" in json.loads(ctl("sequences", "--json", "--limit=8").stdout):
            failures.append("sequences --limit=8 --json of 8: a next_page_token")
        table = ctl("sequences").stdout
        print(table)
        if "req-1-beam" not in table or not table.rstrip().endswith("\n8 sequence(s)"):
            failures.append(f"sequences table: {table}")

        stats = json.loads(ctl("stats", "--json").stdout)
        if int(stats["sequences"]) != 8 or int(stats["prefixes"]) != 1:
            failures.append(f"stats --json: {stats}")
        print(ctl("stats").stdout)

        # Errors: exit 2 and a message naming the problem.
        for argv, needle in ((["no-such-command"], "unknown command"),
                             (["sequences", "--page_size=0"], "--page_size"),
                             ([], "COMMAND")):
            run = ctl(*argv, expect=2)
            if needle not in run.stderr:
                failures.append(f"mlaserve-ctl {argv}: stderr {run.stderr!r} lacks {needle!r}")
        unreachable = subprocess.run(
            [args.ctl, f"--target=127.0.0.1:{free_port()}", "--timeout_s=2", "health"],
            capture_output=True, text=True, timeout=60)
        said = unreachable.stderr + unreachable.stdout
        if unreachable.returncode != 2 or not ("UNAVAILABLE" in said or "DEADLINE" in said):
            failures.append(f"health of nothing: exit {unreachable.returncode}, "
                            f"{unreachable.stderr!r}")
    except (RuntimeError, OSError, subprocess.TimeoutExpired, json.JSONDecodeError,
            KeyError) as e:
        failures.append(f"{type(e).__name__}: {e}")
    finally:
        server.stop()
    check_auto_pool(args, failures)
    check_unix_socket(args, failures)
    for failure in failures:
        print("FAIL:", failure, file=sys.stderr)
    if not failures:
        print("ctl_test: OK")
    return 1 if failures else 0


def check_auto_pool(args, failures):
    """--devices=auto under `taskset -c <one CPU>`: the server sees one usable CPU."""
    cpu = min(os.sched_getaffinity(0))
    target = f"127.0.0.1:{free_port()}"
    server = Server("taskset", ["-c", str(cpu), args.server, f"--listen={target}",
                                "--metrics_listen=", "--layers=1", "--kv_budget=64MiB"])
    try:
        if not server.ready(60):
            raise RuntimeError("the one-CPU server did not become ready: " + "".join(server.log))
        run = subprocess.run([args.ctl, f"--target={target}", "--json", "info"],
                             capture_output=True, text=True, timeout=60)
        info = json.loads(run.stdout)
        host = info["host"]
        if host.get("usable_cpus") != 1 or len(info["devices"]) != 1:
            failures.append(f"one CPU: usable_cpus {host.get('usable_cpus')}, "
                            f"{len(info['devices'])} devices")
        if not host.get("pool_sizing", "").startswith("auto: "):
            failures.append(f"one CPU: pool_sizing {host.get('pool_sizing')!r}")
        if not any("pool: 1 device(s) x 1 host thread(s)" in line for line in server.log):
            failures.append("one CPU: no start-up line names the pool: " + "".join(server.log))
    except (RuntimeError, OSError, subprocess.TimeoutExpired, json.JSONDecodeError,
            KeyError) as e:
        failures.append(f"one CPU: {type(e).__name__}: {e}")
    finally:
        server.stop()


def check_unix_socket(args, failures):
    """--listen=unix:PATH: the start-up line names the socket, and mlaserve-ctl reaches it."""
    with tempfile.TemporaryDirectory(prefix="mlaserve-ctl-unix-") as d:
        address = f"unix:{d}/mlaserve.sock"
        server = Server(args.server, [f"--listen={address}", "--metrics_listen=", "--layers=1",
                                      "--devices=1", "--kv_budget=64MiB"])
        try:
            if not server.ready(60):
                raise RuntimeError("the unix-socket server did not become ready: " +
                                   "".join(server.log))
            listening = next((line for line in server.log if "listening:" in line), "")
            if f"gRPC on {address} (" not in listening:
                failures.append(f"unix socket: the start-up line does not name it: {listening!r}")
            run = subprocess.run([args.ctl, f"--target={address}", "health"],
                                 capture_output=True, text=True, timeout=60)
            if run.returncode != 0 or run.stdout.strip() != "SERVING":
                failures.append(f"unix socket: health exit {run.returncode}: {run.stdout!r} "
                                f"{run.stderr!r}")
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
            failures.append(f"unix socket: {type(e).__name__}: {e}")
        finally:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
