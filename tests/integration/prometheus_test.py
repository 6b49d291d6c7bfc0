#!/usr/bin/python3
"""A real Prometheus (Debian's package) scraping a loaded server, over mutual TLS: the server
binary with TLS and a client CA, so /metrics is HTTPS that requires a client certificate;
Prometheus on loopback with a scrape job holding the CA and a client certificate; load from
mlaserve-loadgen plus a few failing calls. Then, from Prometheus' HTTP API:
  * the scrape target is up (TLS and client certificate accepted);
  * every series docs/api.md's Metrics table names has data;
  * every PromQL expression of the Grafana dashboard (deploy/grafana/mlaserve.json) returns
    data;
and `promtool check metrics` passes on a scrape. Everything runs in one scratch directory,
removed at the end, and both processes are stopped.

    /usr/bin/python3 tests/integration/prometheus_test.py --server build/bin/mlaserve-server \
        --loadgen build/bin/mlaserve-loadgen --dashboard deploy/grafana/mlaserve.json \
        --api-doc docs/api.md   (PYTHONPATH=build/python)
"""

import argparse
import json
import re
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

import grpc
import numpy as np

import mlaserve
from harness import Server, free_port, make_pki

SCRAPE_INTERVAL_S = 1
# Read from glibc's allocator (mallinfo2), so absent when a sanitizer's serves malloc.
GLIBC_HEAP_SERIES = ("mlaserve_heap_in_use_bytes", "mlaserve_heap_free_bytes")
# Series only a GPU's memory gives (the server here runs emulated devices; docs_test holds the
# fake GPU's to the table).
GPU_ONLY_SERIES = ("mlaserve_device_memory_bytes",)
RATE_WINDOW = "15s"  # what $__rate_interval stands for here: 15 scrapes


def documented_series(api_doc):
    """Metric names in the Metrics table of docs/api.md."""
    text = open(api_doc).read()
    section = text[text.index("## Metrics"):]
    section = section[:section.index("\n## ", 1)] if "\n## " in section[1:] else section
    names = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            names.update(re.findall(r"`((?:mlaserve|process)_[a-z_]+)`", line.split("|")[1]))
    return sorted(names)


def dashboard_queries(path):
    dashboard = json.load(open(path))
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = target["expr"].replace("$__rate_interval", RATE_WINDOW)
            expr = expr.replace("$instance", ".*")
            yield panel["title"], target["legendFormat"], expr


class Prometheus:
    def __init__(self, scratch, metrics_target, tls_files):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = f"{scratch}/prometheus.yml"
        with open(config, "w") as f:
            f.write(f"""global:
  scrape_interval: {SCRAPE_INTERVAL_S}s
  scrape_timeout: {SCRAPE_INTERVAL_S}s
scrape_configs:
  - job_name: mlaserve
    scheme: https
    tls_config:
      ca_file: {tls_files['ca']}
      cert_file: {tls_files['cert']}
      key_file: {tls_files['key']}
    static_configs:
      - targets: ["{metrics_target}"]
""")
        self.log = open(f"{scratch}/prometheus.log", "w")
        self.process = subprocess.Popen(
            ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={scratch}/tsdb",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT)

    def api(self, path, **params):
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=10) as r:
            answer = json.load(r)
        if answer.get("status") != "success":
            raise RuntimeError(f"{path} {params}: {answer}")
        return answer["data"]

    def wait_ready(self, timeout_s):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return True
            except OSError:
                pass
            time.sleep(0.2)
        return False

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


def scrape_https(metrics_target, tls_files):
    context = ssl.create_default_context(cafile=tls_files["ca"])
    context.load_cert_chain(tls_files["cert"], tls_files["key"])
    with urllib.request.urlopen(f"https://{metrics_target}/metrics", timeout=10,
                                context=context) as r:
        return r.read().decode()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--loadgen", required=True)
    parser.add_argument("--dashboard", required=True)
    parser.add_argument("--api-doc", required=True)
    parser.add_argument("--sanitizer-malloc", action="store_true",
                        help="the server's malloc is a sanitizer's: glibc's heap series must be "
                             "absent, not present")
    args = parser.parse_args()
    if shutil.which("prometheus") is None or shutil.which("promtool") is None:
        print("FAIL: Debian's prometheus package is not installed (scripts/install_deps.sh)")
        return 1
    failures = []
    with tempfile.TemporaryDirectory(prefix="mlaserve-prometheus-") as scratch:
        make_pki(scratch)
        tls_files = {"ca": f"{scratch}/ca.pem", "cert": f"{scratch}/client.pem",
                     "key": f"{scratch}/client.key"}
        target = f"127.0.0.1:{free_port()}"
        metrics = f"127.0.0.1:{free_port()}"
        # The client certificate (CN=tenant-a) is a tenant with a quota, so the tenant series
        # exist too.
        with open(f"{scratch}/tenants.json", "w") as f:
            json.dump({"tenants": [{"name": "tenant-a", "certificate_cn": "tenant-a",
                                    "kv_quota_bytes": 128 << 20}]}, f)
        server = Server(args.server, [
            f"--listen={target}", f"--metrics_listen={metrics}", "--layers=1", "--devices=1",
            "--kv_budget=256MiB", f"--tls_cert={scratch}/server.pem",
            f"--tls_key={scratch}/server.key", f"--tls_client_ca={scratch}/ca.pem",
            f"--auth_tokens_file={scratch}/tenants.json"])
        prometheus = None
        try:
            if not server.ready(60):
                raise RuntimeError("the server did not become ready: " + "".join(server.log))
            prometheus = Prometheus(scratch, metrics, tls_files)
            if not prometheus.wait_ready(60):
                raise RuntimeError("Prometheus did not become ready")

            # Load, then a few calls that fail (an unknown sequence), so the error series exist.
            loadgen = subprocess.run([
                args.loadgen, f"--target={target}", f"--tls_ca={tls_files['ca']}",
                f"--tls_cert={tls_files['cert']}", f"--tls_key={tls_files['key']}",
                "--workers=2", "--sequences=8", "--prefix_tokens=64", "--context_tokens=16",
                "--duration_s=12", "--connect_timeout_s=20", "--json"],
                capture_output=True, text=True, timeout=180)
            if loadgen.returncode != 0:
                failures.append(f"mlaserve-loadgen: {loadgen.stderr[-500:]}")
            with mlaserve.Client(target, tls_ca=tls_files["ca"], tls_cert=tls_files["cert"],
                                 tls_key=tls_files["key"], max_attempts=1) as client:
                heads = client.server_info().model.heads
                q = np.zeros((1, heads, 576), np.float32)
                for _ in range(3):
                    try:
                        client.decode([mlaserve.latent_query("no-such-sequence", 0, q)])
                        failures.append("a decode of an unknown sequence was answered")
                    except grpc.RpcError as e:
                        if e.code() != grpc.StatusCode.NOT_FOUND:
                            failures.append(f"unknown sequence: {e.code()}, not NOT_FOUND")
            # Two more scrapes after the last call, then ask at that time.
            time.sleep(3 * SCRAPE_INTERVAL_S)
            at = time.time()

            targets = prometheus.api("/api/v1/targets")["activeTargets"]
            health = [(t["scrapeUrl"], t["health"], t.get("lastError", "")) for t in targets]
            print("scrape targets:", health)
            if not targets or any(h != "up" for _, h, _ in health):
                failures.append(f"Prometheus cannot scrape the server over mTLS: {health}")

            series = documented_series(args.api_doc)
            missing = []
            for name in (n for n in series if n not in GPU_ONLY_SERIES):
                result = prometheus.api(
                    "/api/v1/query", query=f'{{__name__=~"{name}(_bucket|_count|_sum)?"}}',
                    time=at)["result"]
                if args.sanitizer_malloc and name in GLIBC_HEAP_SERIES:
                    if result:
                        failures.append(f"{name} is exported under a sanitizer's malloc")
                elif not result:
                    missing.append(name)
            print(f"documented series: {len(series)} asked, {len(series) - len(missing)} with data")
            if missing:
                failures.append(f"documented series without data: {missing}")

            empty = []
            queries = list(dashboard_queries(args.dashboard))
            for title, legend, expr in queries:
                try:
                    result = prometheus.api("/api/v1/query", query=expr, time=at)["result"]
                except (RuntimeError, OSError) as e:
                    failures.append(f"dashboard panel '{title}' ({legend}): {e}")
                    continue
                if not result:
                    empty.append(f"{title} ({legend}): {expr}")
            print(f"dashboard: {len(queries)} expressions, {len(queries) - len(empty)} with data")
            if empty:
                failures.append("dashboard expressions without data: " + "; ".join(empty))

            page = scrape_https(metrics, tls_files)
            check = subprocess.run(["promtool", "check", "metrics"], input=page,
                                   capture_output=True, text=True)
            print("promtool check metrics:", check.returncode, (check.stdout + check.stderr).strip())
            if check.returncode != 0 or (check.stdout + check.stderr).strip():
                failures.append(f"promtool check metrics: {check.stdout}{check.stderr}")
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
            failures.append(str(e))
        finally:
            if prometheus is not None:
                prometheus.stop()
            server.stop()
    for failure in failures:
        print("FAIL:", failure, file=sys.stderr)
    if not failures:
        print("prometheus_test: OK")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
