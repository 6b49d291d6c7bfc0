"""The real servers the docs test talks to, started once each and stopped at the end, and
the two ways it runs the binaries."""

import hashlib
import json
import os
import subprocess

from harness import Server, free_port


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
