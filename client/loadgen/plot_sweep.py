#!/usr/bin/python3
"""Plots of an mlaserve-loadgen sweep (its JSON file, schema "mlaserve-loadgen-sweep/1", as
SweepJson in client/loadgen/continuous_report.cc writes it), as PNG for a quick look and
SVG for documents:

    client/loadgen/plot_sweep.py RESULT.json [--out PREFIX]

writes PREFIX-throughput, PREFIX-cdf and PREFIX-shares (.png and .svg each; PREFIX is
RESULT without .json by default) and prints each path it wrote on its own line:

* throughput: p50 and p99 TPOT against tokens/s, one marker per point in sweep order, the
  SLO and the knee when the run has them: where the latency starts to buy no throughput;
* cdf: each point's per-sequence mean TPOT as an empirical CDF, against the SLO: the tail
  a p99 hides;
* shares: the mean call latency split into queue, device and overhead per point: what
  grows as load does.

Exit status 2 with a message on stderr for a file that cannot be read, is not JSON, has
another schema or has no points. Needs only Debian's python3-matplotlib (Agg, no display).
"""

import argparse
import json
import math
import sys

import matplotlib

matplotlib.use("Agg")  # files only: never look for a display

import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

SCHEMA = "mlaserve-loadgen-sweep/1"
FIGSIZE = (8.0, 5.0)  # inches; at DPI that is 800 x 500 pixels
DPI = 100
SHARES = (("queue", "tab:orange"), ("device", "tab:blue"), ("overhead", "tab:gray"))
# Fields each point must have for the plots; checked up front so a malformed file fails with
# the field's name instead of a traceback from inside matplotlib.
POINT_FIELDS = ("tokens_per_s", "tpot_ms", "shares", "tpot_cdf_ms")


class SweepError(Exception):
    """A result file the plots cannot be drawn from; the message says why."""


def load_sweep(path):
    """The sweep in `path`, checked enough that every plot below can trust its fields."""
    try:
        with open(path, encoding="utf-8") as f:
            sweep = json.load(f)
    except OSError as e:
        raise SweepError(f"{path}: cannot read: {e.strerror or e}") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SweepError(f"{path}: not valid JSON: {e}") from e
    if not isinstance(sweep, dict):
        raise SweepError(f"{path}: not a JSON object")
    if sweep.get("schema") != SCHEMA:
        raise SweepError(f"{path}: schema is {sweep.get('schema')!r}, expected {SCHEMA!r}")
    points = sweep.get("points")
    if not isinstance(points, list) or not points:
        raise SweepError(f"{path}: no points")
    for i, point in enumerate(points):
        missing = [k for k in POINT_FIELDS if not isinstance(point, dict) or k not in point]
        if missing:
            raise SweepError(f"{path}: point {i} lacks {', '.join(missing)}")
    knee = sweep.get("knee")
    if knee is not None and not (isinstance(knee, dict) and isinstance(knee.get("index"), int)
                                 and 0 <= knee["index"] < len(points)):
        raise SweepError(f"{path}: knee {knee!r} does not name a point")
    return sweep


def variable(sweep):
    """The swept variable's name, or "" for a single run."""
    return (sweep.get("sweep") or {}).get("variable") or ""


def value_label(sweep, point):
    """A point's value as a bar label: "2", or "run" for a single run."""
    value = point.get("value")
    if not variable(sweep) or not isinstance(value, (int, float)):
        return "run"
    return f"{value:g}"


def point_label(sweep, point):
    """How a point is named next to its marker and in legends: "rate 2", or "run"."""
    value = value_label(sweep, point)
    return value if value == "run" else f"{variable(sweep)} {value}"


def axis_label(sweep):
    """The x label of per-point bar charts: the variable and its unit."""
    name = variable(sweep)
    if not name:
        return ""  # the bar itself says "run"
    unit = (sweep.get("sweep") or {}).get("unit") or ""
    return f"{name} ({unit})" if unit else name


def slo(sweep):
    """The TPOT SLO in ms, or None when the run had none."""
    value = sweep.get("slo_tpot_ms")
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None


def title(sweep, what):
    """Names the model and what varied, so a plot cut out of a report still says what it is."""
    server = sweep.get("server") or {}
    model = f"{server.get('model', '?')}, {server.get('layers', '?')} layers"
    varied = f"sweep over {variable(sweep)}" if variable(sweep) else "single run"
    return f"{what}\n{model}, {varied}"


def new_figure(sweep):
    """A figure with one axes and the machine footer: numbers from different hosts differ,
    so every plot carries the client CPU and the device the server emulated."""
    client = sweep.get("client") or {}
    server = sweep.get("server") or {}
    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    fig.text(0.01, 0.01,
             f"client: {client.get('cpu', '?')} ({client.get('isa', '?')}, "
             f"{client.get('cores', '?')} cores)   server: {server.get('devices', '?')} x "
             f"{server.get('device', '?')}, mlaserve {server.get('version', '?')}",
             fontsize=7, color="dimgray")
    return fig, fig.add_subplot()


def finish(fig):
    """Lays the figure out above the footer line."""
    fig.tight_layout(rect=(0, 0.04, 1, 1))


def draw_slo(ax, sweep, horizontal):
    """The SLO as a dashed line (TPOT on y: horizontal; on x: vertical), if there is one."""
    limit = slo(sweep)
    if limit is None:
        return
    line = ax.axhline if horizontal else ax.axvline
    line(limit, color="tab:red", linestyle="--", linewidth=1, label=f"SLO {limit:g} ms")


def plot_throughput(sweep):
    """TPOT against tokens/s in sweep order: where the curve turns up is where more load stops
    buying throughput; the knee is the point the load generator picked."""
    points = sweep["points"]
    fig, ax = new_figure(sweep)
    x = [p["tokens_per_s"] for p in points]
    p50 = [p["tpot_ms"]["p50"] for p in points]
    p99 = [p["tpot_ms"]["p99"] for p in points]
    ax.plot(x, p50, marker="o", label="p50 TPOT")
    ax.plot(x, p99, marker="s", label="p99 TPOT")
    for p, xi, yi in zip(points, x, p99):
        ax.annotate(point_label(sweep, p), (xi, yi), textcoords="offset points", xytext=(4, 6),
                    fontsize=8)
    draw_slo(ax, sweep, horizontal=True)
    knee = sweep.get("knee")
    if knee is not None:
        i = knee["index"]
        ax.plot([x[i]], [p99[i]], marker="*", markersize=18, color="tab:green", linestyle="",
                label=f"knee ({point_label(sweep, points[i])})")
        ax.annotate("knee", (x[i], p99[i]), textcoords="offset points", xytext=(8, -14),
                    color="tab:green", fontweight="bold")
    ax.set_xlabel("throughput (tokens/s)")
    ax.set_ylabel("TPOT (ms)")
    ax.margins(x=0.08)  # room for the labels of the first and last points
    top = max(p99 + [slo(sweep) or 0])
    ax.set_ylim(0, top * 1.15 if top > 0 else 1)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    ax.set_title(title(sweep, "TPOT against throughput"), fontsize=10)
    finish(fig)
    return fig


def empirical_cdf(values):
    """x and y of the step function F(x) = share of values <= x, starting at 0 so the first
    step is visible."""
    x = np.sort(np.asarray(values, dtype=float))
    y = np.arange(1, len(x) + 1) / len(x)
    return np.concatenate(([x[0]], x)), np.concatenate(([0.0], y))


def plot_cdf(sweep):
    """Per-sequence mean TPOT as a CDF per point: the whole distribution against the SLO,
    not just the two percentiles the throughput plot shows."""
    fig, ax = new_figure(sweep)
    drawn = 0
    for p in sweep["points"]:
        if not p["tpot_cdf_ms"]:
            continue  # no sequence finished in this point's window
        x, y = empirical_cdf(p["tpot_cdf_ms"])
        ax.step(x, y, where="post", label=point_label(sweep, p))
        drawn += 1
    if drawn:
        draw_slo(ax, sweep, horizontal=False)
        ax.set_xlabel("per-sequence mean TPOT (ms)")
        ax.set_ylabel("fraction of sequences")
        ax.set_ylim(0, 1.02)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    else:
        ax.set_axis_off()
        ax.text(0.5, 0.5, "no finished sequences", ha="center", va="center",
                transform=ax.transAxes, fontsize=14, color="dimgray")
    ax.set_title(title(sweep, "TPOT per sequence, CDF"), fontsize=10)
    finish(fig)
    return fig


def plot_shares(sweep):
    """Where the mean call latency goes per point (queue, device, overhead): a queue share
    that grows with load is the server saturating, a growing overhead is the host."""
    points = sweep["points"]
    fig, ax = new_figure(sweep)
    positions = np.arange(len(points))
    bottom = np.zeros(len(points))
    for name, color in SHARES:
        share = np.array([float(p["shares"].get(name, 0.0)) for p in points])
        ax.bar(positions, share, bottom=bottom, color=color, label=name, width=0.6)
        bottom += share
    ax.set_xticks(positions)
    ax.set_xlim(-0.75, len(points) - 0.25)  # a lone bar no wider than one of three
    ax.set_xticklabels([value_label(sweep, p) for p in points])
    ax.set_xlabel(axis_label(sweep))
    ax.set_ylabel("share of mean call latency")
    ax.set_ylim(0, 1)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    ax.set_title(title(sweep, "Call latency by where it went"), fontsize=10)
    finish(fig)
    return fig


def save(fig, prefix, name):
    """PREFIX-name.png and .svg; returns their paths. The SVG carries no date, so
    re-plotting the same result gives the same file."""
    paths = []
    for ext, metadata in (("png", None), ("svg", {"Date": None})):
        path = f"{prefix}-{name}.{ext}"
        fig.savefig(path, format=ext, metadata=metadata)
        paths.append(path)
    return paths


def default_prefix(result):
    """RESULT without its .json suffix, so the plots land next to the result."""
    return result[: -len(".json")] if result.endswith(".json") else result


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Plot an mlaserve-loadgen sweep (--json) as PNG and SVG.")
    parser.add_argument("result", metavar="RESULT.json", help="the load generator's --json file")
    parser.add_argument("--out", metavar="PREFIX",
                        help="write PREFIX-{throughput,cdf,shares}.{png,svg} (default: RESULT "
                             "without .json)")
    args = parser.parse_args(argv)
    prefix = args.out or default_prefix(args.result)
    try:
        sweep = load_sweep(args.result)
        for name, plot in (("throughput", plot_throughput), ("cdf", plot_cdf),
                           ("shares", plot_shares)):
            for path in save(plot(sweep), prefix, name):
                print(path)
    except SweepError as e:
        print(f"plot_sweep: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"plot_sweep: cannot write under {prefix}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
