#!/usr/bin/python3
"""The README and the user docs against the binaries, for what can drift mechanically:

  * flags: every `--flag` shown after one of our programs (a command in a code block or in
    backticks, deploy/'s flag file and units) is in that program's --helpfull (--help for the
    Python tools); every other `--flag` the docs name is some program's of ours, or one of
    the other tools' listed in FOREIGN_FLAGS;
  * exit codes: every sentence that states an exit code is one of EXIT_CLAIMS, whose number
    is read from the doc and compared with what the binary returns in that case;
  * metrics: every `mlaserve_*` name in the docs and the Grafana dashboard (CMake targets
    aside, and glibc's heap series under a sanitizer's malloc) is on /metrics of a server with
    emulated devices, one with tenants, or one on the fake GPU, each after load; and every
    series those servers export is in docs/api.md's metrics table;
  * snippets: every fenced block marked `<!-- docs-test: runs -->` on the line above runs:
    python blocks against a real server with the build's Python client (the documented
    address 127.0.0.1:50051 is the test server's), sh blocks under bash -euo pipefail in an
    empty scratch directory of their own; docs/deploy.md's, which makes TLS certificates, is
    then served and called (tls_walkthrough.py).

Beside it: doc_text.py (reading the docs), doc_servers.py (the servers it starts),
exit_codes.py (the exit-code claims and their cases) and tls_walkthrough.py.

    /usr/bin/python3 tests/docs/docs_test.py --source . --bin build/bin  (PYTHONPATH=build/python)
"""

import argparse
import glob
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
from doc_servers import Servers, load, run  # noqa: E402  (beside this script)
from doc_text import (RUN_MARK, iter_lines, join_continuations, line_of, read_doc,  # noqa: E402
                      rel, user_docs)
from exit_codes import check_exit_codes  # noqa: E402
from tls_walkthrough import check_tls_walkthrough  # noqa: E402

DOCUMENTED_TARGET = "127.0.0.1:50051"
# Series of glibc's allocator, absent where a sanitizer's malloc serves the server.
GLIBC_HEAP_PREFIX = "mlaserve_heap_"

# Programs of ours that the docs invoke, and where each lives.
ABSEIL_PROGRAMS = ("mlaserve-server", "mlaserve-loadgen", "mlaserve-ctl", "mlaserve-bench")
PYTHON_PROGRAMS = {
    "mlaserve-health": "deploy/mlaserve-health",
    "cluster_scaling.py": "bench/cluster_scaling.py",
    "cluster_drain.py": "bench/cluster_drain.py",
    "make_dashboard.py": "deploy/grafana/make_dashboard.py",
    "plot_sweep.py": "client/loadgen/plot_sweep.py",
    "pool_sizing.py": "bench/pool_sizing.py",
    "model_demo.py": "scripts/model_demo.py",
    "python_layer_call.py": "bench/python_layer_call.py",
}

# Flags the docs show for tools that are not ours (the tool named for the reader of a failure).
FOREIGN_FLAGS = {
    # etcd and etcdctl
    "advertise-client-urls", "listen-client-urls", "data-dir", "client-cert-auth", "name",
    "print-value-only", "prefix", "endpoints",
    # cmake, ctest, make, apt, systemd, journalctl, git
    "preset", "build", "install", "target", "output-on-failure", "now", "since", "purge",
    "offline", "no-build",
    # pip and venv
    "no-build-isolation", "system-site-packages",
    # GoogleTest and google-benchmark
    "gtest_filter", "gtest_repeat", "gtest_output", "benchmark_filter", "benchmark_repetitions",
    "benchmark_report_aggregates_only", "benchmark_min_time",
    # abseil's own
    "help", "helpfull", "version", "flagfile",
    # Nsight Compute
    "cache-control", "clock-control", "section",
}

# ---------------------------------------------------------------------------------------------
# Flags


def abseil_flags(binary):
    run = subprocess.run([binary, "--helpfull"], capture_output=True, text=True, timeout=30)
    names = re.findall(r"^\s+--([A-Za-z0-9_]+)", run.stdout + run.stderr, re.MULTILINE)
    # abseil's own, which --helpfull lists under their library rather than by name
    return {n.replace("-", "_") for n in names} | {"help", "helpfull", "version", "flagfile"}


def python_flags(script):
    run = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True,
                         timeout=60)
    if run.returncode != 0:
        raise RuntimeError(f"{script} --help: exit {run.returncode}: {run.stderr[-300:]}")
    return set(re.findall(r"(?<![\w-])--([a-z][a-z0-9_-]*)", run.stdout))


def program_flags(source, bin_dir):
    """Program name -> (its flags, whether dashes and underscores are the same)."""
    programs = {}
    for name in ABSEIL_PROGRAMS:
        binary = os.path.join(bin_dir, name)
        if os.path.exists(binary):  # the asan tree builds no bench
            programs[name] = (abseil_flags(binary), True)
    for name, path in PYTHON_PROGRAMS.items():
        programs[name] = (python_flags(os.path.join(source, path)), False)
    return programs


COMMAND = re.compile(r"(?:^|[\s/`(\"'=])(" + "|".join(
    re.escape(p) for p in (*ABSEIL_PROGRAMS, *PYTHON_PROGRAMS)) + r")(?![\w-])")
FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9_-]*)")
# Where a command's arguments end: a shell separator, the end of a backtick span, a bracket.
COMMAND_END = re.compile(r"\s(?:\||&&|;|&|>|#)\s|`|\)|\s#")


def known(flag, flags, same_spelling):
    if same_spelling:
        return flag.replace("-", "_") in flags
    return flag in flags


def check_flags(source, bin_dir, failures):
    programs = program_flags(source, bin_dir)
    # Where a program is not built (the asan tree has no bench), a flag in prose may be its:
    # only flags attached to built programs are checked there; the default tree checks all.
    missing = [p for p in ABSEIL_PROGRAMS if p not in programs]
    if missing:
        print(f"flags: {', '.join(missing)} not built here: prose flags not checked")
    everyone = set()
    for flags, same in programs.values():
        everyone |= flags | ({f.replace("_", "-") for f in flags} if same else set())
    files = user_docs(source) + sorted(glob.glob(os.path.join(source, "deploy", "systemd", "*")))
    checked = 0
    for path in files:
        raw = read_doc(path)
        text, where = join_continuations(raw)
        attached = set()
        for line_start, line in iter_lines(text):
            commands = list(COMMAND.finditer(line))
            for i, m in enumerate(commands):
                program = m.group(1)
                end = commands[i + 1].start() if i + 1 < len(commands) else len(line)
                tail = line[m.end():end]
                stop = COMMAND_END.search(tail)
                arguments = tail[:stop.start()] if stop else tail
                for flag in FLAG.finditer(arguments):
                    offset = line_start + m.end() + flag.start()
                    attached.add(offset)
                    if program not in programs:
                        continue
                    flags, same = programs[program]
                    checked += 1
                    if not known(flag.group(1), flags, same):
                        failures.append(
                            f"{rel(source, path)}:{line_of(raw, where[offset])}: {program} has no "
                            f"--{flag.group(1)} (not in its --help)")
        for flag in FLAG.finditer(text):
            if missing or flag.start() in attached or flag.group(1) in FOREIGN_FLAGS:
                continue
            name = flag.group(1).rstrip("-_")
            checked += 1
            if name not in everyone and not any(f.startswith(name) for f in everyone):
                failures.append(f"{rel(source, path)}:{line_of(raw, where[flag.start()])}: --"
                                f"{flag.group(1)} is no flag of mlaserve's programs (nor in "
                                f"FOREIGN_FLAGS)")
    # The example flag file is the server's.
    server = programs.get("mlaserve-server")
    for path in sorted(glob.glob(os.path.join(source, "deploy", "*.flags"))):
        for number, line in enumerate(open(path), 1):
            m = re.match(r"\s*#?\s*--([a-z][a-z0-9_-]*)=", line)
            if m and server:
                checked += 1
                if not known(m.group(1), *server):
                    failures.append(f"{rel(source, path)}:{number}: mlaserve-server has no "
                                    f"--{m.group(1)}")
    print(f"flags: {checked} uses checked against {len(programs)} programs' --help")


# ---------------------------------------------------------------------------------------------
# Metrics


def exported_names(metrics_target):
    import urllib.request
    page = urllib.request.urlopen(f"http://{metrics_target}/metrics", timeout=10).read().decode()
    return set(re.findall(r"^# TYPE (\S+)", page, re.MULTILINE))


def cmake_targets(source):
    names = set()
    for path in glob.glob(os.path.join(source, "**", "CMakeLists.txt"), recursive=True):
        if "/build" in os.path.relpath(path, source).join("//"):
            continue
        names |= set(re.findall(r"add_(?:library|executable)\(\s*([\w-]+)", open(path).read()))
    return names


def check_metrics(source, bin_dir, servers, failures, sanitizer_malloc):
    exported = set()
    for name in ("plain", "tenants", "fake-gpu"):
        _, target, metrics = servers.get(name)
        extra = [f"--auth_token_file={servers.scratch}/token"] if name == "tenants" else []
        done = load(bin_dir, target, *extra)
        if done.returncode != 0:
            failures.append(f"load on the {name} server: exit {done.returncode}: "
                            f"{done.stderr[-300:]}")
        if name == "tenants":  # the refusal series exist once something was refused
            run([os.path.join(bin_dir, "mlaserve-ctl"), f"--target={target}", "info"])
            run([os.path.join(bin_dir, "mlaserve-ctl"), f"--target={target}",
                 f"--auth_token_file={servers.scratch}/decode-only", "info"])
        exported |= exported_names(metrics)
    targets = cmake_targets(source)
    sources = user_docs(source) + [os.path.join(source, "deploy", "grafana", "mlaserve.json")]
    checked = 0
    for path in sources:
        text = read_doc(path)
        for m in re.finditer(r"\bmlaserve_[a-z0-9_*]+", text):
            name = m.group(0)
            if name in targets or (sanitizer_malloc and name.startswith(GLIBC_HEAP_PREFIX)):
                continue
            checked += 1
            pattern = re.compile("^" + re.escape(name).replace(r"\*", "[a-z0-9_]+") + "$")
            series = {e + suffix for e in exported for suffix in ("", "_bucket", "_sum", "_count")}
            if not any(pattern.match(e) for e in series):
                failures.append(f"{rel(source, path)}:{line_of(text, m.start())}: {name} is "
                                f"not exported by any of the servers")
    print(f"metrics: {checked} names checked against {len(exported)} exported families")
    check_metrics_table(source, exported, failures)


def metrics_table(source):
    """{name: line} of every series docs/api.md's metrics table names (a row's first cell)."""
    path = os.path.join(source, "docs", "api.md")
    text = read_doc(path)
    start = text.find("\n## Metrics\n")
    end = text.find("\n## ", start + 1)
    if start < 0:
        return {}
    names = {}
    for m in re.finditer(r"^\|([^|\n]*)\|", text[start:end if end > 0 else len(text)], re.M):
        for name in re.findall(r"`([a-z_][a-z0-9_]*)`", m.group(1)):
            names.setdefault(name, line_of(text, start + m.start()))
    return names


def check_metrics_table(source, exported, failures):
    """Every family the servers export has a row (the reverse of the check above: a series
    added to the server and left out of the table fails here)."""
    table = metrics_table(source)
    if not table:
        failures.append("docs/api.md: no metrics table under '## Metrics'")
        return
    missing = sorted(exported - set(table))
    for name in missing:
        failures.append(f"docs/api.md: {name} is exported but not in the metrics table")
    print(f"metrics table: {len(exported) - len(missing)} of {len(exported)} exported families "
          f"in docs/api.md's table")


# ---------------------------------------------------------------------------------------------
# Snippets


def marked_snippets(source):
    """(doc, line, language, code) of each fenced block right under RUN_MARK."""
    found = []
    for path in user_docs(source):
        lines = read_doc(path).split("\n")
        for i, line in enumerate(lines):
            if line.strip() != RUN_MARK:
                continue
            fence = lines[i + 1] if i + 1 < len(lines) else ""
            if not fence.startswith("```"):
                found.append((rel(source, path), i + 1, None, "the mark is not above a fence"))
                continue
            end = next((j for j in range(i + 2, len(lines)) if lines[j].startswith("```")), None)
            code = "\n".join(lines[i + 2:end]) if end else ""
            found.append((rel(source, path), i + 2, fence[3:].strip(), code))
    return found


def check_snippets(source, servers, failures):
    """Runs every marked snippet; returns the directory docs/deploy.md's sh snippet ran in."""
    _, target, _ = servers.get("plain")
    snippets = marked_snippets(source)
    deploy_dir = None
    for n, (doc, line, language, code) in enumerate(snippets):
        if language == "python":
            done = subprocess.run([sys.executable, "-"],
                                  input=code.replace(DOCUMENTED_TARGET, target),
                                  capture_output=True, text=True, timeout=120)
        elif language == "sh":
            # In an empty directory of its own, inside the test's scratch (removed at the end).
            where = os.path.join(servers.scratch, f"snippet-{n}")
            os.mkdir(where)
            done = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=where,
                                  capture_output=True, text=True, timeout=120)
            if doc == os.path.join("docs", "deploy.md"):
                deploy_dir = where
        else:
            failures.append(f"{doc}:{line}: a marked snippet must be a python or sh block "
                            f"({language or code})")
            continue
        print(f"snippet {doc}:{line}: exit {done.returncode}: {done.stdout.strip()[-200:]}")
        if done.returncode != 0:
            failures.append(f"{doc}:{line}: the snippet failed: {done.stderr.strip()[-600:]}")
    if not snippets:
        failures.append(f"no snippet is marked {RUN_MARK}")
    print(f"snippets: {len(snippets)} run")
    return deploy_dir


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--source", required=True, help="the source tree")
    parser.add_argument("--bin", required=True, help="the build's bin/ folder")
    parser.add_argument("--sanitizer-malloc", action="store_true",
                        help="the server's malloc is a sanitizer's: no glibc heap series")
    args = parser.parse_args()
    failures = []
    with tempfile.TemporaryDirectory(prefix="mlaserve-docs-test-") as scratch:
        servers = Servers(args.bin, scratch)
        try:
            check_flags(args.source, args.bin, failures)
            check_metrics(args.source, args.bin, servers, failures, args.sanitizer_malloc)
            check_exit_codes(args.source, args.bin, servers, failures)
            made = check_snippets(args.source, servers, failures)
            check_tls_walkthrough(args.bin, made, failures)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
            failures.append(f"error: {e}")
        finally:
            for name, code in servers.stop_all().items():
                if code != 0:
                    failures.append(f"the {name} server exited {code} on SIGTERM")
    for failure in failures:
        print("FAIL:", failure)
    print("docs_test:", "FAIL" if failures else "PASS")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
