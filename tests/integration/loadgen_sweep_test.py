#!/usr/bin/python3
"""A sweep end to end: the server binary (one kimi-k2 layer, one emulated device) under
`mlaserve-loadgen --sweep=sequences:2,4 --out PREFIX` (two short points, PREFIX in a folder
the sweep has to make; an --out that cannot be written refused before the first point), then
client/loadgen/plot_sweep.py on the JSON it wrote. Checks the exit statuses, the JSON's
schema fields (command, client machine, server with GetServerInfo, sweep, knee, one point
per value with every report field), the CSV (one row per value, exactly the columns
docs/loadgen.md documents, the server and client columns equal to the JSON's), the three
plots as valid PNGs and SVGs, nothing left on the server, a clean SIGTERM, and nothing left
behind: every file goes to a temporary directory (also the processes' TMPDIR and
matplotlib's cache) that is removed at the end. About 15 s on two cores.

    /usr/bin/python3 tests/integration/loadgen_sweep_test.py \
        --server build/bin/mlaserve-server --loadgen build/bin/mlaserve-loadgen \
        --plot-script client/loadgen/plot_sweep.py --doc docs/loadgen.md
"""

import argparse
import csv
import json
import os
import re
import subprocess
import sys
import tempfile
import urllib.request
import xml.etree.ElementTree as ET

from harness import Server, free_port

VALUES = (2, 4)
PLOTS = ("throughput", "cdf", "shares")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PERCENTILE_FIELDS = ("tpot_ms", "call_latency_us", "queue_us", "device_modeled_us",
                     "device_host_us", "admission_wait_ms")
POINT_FIELDS = ("value", "measured_s", "warmup_s", "sequences_arrived", "sequences_finished",
                "tokens", "tokens_per_s", "queries_per_s", "calls", "errors", "shares",
                "hybrid_fraction", "goodput", "slo_met", "tpot_cdf_ms") + PERCENTILE_FIELDS


def documented_csv_columns(doc):
    """The column names of docs/loadgen.md's CSV table (the one after "The CSV has one row
    per point"), in order."""
    with open(doc, encoding="utf-8") as f:
        text = f.read()
    start = text.index("The CSV has one row per point")
    columns = []
    for line in text[start:].splitlines()[1:]:
        if not line.strip():
            if columns:
                break
            continue
        if not line.startswith("|"):
            break
        first_cell = line.split("|")[1]
        columns += re.findall(r"`([a-z0-9_]+)`", first_cell)
    return columns


def check_json(result, failures):
    def expect(ok, what):
        if not ok:
            failures.append(f"JSON: {what}")

    expect(result.get("schema") == "mlaserve-loadgen-sweep/1", f"schema {result.get('schema')}")
    expect("--sweep=sequences:2,4" in result.get("command", ""), "command lacks the sweep")
    client = result.get("client", {})
    for key in ("cpu", "isa", "cores", "hostname"):
        expect(client.get(key) not in (None, ""), f"client.{key} missing: {client}")
    server = result.get("server", {})
    expect(server.get("model") == "kimi-k2" and server.get("layers") == 1
           and server.get("devices") == 1, f"server {server}")
    for key in ("heads", "device", "version", "cpu", "matrix_unit"):
        expect(server.get(key) not in (None, ""), f"server.{key} missing")
    expect(server.get("info", {}).get("state", {}).get("instance_id"),
           "server.info (GetServerInfo) lacks the instance id")
    expect(result.get("sweep") == {"variable": "sequences", "unit": "sequences per rank",
                                   "values": list(VALUES)}, f"sweep {result.get('sweep')}")
    expect(result.get("slo_tpot_ms") == 10000, f"slo_tpot_ms {result.get('slo_tpot_ms')}")
    expect(result.get("stopped_early") is False, f"stopped early: {result.get('stop_reason')}")
    knee = result.get("knee") or {}
    expect(knee.get("index") in range(len(VALUES)) and knee.get("value") in VALUES,
           f"knee {knee}")
    points = result.get("points", [])
    expect([p.get("value") for p in points] == list(VALUES),
           f"points at {[p.get('value') for p in points]}")
    for p in points:
        name = f"point {p.get('value')}"
        missing = [f for f in POINT_FIELDS if f not in p]
        expect(not missing, f"{name} lacks {missing}")
        if missing:
            continue
        for field in PERCENTILE_FIELDS:
            keys = set(p[field])
            expect({"p50", "p90", "p99", "max", "mean"} <= keys, f"{name}: {field} has {keys}")
        expect(p["errors"] == 0 and p["calls"] > 0, f"{name}: {p['calls']} calls, "
               f"{p['errors']} errors")
        expect(p["tokens_per_s"] > 0 and p["sequences_finished"] > 0,
               f"{name}: {p['tokens_per_s']} tokens/s, {p['sequences_finished']} finished")
        expect(0 < p["tpot_ms"]["p50"] <= p["tpot_ms"]["p99"], f"{name}: tpot {p['tpot_ms']}")
        cdf = p["tpot_cdf_ms"]
        expect(0 < len(cdf) <= 200 and cdf == sorted(cdf), f"{name}: tpot_cdf_ms {cdf[:5]}...")
        total = sum(p["shares"].values())
        expect(abs(total - 1) < 1e-6, f"{name}: shares add up to {total}")
        expect(p["slo_met"] is True and p["goodput"]["sequences"] == 1,
               f"{name}: a 10 s SLO missed: {p['goodput']}")


def check_csv(path, result, columns, failures):
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    header, body = rows[0], rows[1:]
    if header != columns:
        failures.append(f"CSV header differs from docs/loadgen.md's columns: only in the CSV "
                        f"{[c for c in header if c not in columns]}, only in the doc "
                        f"{[c for c in columns if c not in header]}, or another order")
    if [len(r) for r in body] != [len(header)] * len(VALUES):
        failures.append(f"CSV: rows of {[len(r) for r in body]} fields, expected "
                        f"{len(VALUES)} of {len(header)}")
        return
    server, client = result["server"], result["client"]
    constant = {
        "server_version": server["version"],
        "server_instance_id": server["info"]["state"]["instance_id"],
        "server_model": server["model"], "server_layers": str(server["layers"]),
        "server_devices": str(server["devices"]), "server_device": server["device"],
        "server_cpu": server["cpu"], "server_matrix_unit": server["matrix_unit"],
        "servers": "1", "client_cpu": client["cpu"], "client_isa": client["isa"],
        "client_cores": str(client["cores"]), "client_hostname": client["hostname"]}
    for value, row in zip(VALUES, body):
        fields = dict(zip(header, row))
        if float(fields.get("value", "nan")) != value:
            failures.append(f"CSV row {row[:1]}: expected the value {value}")
        for column, expected in constant.items():
            if fields.get(column) != expected:
                failures.append(f"CSV row {value}: {column} is {fields.get(column)!r}, the "
                                f"JSON says {expected!r}")
        point = result["points"][VALUES.index(value)]
        if int(fields.get("sequences_finished", -1)) != point["sequences_finished"]:
            failures.append(f"CSV row {value}: sequences_finished differs from the JSON")


def check_plots(script, source, env, failures):
    """The script as docs/loadgen.md runs it, writing next to the JSON."""
    import matplotlib  # here, once MPLCONFIGDIR points into the scratch directory
    matplotlib.use("Agg")
    import matplotlib.image

    prefix = source[:-len(".json")]
    done = subprocess.run([sys.executable, script, source],
                          capture_output=True, text=True, timeout=120, env=env)
    if done.returncode != 0:
        failures.append(f"plot_sweep.py: exit {done.returncode}: {done.stderr.strip()}")
        return
    expected = sorted(f"{prefix}-{plot}.{ext}" for plot in PLOTS for ext in ("png", "svg"))
    if sorted(done.stdout.split()) != expected:
        failures.append(f"plot_sweep.py printed {done.stdout.split()}, expected {expected}")
    for path in expected:
        if not os.path.isfile(path):
            failures.append(f"{path} was not written")
        elif path.endswith(".png"):
            with open(path, "rb") as f:
                if f.read(len(PNG_SIGNATURE)) != PNG_SIGNATURE:
                    failures.append(f"{path}: no PNG signature")
                    continue
            shape = matplotlib.image.imread(path).shape
            if len(shape) != 3 or shape[0] <= 100 or shape[1] <= 100:
                failures.append(f"{path}: implausible shape {shape}")
        else:
            try:
                root = ET.parse(path).getroot()
                if root.tag not in ("svg", "{http://www.w3.org/2000/svg}svg"):
                    failures.append(f"{path}: root <{root.tag}>")
            except ET.ParseError as e:
                failures.append(f"{path}: not XML: {e}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--loadgen", required=True)
    parser.add_argument("--plot-script", required=True)
    parser.add_argument("--doc", required=True, help="docs/loadgen.md, for the CSV's columns")
    args = parser.parse_args()
    failures = []
    columns = documented_csv_columns(args.doc)
    with tempfile.TemporaryDirectory(prefix="mlaserve-sweep-") as scratch:
        env = dict(os.environ, TMPDIR=scratch, MPLCONFIGDIR=os.path.join(scratch, "mpl"))
        os.environ["MPLCONFIGDIR"] = env["MPLCONFIGDIR"]
        target = f"127.0.0.1:{free_port()}"
        metrics = f"127.0.0.1:{free_port()}"
        server = Server(args.server, [f"--listen={target}", f"--metrics_listen={metrics}",
                                      "--model=kimi-k2", "--layers=1", "--devices=1",
                                      "--kv_budget=256MiB"], env=env)
        code = None
        try:
            if not server.ready(60):
                raise RuntimeError("server not ready in 60 s:\n" + "".join(server.log[-20:]))
            # A folder that does not exist yet: the sweep makes it.
            prefix = os.path.join(scratch, "results", "today", "sweep")
            # One that cannot be: refused at once, exit 2, before any point runs.
            blocked = os.path.join(scratch, "a-file")
            open(blocked, "w").close()
            refused = subprocess.run(
                [args.loadgen, f"--target={target}", "--sweep=sequences:2", "--workers=1",
                 "--duration-s=30", f"--out={os.path.join(blocked, 'sweep')}"],
                capture_output=True, text=True, timeout=20, env=env)
            if refused.returncode != 2 or "--out" not in refused.stderr:
                failures.append(f"--out under a file: exit {refused.returncode}, "
                                f"{refused.stderr.strip()!r}")
            sweep = subprocess.run(
                [args.loadgen, f"--target={target}",
                 f"--sweep=sequences:{','.join(map(str, VALUES))}", "--workers=1",
                 "--system-prompts=64", "--context-dist=fixed:16", "--steps-dist=uniform:2,6",
                 "--duration-s=2", "--warmup-s=1", "--slo-tpot-ms=10000", "--quiet",
                 "--run-id=sweep-test", f"--out={prefix}"],
                capture_output=True, text=True, timeout=120, env=env)
            print(sweep.stdout, end="")
            print(sweep.stderr, end="", file=sys.stderr)
            if sweep.returncode != 0:
                failures.append(f"mlaserve-loadgen --sweep exited {sweep.returncode}")
            rows = [line for line in sweep.stdout.splitlines()
                    if re.match(rf"^  ({'|'.join(map(str, VALUES))}) ", line)]
            if len(rows) != len(VALUES):
                failures.append(f"the table has {len(rows)} rows, expected {len(VALUES)}")
            for ext in ("json", "csv"):
                if not os.path.isfile(f"{prefix}.{ext}"):
                    failures.append(f"--out wrote no {prefix}.{ext}")
            if not failures:
                with open(f"{prefix}.json", encoding="utf-8") as f:
                    result = json.load(f)
                check_json(result, failures)
                if not failures:
                    check_csv(f"{prefix}.csv", result, columns, failures)
                check_plots(args.plot_script, f"{prefix}.json", env, failures)
            # Everything the sweep created was released.
            body = urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10).read().decode()
            for gauge in ("mlaserve_sequences", 'mlaserve_prefixes{state="registered"}'):
                if not re.search(rf"^{re.escape(gauge)} 0$", body, re.M):
                    failures.append(f"{gauge} is not 0 after the sweep")
        except (OSError, RuntimeError, subprocess.TimeoutExpired, ValueError, KeyError) as e:
            failures.append(f"{type(e).__name__}: {e}")
        finally:
            server.process.terminate()
            try:
                code = server.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.process.kill()
                server.process.wait()
            server.stop()
        if code != 0:
            failures.append(f"server exited {code} on SIGTERM")
    if os.path.exists(scratch):
        failures.append(f"{scratch} was not removed")
    for failure in failures:
        print("FAIL:", failure, file=sys.stderr)
    if not failures:
        print("loadgen_sweep_test: OK")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
