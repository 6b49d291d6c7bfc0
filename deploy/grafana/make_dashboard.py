#!/usr/bin/python3
"""Writes mlaserve.json, the Grafana dashboard of deploy/grafana (docs/deploy.md, "Grafana"),
from the panel list below: one place for each panel's title, unit and PromQL, so the JSON
stays consistent. tests/integration/prometheus_test.py runs every expression against a live
Prometheus scraping a loaded server.

    /usr/bin/python3 deploy/grafana/make_dashboard.py
"""

import json
import os

DATASOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
SEL = 'instance=~"$instance"'
RATE = "$__rate_interval"


def quantiles(metric, extra=""):
    """p50 and p99 of a histogram, across the selected instances."""
    sel = SEL + extra
    return [(f"histogram_quantile({q}, sum by (le) (rate({metric}_bucket{{{sel}}}[{RATE}])))",
             f"p{int(q * 100)}") for q in (0.5, 0.99)]


# (title, unit, [(expr, legend)], description)
PANELS = [
    ("Decode throughput", "reqps",
     [(f"sum by (instance) (rate(mlaserve_decode_queries_total{{{SEL}}}[{RATE}]))", "{{instance}}")],
     "Answered decode queries per second (one query = one sequence at one layer)."),
    ("Calls by method", "reqps",
     [(f"sum by (rpc) (rate(mlaserve_requests_total{{{SEL}}}[{RATE}]))", "{{rpc}}")],
     "Finished RPCs per second."),
    ("Decode call latency", "s", quantiles("mlaserve_request_duration_seconds", ',rpc="Decode"'),
     "From receiving a Decode to answering it."),
    ("Decode calls by transport", "reqps",
     [(f'sum by (transport) (rate(mlaserve_requests_total{{rpc="Decode",{SEL}}}[{RATE}]))',
       "{{transport}}")],
     "Decode calls per second over gRPC and over the same-host data plane (shm)."),
    ("Data plane memory", "bytes",
     [(f"sum by (instance) (mlaserve_data_plane_registered_bytes{{{SEL}}})", "{{instance}} registered"),
      (f"max by (instance) (mlaserve_data_plane_registered_bytes_limit{{{SEL}}})", "{{instance}} limit")],
     "Memory clients registered with the data plane, against --data_plane_memory_mb."),
    ("Queue wait", "s", quantiles("mlaserve_decode_queue_seconds"),
     "Time a decode query waited to be batched."),
    ("Device time per batch", "s",
     [(e, "host " + l) for e, l in quantiles("mlaserve_batch_device_host_seconds")] +
     [(e, "modelled " + l) for e, l in quantiles("mlaserve_batch_device_modeled_seconds")],
     "Host wall time of a device batch's work and its modelled device time, once per batch."),
    ("Batch size", "short",
     quantiles("mlaserve_batch_queries") +
     [(f"sum(rate(mlaserve_batch_queries_sum{{{SEL}}}[{RATE}])) / "
       f"sum(rate(mlaserve_batch_queries_count{{{SEL}}}[{RATE}]))", "mean")],
     "Queries per device batch."),
    ("Plan mix", "short",
     [(f"sum by (formulation) (rate(mlaserve_batch_groups_total{{{SEL}}}[{RATE}]))",
       "{{formulation}} groups/s")],
     "Prefix groups planned per second by formulation: TyphoonMLA's hybrid or absorb-only."),
    ("KV cache used", "percentunit",
     [(f'sum by (instance) (mlaserve_kv_bytes{{kind="used",{SEL}}}) / '
       f'sum by (instance) (mlaserve_kv_bytes{{kind="budget",{SEL}}})', "{{instance}}")],
     "Share of --kv_budget in use."),
    ("KV pages", "short",
     [(f"sum by (state) (mlaserve_kv_pages{{{SEL}}})", "{{state}}")],
     "Pages by state."),
    ("Sequences and prefixes held", "short",
     [(f"sum(mlaserve_sequences{{{SEL}}})", "sequences"),
      (f"sum by (state) (mlaserve_prefixes{{{SEL}}})", "prefixes {{state}}")],
     "Live sequences; registered prefixes and released ones still referenced."),
    ("Evictions", "short",
     [(f"sum by (kind) (rate(mlaserve_evictions_total{{{SEL}}}[{RATE}]))", "{{kind}}")],
     "LRU evictions per second under memory pressure."),
    ("Device utilisation (modelled)", "percentunit",
     [(f"sum by (instance, device) (rate(mlaserve_device_modeled_busy_seconds_total{{{SEL}}}[{RATE}]))",
       "{{instance}} device {{device}}")],
     "Modelled busy seconds per wall second, per emulated device."),
    ("Errors by code", "reqps",
     [(f'sum by (rpc, code) (rate(mlaserve_requests_total{{code!="OK",{SEL}}}[{RATE}]))',
       "{{rpc}} {{code}}")],
     "Failed RPCs per second by method and gRPC status code."),
    ("Decode queries waiting", "short",
     [(f"sum by (instance) (mlaserve_decode_queued{{{SEL}}})", "{{instance}}")],
     "Queries queued for a batch right now."),
    ("Server memory", "bytes",
     [(f"process_resident_memory_bytes{{{SEL}}}", "{{instance}} RSS")],
     "Resident memory of each server."),
]


def panel(index, title, unit, targets, description):
    return {
        "id": index + 1,
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "gridPos": {"h": 8, "w": 12, "x": 12 * (index % 2), "y": 8 * (index // 2)},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"},
                    "tooltip": {"mode": "multi"}},
        "targets": [{"datasource": DATASOURCE, "expr": expr, "legendFormat": legend,
                     "refId": chr(ord("A") + i)} for i, (expr, legend) in enumerate(targets)],
    }


def dashboard():
    return {
        "__inputs": [{"name": "DS_PROMETHEUS", "label": "Prometheus", "type": "datasource",
                      "pluginId": "prometheus", "pluginName": "Prometheus"}],
        "title": "mlaserve",
        "uid": "mlaserve",
        "description": "MLA decode attention servers (docs/deploy.md, Grafana)",
        "tags": ["mlaserve"],
        "schemaVersion": 37,
        "version": 1,
        "editable": True,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": [{
            "name": "instance", "label": "server", "type": "query", "datasource": DATASOURCE,
            "query": {"query": "label_values(mlaserve_host_info, instance)", "refId": "instance"},
            "definition": "label_values(mlaserve_host_info, instance)",
            "includeAll": True, "multi": True, "allValue": ".*", "refresh": 2,
            "current": {"text": "All", "value": "$__all"}}]},
        "panels": [panel(i, *p) for i, p in enumerate(PANELS)],
    }


if __name__ == "__main__":
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mlaserve.json")
    with open(path, "w") as f:
        json.dump(dashboard(), f, indent=2)
        f.write("\n")
