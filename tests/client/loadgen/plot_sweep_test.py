#!/usr/bin/python3
"""client/loadgen/plot_sweep.py on results written here (no server, no load generator): a
three-point rate sweep with an SLO and a knee, and a single run without either, each give
six files, PNGs that decode to a plausible size and SVGs that parse; a file with another
schema, one without points, one that is not JSON and one that does not exist give exit
status 2 and a message saying so.

    /usr/bin/python3 tests/client/loadgen/plot_sweep_test.py \
        [--script client/loadgen/plot_sweep.py]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

import matplotlib

matplotlib.use("Agg")

import matplotlib.image  # noqa: E402

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                     ".."))
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PLOTS = ("throughput", "cdf", "shares")


def point(value, tokens_per_s, p50, p99, shares, cdf):
    """One point as the load generator writes it; the numbers only need to be plausible."""
    queue, device = shares
    return {
        "value": value, "measured_s": 10.0, "warmup_s": 2.0, "sequences_arrived": 12,
        "sequences_finished": len(cdf), "sequences_unfinished": 2, "tokens": 500,
        "tokens_per_s": tokens_per_s, "queries_per_s": 61 * tokens_per_s, "calls": 1000,
        "errors": 0, "errors_by_code": {},
        "tpot_ms": {"mean": p50 * 1.1, "p50": p50, "p90": (p50 + p99) / 2, "p99": p99},
        "call_latency_us": {"mean": 160.0, "p50": 150.0, "p90": 200.0, "p99": 300.0},
        "queue_us": {"mean": 20.0, "p50": 15.0, "p99": 60.0},
        "device_modeled_us": {"mean": 90.0, "p50": 85.0, "p99": 150.0},
        "device_host_us": {"mean": 100.0, "p50": 95.0, "p99": 170.0},
        "admission_wait_ms": {"mean": 0.0, "p50": 0.0, "p99": 0.0},
        "shares": {"queue": queue, "device": device, "overhead": 1 - queue - device},
        "hybrid_fraction": 0.4,
        "goodput": {"sequences": 0.9, "tokens": 0.95, "tokens_per_s": 0.95 * tokens_per_s},
        "slo_met": p99 <= 50, "tpot_cdf_ms": sorted(cdf)}


def context(sweep, slo, knee, points):
    """The whole result around `points`."""
    return {
        "schema": "mlaserve-loadgen-sweep/1",
        "command": "mlaserve-loadgen --sweep=rate:1,2,4 --slo_tpot_ms=50",
        "client": {"cpu": "AMD EPYC 9654", "isa": "AVX-512 BF16", "cores": 2, "hostname": "h"},
        "server": {"model": "deepseek-v3", "layers": 2, "heads": 128, "devices": 2,
                   "device": "ascend910-die", "version": "0.1.0", "matrix_unit": "oneDNN"},
        "sweep": sweep, "slo_tpot_ms": slo, "knee": knee, "stopped_early": False,
        "stop_reason": "", "points": points}


def rate_sweep():
    """Three points of a rate sweep, the last over the SLO (and without finished sequences,
    so the CDF has to skip it), the knee at the second."""
    points = [point(1, 50.0, 9.0, 20.0, (0.125, 0.625), [5.1 + 0.1 * i for i in range(10)]),
              point(2, 95.0, 14.0, 42.0, (0.2, 0.6), [8.0 + 0.5 * i for i in range(20)]),
              point(4, 110.0, 40.0, 90.0, (0.5, 0.4), [])]
    return context({"variable": "rate", "unit": "sequences/s", "values": [1, 2, 4]}, 50.0,
                   {"index": 1, "value": 2,
                    "reason": "highest throughput with p99 TPOT within the SLO"}, points)


def single_run():
    """One run without a sweep, an SLO or a knee."""
    return context({"variable": "", "unit": "", "values": []}, None, None,
                   [point(None, 80.0, 12.0, 30.0, (0.1, 0.7), [10.0, 11.0, 12.5])])


def run(script, *argv):
    return subprocess.run([sys.executable, script, *argv], capture_output=True, text=True,
                          timeout=120)


def check_png(path):
    """A problem with the PNG at `path`, or None."""
    with open(path, "rb") as f:
        if f.read(len(PNG_SIGNATURE)) != PNG_SIGNATURE:
            return f"{path}: no PNG signature"
    shape = matplotlib.image.imread(path).shape
    if len(shape) != 3 or shape[0] <= 100 or shape[1] <= 100:
        return f"{path}: implausible shape {shape}"
    return None


def check_svg(path):
    """A problem with the SVG at `path`, or None."""
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as e:
        return f"{path}: not XML: {e}"
    if root.tag not in ("svg", "{http://www.w3.org/2000/svg}svg"):
        return f"{path}: root is <{root.tag}>, not <svg>"
    return None


def check_plots(script, directory, name, result, failures):
    """Writes `result` as NAME.json, plots it with --out, checks the six files."""
    source = os.path.join(directory, f"{name}.json")
    with open(source, "w", encoding="utf-8") as f:
        json.dump(result, f)
    prefix = os.path.join(directory, "plots", name)
    os.makedirs(os.path.dirname(prefix), exist_ok=True)
    done = run(script, source, "--out", prefix)
    if done.returncode != 0:
        failures.append(f"{name}: exit {done.returncode}: {done.stderr.strip()}")
        return
    expected = [f"{prefix}-{plot}.{ext}" for plot in PLOTS for ext in ("png", "svg")]
    printed = done.stdout.split()
    if sorted(printed) != sorted(expected):
        failures.append(f"{name}: printed {printed}, expected {expected}")
    for path in expected:
        if not os.path.isfile(path):
            failures.append(f"{name}: {path} was not written")
            continue
        problem = check_png(path) if path.endswith(".png") else check_svg(path)
        if problem:
            failures.append(f"{name}: {problem}")
    print(f"{name}: {len(expected)} files under {os.path.dirname(prefix)}")


def check_error(script, argv, needle, failures):
    """The script on `argv` exits 2 with `needle` in its stderr."""
    done = run(script, *argv)
    if done.returncode != 2 or needle not in done.stderr:
        failures.append(f"plot_sweep {argv}: exit {done.returncode}, stderr "
                        f"{done.stderr.strip()!r}; expected exit 2 and {needle!r}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--script", default=os.path.join(REPO, "client", "loadgen",
                                                         "plot_sweep.py"))
    args = parser.parse_args()
    failures = []
    with tempfile.TemporaryDirectory() as directory:
        try:
            check_plots(args.script, directory, "rate", rate_sweep(), failures)
            check_plots(args.script, directory, "single", single_run(), failures)

            wrong = rate_sweep()
            wrong["schema"] = "mlaserve-loadgen-sweep/0"
            empty = rate_sweep()
            empty["points"] = []
            for name, text, needle in (("wrong", json.dumps(wrong), "schema"),
                                       ("empty", json.dumps(empty), "no points"),
                                       ("truncated", json.dumps(wrong)[:40], "JSON")):
                path = os.path.join(directory, f"{name}.json")
                with open(path, "w", encoding="utf-8") as f:
                    f.write(text)
                check_error(args.script, [path], needle, failures)
            missing = os.path.join(directory, "no-such-result.json")
            check_error(args.script, [missing], "no-such-result.json", failures)
        except (OSError, subprocess.TimeoutExpired, ValueError) as e:
            failures.append(f"{type(e).__name__}: {e}")
    for failure in failures:
        print("FAIL:", failure, file=sys.stderr)
    if not failures:
        print("plot_sweep_test: OK")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
