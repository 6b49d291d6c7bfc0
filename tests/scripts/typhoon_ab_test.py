#!/usr/bin/python3
"""`scripts/typhoon_ab.sh` end to end on the default emulated pool: a server with TyphoonMLA
and one with `--typhoon=false` under the same load, the first planning every query hybrid and
the second none, both servers gone afterwards, and a server that cannot start failing the
script.

The device rates are overridden (`--matrix_tflops=1 --hbm_tbps=100`) so that B_theta falls
below one query: six sequences on a shared prefix then clear it on any machine.

    /usr/bin/python3 tests/scripts/typhoon_ab_test.py --bin build/bin --script scripts/typhoon_ab.sh
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

RATES = ["--matrix_tflops=1", "--hbm_tbps=100"]


def run(script, bin_dir, out, *server_flags):
    env = {**os.environ, "BIN": bin_dir, "OUT": out, "WORKERS": "1", "SEQUENCES": "6",
           "PREFIX": "256", "CONTEXT": "32", "SECONDS_PER_RUN": "2", "ROUNDS": "1"}
    return subprocess.run(["bash", script, *server_flags], capture_output=True, text=True,
                          timeout=120, env=env)


def hybrid_share(stdout, typhoon):
    for line in stdout.splitlines():
        if line.startswith(typhoon + " "):
            match = re.search(r"plans (\d+)% of queries ran hybrid", line)
            return int(match.group(1)) if match else None
    return None


def servers_left(bin_dir):
    server = os.path.realpath(os.path.join(bin_dir, "mlaserve-server"))
    left = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.path.realpath(f"/proc/{pid}/exe") == server:
                left.append(pid)
        except OSError:
            continue
    return left


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", required=True)
    parser.add_argument("--script", required=True)
    args = parser.parse_args()
    failures = []
    before = set(servers_left(args.bin))
    with tempfile.TemporaryDirectory() as tmp:
        proc = run(args.script, args.bin, os.path.join(tmp, "ab"), *RATES)
        on, off = hybrid_share(proc.stdout, "true"), hybrid_share(proc.stdout, "false")
        if proc.returncode != 0 or on is None or off is None:
            failures.append(f"the A/B did not run (exit {proc.returncode}):\n{proc.stdout}"
                            f"{proc.stderr}")
        else:
            if on != 100:
                failures.append(f"--typhoon=true planned {on}% of queries hybrid, not 100")
            if off != 0:
                failures.append(f"--typhoon=false planned {off}% of queries hybrid, not 0")
        # A server that does not start (a flag it does not know) fails the script.
        bad = run(args.script, args.bin, os.path.join(tmp, "bad"), "--no_such_flag=1")
        if bad.returncode == 0:
            failures.append("a server that could not start left the script exiting 0")
    left = set(servers_left(args.bin)) - before
    if left:
        failures.append(f"servers still running: {sorted(left)}")
    for f in failures:
        print("FAIL:", f)
    print("typhoon_ab_test:", "FAIL" if failures else "ok")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
