#!/usr/bin/python3
"""The README and the user docs against the binaries, for what can drift mechanically:

  * flags: every `--flag` shown after one of our programs (a command in a code block or in
    backticks, deploy/'s flag file and units) is in that program's --helpfull (--help for the
    Python tools); every other `--flag` the docs name is some program's of ours, or one of
    the other tools' listed in FOREIGN_FLAGS;
  * exit codes: every sentence that states an exit code is one of EXIT_CLAIMS, whose number
    is read from the doc and compared with what the binary returns in that case;
  * metrics: every `mlaserve_*` name in the docs and the Grafana dashboard (CMake targets
    aside, and glibc's heap series under a sanitizer's malloc) is on /metrics of a server with emulated devices, one with tenants, or one on the
    fake GPU, each after load;
  * snippets: every fenced block marked `<!-- docs-test: runs -->` on the line above runs
    against a real server (python blocks with the build's Python client; the documented
    address 127.0.0.1:50051 is the test server's).

    /usr/bin/python3 tests/docs/docs_test.py --source . --bin build/bin  (PYTHONPATH=build/python)
"""

import argparse
import glob
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent import futures

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
from harness import Server, free_port  # noqa: E402

DOCUMENTED_TARGET = "127.0.0.1:50051"
# Series of glibc's allocator, absent where a sanitizer's malloc serves the server.
GLIBC_HEAP_PREFIX = "mlaserve_heap_"
RUN_MARK = "<!-- docs-test: runs -->"
SKIP_MARK = "<!-- docs-test: not checked -->"
CHECK_MARK = "<!-- docs-test: checked -->"

# Programs of ours that the docs invoke, and where each lives.
ABSEIL_PROGRAMS = ("mlaserve-server", "mlaserve-loadgen", "mlaserve-ctl", "mlaserve-bench")
PYTHON_PROGRAMS = {
    "mlaserve-health": "deploy/mlaserve-health",
    "cluster_scaling.py": "bench/cluster_scaling.py",
    "cluster_drain.py": "bench/cluster_drain.py",
    "make_dashboard.py": "deploy/grafana/make_dashboard.py",
    "plot_sweep.py": "client/loadgen/plot_sweep.py",
    "pool_sizing.py": "bench/pool_sizing.py",
}

# Flags the docs show for tools that are not ours (the tool named for the reader of a failure).
FOREIGN_FLAGS = {
    # etcd and etcdctl
    "advertise-client-urls", "listen-client-urls", "data-dir", "client-cert-auth", "name",
    "print-value-only", "prefix", "endpoints",
    # cmake, ctest, make, apt, systemd, journalctl, git
    "preset", "build", "install", "target", "output-on-failure", "now", "since", "purge",
    "offline", "no-build",
    # GoogleTest and google-benchmark
    "gtest_filter", "benchmark_filter", "benchmark_repetitions",
    "benchmark_report_aggregates_only",
    # abseil's own
    "help", "helpfull", "version", "flagfile",
}

# Each sentence of the docs that states an exit code. `claim` is a regular expression over
# the doc's text (spaces match any run of white space) whose named groups capture the codes
# the doc states; `check` is the name of the function below that runs each case and returns
# the codes the binaries gave, by group name.
EXIT_CLAIMS = [
    ("README.md", r"exit (?P<stop>\d) on SIGTERM", "server_stop"),
    ("docs/api.md", r"`stopped` \(exit (?P<stop>\d)\)", "server_stop"),
    ("docs/cluster.md", r"stops as on SIGTERM \(exit (?P<stop>\d)\)", "server_stop"),
    # A drain by mlaserve-ctl ends in the server's SIGTERM path (cluster_drain_test drains one).
    ("docs/cluster.md", r"the drained server exits (?P<stop>\d)", "server_stop"),
    ("docs/cluster.md", r"the server exits (?P<stop>\d), every sequence", "server_stop"),
    ("docs/cluster.md", r"SIGTERM removes it before the server exits \(exit (?P<stop>\d)\)",
     "server_stop"),
    ("docs/deploy.md", r"\(`STOPPING=1`\) and the server exits (?P<stop>\d)", "server_stop"),
    ("docs/deploy.md", r"saves the KV store to `--state_dir` \(below\), and exits (?P<stop>\d)",
     "server_stop"),
    ("docs/deploy.md", r"on SIGTERM sends `STOPPING=1` and exits (?P<stop>\d)", "server_stop"),
    ("docs/deploy.md", r"logs `matrix unit on OpenBLAS` and exits (?P<stop>\d)", "server_stop"),
    ("docs/loadgen.md", r"exit (?P<stop>\d) on SIGTERM", "server_stop"),
    ("docs/deploy.md", r"A flag the binary does not know, or a bad value, makes it exit "
     r"(?P<unknown_flag>\d) at start", "server_bad_flags"),
    ("docs/deploy.md", r"that binary exits (?P<unknown_flag>\d) at start", "server_bad_flags"),
    ("docs/deploy.md", r"`cannot start: cannot listen on \.\.\.`, `warm-up failed: \.\.\.`\) and "
     r"exits (?P<cannot_listen>\d)", "server_cannot_listen"),
    # The GPU's fault path is the in-process server's (integration_test GpuFaultTest); the
    # process's exit code after it is main's, the same as for a failed start.
    ("docs/gpu.md", r"drains \(SIGTERM's path\) and exits (?P<cannot_listen>\d)",
     "server_cannot_listen"),
    ("docs/deploy.md", r"It prints `HOST:PORT: SERVING` and exits (?P<serving>\d); "
     r"(?P<not_serving>\d) for NOT_SERVING \(or an unknown service\); (?P<no_answer>\d) when "
     r"nothing answers", "health_probe"),
    ("docs/deploy.md", r"\| `health` \| `SERVING`, `NOT_SERVING`, \.\.\.; exit (?P<serving>\d) "
     r"only when serving", "ctl"),
    ("docs/deploy.md", r"Exit status: (?P<ok>\d), (?P<not_serving>\d) for `health` when not "
     r"serving, (?P<error>\d) for an error \(printed with its gRPC code: no server, a bad flag, "
     r"PERMISSION_DENIED\)", "ctl"),
    ("docs/loadgen.md", r"The exit status is (?P<failed_call>\d) if any call failed",
     "loadgen_failed_call"),
    ("docs/loadgen.md", r"refused before the first point runs \(exit (?P<bad_out>\d), naming "
     r"`--out`\)", "loadgen_bad_out"),
    ("docs/loadgen.md", r"and refuses to run otherwise \(exit (?P<over_limits>\d), naming the "
     r"flags\)", "soak_refusals"),
    ("docs/loadgen.md", r"The exit status is (?P<failed>\d) if any answer was wrong, any call "
     r"failed, no answer was checked, the drift could not be computed .{0,400}?\. "
     r"(?P<bad_flag>\d) for bad flags", "soak_refusals"),
]

# A sentence states an exit code when "exit" (exits, exited, exit status, exit code) comes
# a few words before a digit.
EXIT_SENTENCE = re.compile(
    r"(?<![\w-])exit(?:s|ed)?\b(?: (?:code|status)(?: is)?)?:?[^.;]{0,12}?\b\d\b", re.IGNORECASE)


def user_docs(source):
    return [os.path.join(source, "README.md")] + sorted(glob.glob(os.path.join(source, "docs",
                                                                             "*.md")))


def read_doc(path):
    """The file's text with each region between SKIP_MARK and CHECK_MARK blanked (its lines
    kept, for line numbers): docs/testing.md quotes this test's failures there."""
    text = open(path).read()
    return re.sub(re.escape(SKIP_MARK) + ".*?" + re.escape(CHECK_MARK),
                  lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.DOTALL)


def rel(source, path):
    return os.path.relpath(path, source)


def line_of(text, offset):
    return text.count("\n", 0, offset) + 1


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


def join_continuations(raw):
    """The text with shell line continuations (backslash, newline, indent) made one space, and
    for each of its characters the offset in `raw` it came from (for line numbers)."""
    text, where, i = [], [], 0
    for m in re.finditer(r"\\\n\s*", raw):
        text.append(raw[i:m.start()])
        where.extend(range(i, m.start()))
        text.append(" ")
        where.append(m.start())
        i = m.end()
    text.append(raw[i:])
    where.extend(range(i, len(raw) + 1))
    return "".join(text), where


def iter_lines(text):
    start = 0
    for line in text.split("\n"):
        yield start, line
        start += len(line) + 1


# ---------------------------------------------------------------------------------------------
# Servers


class Servers:
    """The servers the checks talk to, each started once: plain (emulated devices, what the
    snippets and probes use), tenants, fake-gpu and tiny (a KV budget that load outgrows)."""

    def __init__(self, bin_dir, scratch):
        self.bin_dir = bin_dir
        self.scratch = scratch
        self.token = "docs-test-token"
        self.reader_token = "docs-test-decode-only"
        with open(f"{scratch}/tenants.json", "w") as f:
            json.dump({"tenants": [
                {"name": "team-a", "token_sha256": sha256(self.token),
                 "kv_quota_bytes": 64 << 20},
                {"name": "decoders", "token_sha256": sha256(self.reader_token),
                 "rights": ["decode"]}]}, f)
        for name, token in (("token", self.token), ("decode-only", self.reader_token)):
            with open(f"{scratch}/{name}", "w") as f:
                f.write(token + "\n")
        common = ["--layers=1", "--max_wait_us=200"]
        self.flags = {
            "plain": [*common, "--devices=1", "--kv_budget=256MiB"],
            "tenants": [*common, "--devices=1", "--kv_budget=256MiB",
                        f"--auth_tokens_file={scratch}/tenants.json"],
            "fake-gpu": [*common, "--devices=fake-gpu", "--kv_budget=64MiB"],
            "tiny": [*common, "--devices=1", "--kv_budget=1MiB"],
        }
        self.running = {}

    def get(self, name):
        if name not in self.running:
            target, metrics = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
            server = Server(os.path.join(self.bin_dir, "mlaserve-server"),
                            [f"--listen={target}", f"--metrics_listen={metrics}",
                             *self.flags[name]])
            if not server.ready(60):
                server.stop()
                raise RuntimeError(f"the {name} server did not start: {''.join(server.log)}")
            self.running[name] = (server, target, metrics)
        return self.running[name]

    def stop_all(self):
        codes = {}
        for name, (server, _, _) in self.running.items():
            server.stop()
            codes[name] = server.process.returncode
        self.running = {}
        return codes


def sha256(text):
    return hashlib.sha256(text.encode()).hexdigest()


def run(argv, timeout=120):
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def load(bin_dir, target, *extra, seconds=2):
    return run([os.path.join(bin_dir, "mlaserve-loadgen"), f"--target={target}", "--workers=2",
                "--sequences=4", "--prefix-tokens=64", "--context-tokens=16",
                f"--duration-s={seconds}", "--warmup-s=0", "--quiet", *extra])


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


# ---------------------------------------------------------------------------------------------
# Exit codes


class NotServingHealth:
    """A gRPC health service answering NOT_SERVING for any service, as a warming-up or
    draining server does (a window too short to hit on the real one)."""

    def __init__(self):
        answer = grpc.unary_unary_rpc_method_handler(
            lambda request, context: b"\x08\x02",  # HealthCheckResponse{status: NOT_SERVING}
            request_deserializer=lambda raw: raw, response_serializer=lambda raw: raw)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("grpc.health.v1.Health", {"Check": answer}),))
        self.target = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    def stop(self):
        self.server.stop(grace=None)


class ExitCases:
    """Each check runs its cases and returns {group: [(case, exit code)]}; a claim holds when
    every case of each of its groups exited with the number the doc states."""

    def __init__(self, source, bin_dir, servers):
        self.source, self.bin, self.servers = source, bin_dir, servers
        self.scratch = servers.scratch
        self.memo = {}

    def results(self, check):
        if check not in self.memo:
            self.memo[check] = getattr(self, check)()
        return self.memo[check]

    def tool(self, name):
        return os.path.join(self.bin, name)

    def server_stop(self):
        server = Server(self.tool("mlaserve-server"), [f"--listen=127.0.0.1:{free_port()}",
                                                       "--metrics_listen=",
                                                       *self.servers.flags["plain"]])
        if not server.ready(60):
            raise RuntimeError("a server for SIGTERM did not start: " + "".join(server.log))
        server.stop()  # SIGTERM
        return {"stop": [("SIGTERM after ready", server.process.returncode)]}

    def server_bad_flags(self):
        cases = [("an unknown flag", ["--no_such_flag=1"]), ("a bad value", ["--layers=many"])]
        return {"unknown_flag": [(case, run([self.tool("mlaserve-server"), *argv]).returncode)
                                 for case, argv in cases]}

    def server_cannot_listen(self):
        _, taken, _ = self.servers.get("plain")
        code = run([self.tool("mlaserve-server"), f"--listen={taken}", "--metrics_listen=",
                    *self.servers.flags["plain"]]).returncode
        return {"cannot_listen": [(f"--listen={taken}, a port in use", code)]}

    def health_probe(self):
        _, target, _ = self.servers.get("plain")
        probe = [sys.executable, os.path.join(self.source, "deploy", "mlaserve-health")]
        stub = NotServingHealth()
        try:
            return {
                "serving": [("a serving server", run([*probe, "--target", target]).returncode)],
                "not_serving": [
                    ("NOT_SERVING", run([*probe, "--target", stub.target]).returncode),
                    ("an unknown service", run([*probe, "--target", target, "--service",
                                                "no.such.Service"]).returncode)],
                "no_answer": [("nothing listening", run([
                    *probe, "--target", f"127.0.0.1:{free_port()}", "--timeout",
                    "2"]).returncode)],
            }
        finally:
            stub.stop()

    def ctl(self):
        _, target, _ = self.servers.get("plain")
        _, tenants, _ = self.servers.get("tenants")
        ctl = self.tool("mlaserve-ctl")
        stub = NotServingHealth()
        try:
            return {
                "ok": [("info", run([ctl, f"--target={target}", "info"]).returncode)],
                "serving": [("health", run([ctl, f"--target={target}", "health"]).returncode)],
                "not_serving": [("health of a NOT_SERVING server",
                                 run([ctl, f"--target={stub.target}", "health"]).returncode)],
                "error": [
                    ("no server", run([ctl, f"--target=127.0.0.1:{free_port()}",
                                       "--timeout_s=2", "info"]).returncode),
                    ("a bad flag", run([ctl, "--no_such_flag", "info"]).returncode),
                    ("PERMISSION_DENIED", run([
                        ctl, f"--target={tenants}",
                        f"--auth_token_file={self.scratch}/decode-only", "info"]).returncode)],
            }
        finally:
            stub.stop()

    def loadgen_failed_call(self):
        _, tiny, _ = self.servers.get("tiny")
        # The 1 MiB budget holds 7 pages: the prefix's and four sequences' own 127 tokens take
        # 5, and their second steps want 4 more, so calls fail from the second step on, however
        # slow the machine (under ASan, beside the soak).
        done = run([self.tool("mlaserve-loadgen"), f"--target={tiny}", "--workers=1",
                    "--sequences=4", "--prefix-tokens=128", "--context-tokens=127",
                    "--duration-s=5", "--warmup-s=0", "--quiet"])
        if "RESOURCE_EXHAUSTED" not in done.stdout:
            raise RuntimeError("the load on a 1 MiB budget had no failed call: " + done.stdout)
        return {"failed_call": [("calls refused RESOURCE_EXHAUSTED", done.returncode)]}

    def loadgen_bad_out(self):
        _, target, _ = self.servers.get("plain")
        blocker = os.path.join(self.scratch, "a-file")
        open(blocker, "w").close()
        done = run([self.tool("mlaserve-loadgen"), f"--target={target}",
                    "--sweep=sequences:2,4", "--duration-s=30",
                    f"--out={os.path.join(blocker, 'sweep')}"], timeout=20)
        return {"bad_out": [("--out under a file", done.returncode)]}

    def soak_refusals(self):
        _, target, metrics = self.servers.get("plain")
        soak = [self.tool("mlaserve-loadgen"), "--soak", f"--target={target}",
                f"--metrics-target={metrics}"]
        return {
            "over_limits": [("more live sequences than max_batch",
                             run([*soak, "--sequences=300", "--duration-s=5"]).returncode)],
            "bad_flag": [("--soak-max-rss-drift=lots",
                          run([*soak, "--soak-max-rss-drift=lots"]).returncode)],
            "failed": [("too few samples for the drift",
                        run([*soak, "--duration-s=3", "--soak-warmup-s=2",
                             "--soak-sample-s=5"]).returncode)],
        }


def claim_pattern(claim):
    return re.compile(claim.replace(" ", r"\s+"), re.DOTALL)


def check_exit_codes(source, bin_dir, servers, failures):
    cases = ExitCases(source, bin_dir, servers)
    covered = {}
    for doc, claim, check in EXIT_CLAIMS:
        path = os.path.join(source, doc)
        text = read_doc(path)
        matches = list(claim_pattern(claim).finditer(text))
        if not matches:
            failures.append(f"{doc}: no longer says /{claim}/ (EXIT_CLAIMS is out of date)")
            continue
        results = cases.results(check)
        for m in matches:
            covered.setdefault(doc, []).append((m.start(), m.end()))
            for group, stated in m.groupdict().items():
                for case, code in results[group]:
                    if code != int(stated):
                        failures.append(f"{doc}:{line_of(text, m.start())}: says exit {stated} "
                                        f"for {group}, but {case} exited {code}")
    stated = 0
    for path in user_docs(source):
        doc = rel(source, path)
        text = read_doc(path)
        for m in EXIT_SENTENCE.finditer(text):
            stated += 1
            if not any(start <= m.start() < end for start, end in covered.get(doc, [])):
                failures.append(f"{doc}:{line_of(text, m.start())}: states an exit code the "
                                f"docs test does not check ('{m.group(0)}'): add it to "
                                f"EXIT_CLAIMS")
    print(f"exit codes: {stated} statements, {len(EXIT_CLAIMS)} claims, "
          f"{sum(len(v) for r in cases.memo.values() for v in r.values())} cases run")


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
    _, target, _ = servers.get("plain")
    snippets = marked_snippets(source)
    for doc, line, language, code in snippets:
        if language != "python":
            failures.append(f"{doc}:{line}: a marked snippet must be a python block "
                            f"({language or code})")
            continue
        done = subprocess.run([sys.executable, "-"], input=code.replace(DOCUMENTED_TARGET, target),
                              capture_output=True, text=True, timeout=120)
        print(f"snippet {doc}:{line}: exit {done.returncode}: {done.stdout.strip()[-200:]}")
        if done.returncode != 0:
            failures.append(f"{doc}:{line}: the snippet failed: {done.stderr.strip()[-600:]}")
    if not snippets:
        failures.append(f"no snippet is marked {RUN_MARK}")
    print(f"snippets: {len(snippets)} run")


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
            check_snippets(args.source, servers, failures)
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
