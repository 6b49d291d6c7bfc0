#!/usr/bin/python3
"""`mlaserve-bench gpu-peers` end to end on the fake GPU against the PyTorch peer on the CPU
(bench/peers/flashmla_worker.py without flash_mla): both forms, their answers compared.

The two sides read one input file, each laying the cache out in its own pages, so answers that
agree to bf16 rounding show that the file, the page tables, the causal mask, the absorbed
queries (W_UK) and the projected answers (W_UV) mean the same on both sides; a layout read
wrongly on either side gives answers of the same size as the values themselves. Also: the
temporary directory is gone afterwards, and a form the command does not know is refused with
exit status 2 naming the flag.

    /usr/bin/python3 tests/bench/gpu_peers_test.py --bench build/bin/mlaserve-bench
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile


def run(bench, tmp, *flags):
    argv = [bench, "gpu-peers", "--device=fake-gpu", f"--peer-python={sys.executable}",
            "--repeats=1", "--rounds=1", "--json", *flags]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TMPDIR": tmp})
    return proc, [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bench", required=True)
    args = parser.parse_args()
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        # Absorb: two requests of 300 keys (a partial last page) at Sq 1 and 2 (causal).
        proc, rows = run(args.bench, tmp, "--grid-batch=2", "--grid-heads=16", "--grid-sq=1,2",
                         "--grid-sk=300")
        if proc.returncode != 0 or len(rows) != 2:
            failures.append(f"absorb: exit {proc.returncode}, {len(rows)} rows: {proc.stderr[-400:]}")
        for row in rows:
            where = f"absorb sq {row['sq']}"
            if row["reference"] != "torch":
                failures.append(f"{where}: compared with {row['reference']}, not torch")
            if not row["rel_rms"] < 1e-2:
                failures.append(f"{where}: answers {row['rel_rms']:.3g} apart (RMS over RMS)")
            if not row["lse_max_diff"] < 1e-3:
                failures.append(f"{where}: LSEs {row['lse_max_diff']:.3g} apart")
            if not (row["ours_us"] > 0 and row["torch_us"] > 0):
                failures.append(f"{where}: times {row['ours_us']}, {row['torch_us']}")
        # TyphoonMLA's shapes: a 200-token prefix (ending mid-page) shared by 3 queries, 70 own.
        proc, rows = run(args.bench, tmp, "--forms=typhoon", "--batch=3", "--shared=200",
                         "--suffix=70", "--grid-sq=1")
        if proc.returncode != 0 or len(rows) != 1:
            failures.append(f"typhoon: exit {proc.returncode}, {len(rows)} rows: {proc.stderr[-400:]}")
        for row in rows:
            if not row["rel_rms"] < 2e-2:
                failures.append(f"typhoon: the hybrid's answers {row['rel_rms']:.3g} apart from "
                                "PyTorch's absorb projected by W_UV")
        left = os.listdir(tmp)
        if left:
            failures.append(f"left behind in TMPDIR: {left}")
        proc, _ = run(args.bench, tmp, "--forms=naive")
        if proc.returncode != 2 or "--forms" not in proc.stderr:
            failures.append(f"--forms=naive: exit {proc.returncode}, {proc.stderr.strip()}")
    for failure in failures:
        print("FAIL:", failure)
    print("gpu_peers_test:", "FAIL" if failures else "ok")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
