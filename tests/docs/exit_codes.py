"""The docs' statements of exit codes (EXIT_CLAIMS), each checked by running its case."""

import os
import re
import sys
from concurrent import futures

import grpc

from doc_servers import run
from doc_text import line_of, read_doc, rel, user_docs
from harness import Server, free_port

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
