"""The Python package as users install it (docs/api.md, "Clients"): `pip install
./client/python` from a copy of the checkout into a fresh virtual environment (Debian's
python3-venv, with the system's site packages for grpcio, protobuf and numpy, no index and no
build isolation: nothing is downloaded), then, from a folder outside the checkout, the
installed package imported (generated stubs, mlaserve.flash_mla, the cluster client) with
the server's version, and a real server called through it: GetServerInfo and a decode
against a float64 reference. The copy, the environment and the server go at the end.

    /usr/bin/python3 tests/integration/python_package_test.py --source . \\
        --server build/bin/mlaserve-server
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from harness import Server, free_port, report

CHECK = r'''
import sys
import numpy as np
import mlaserve
import mlaserve.flash_mla  # noqa: F401 (imports without torch installed? it must say why)
from mlaserve.v1 import mlaserve_pb2_grpc  # noqa: F401
assert mlaserve.__file__.startswith(sys.prefix), mlaserve.__file__
client = mlaserve.Client(sys.argv[1])
info = client.server_info()
print("version", mlaserve.__version__, info.server_version)
width, heads = info.model.kv_row_width, info.model.heads
rng = np.random.default_rng(7)
rows = rng.standard_normal((40, width))
q = rng.standard_normal((1, heads, width))
client.create_sequence("pkg")
client.append_kv("pkg", 0, 0, mlaserve.float_to_bf16_bits(rows))
[result] = client.decode([mlaserve.latent_query("pkg", 0, mlaserve.float_to_bf16_bits(q))])
k = mlaserve.round_to_bf16(rows).astype(np.float64)
qq = mlaserve.round_to_bf16(q).astype(np.float64)[0]
scores = qq @ k.T * info.model.softmax_scale
weights = np.exp(scores - scores.max(axis=1, keepdims=True))
out = (weights / weights.sum(axis=1, keepdims=True)) @ k[:, :512]
error = float(np.max(np.abs(result.out[0].astype(np.float64) - out)))
print("max error", error)
assert error < 2e-2, error
'''


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--source", required=True, help="the checkout's root")
    parser.add_argument("--server", required=True)
    args = parser.parse_args()
    began = time.time()
    scratch = tempfile.mkdtemp(prefix="mlaserve-package-test-")
    server = None
    failures = []
    try:
        # What `pip install ./client/python` reads: the package's folder, proto/ and the
        # top CMakeLists.txt (the version), as a copy so that the build leaves nothing here.
        checkout = os.path.join(scratch, "checkout")
        shutil.copytree(os.path.join(args.source, "client", "python"),
                        os.path.join(checkout, "client", "python"),
                        ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
        shutil.copytree(os.path.join(args.source, "proto"), os.path.join(checkout, "proto"))
        shutil.copy(os.path.join(args.source, "CMakeLists.txt"), checkout)
        venv = os.path.join(scratch, "venv")
        subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", venv],
                       check=True)
        python = os.path.join(venv, "bin", "python")
        installed = subprocess.run(
            [python, "-m", "pip", "install", "--no-index", "--no-build-isolation", "--no-cache-dir",
             "--disable-pip-version-check", "--quiet",
             "./client/python"], cwd=checkout, capture_output=True, text=True)
        if installed.returncode != 0:
            raise RuntimeError(f"pip install failed:\n{installed.stdout}\n{installed.stderr}")
        shown = subprocess.run([python, "-m", "pip", "show", "mlaserve"], capture_output=True,
                               text=True, check=True).stdout
        requires = re.search(r"^Requires: (.*)$", shown, re.M)
        if requires is None or {r.strip() for r in requires.group(1).split(",")} != \
                {"grpcio", "protobuf", "numpy"}:
            failures.append(f"declared dependencies: {requires.group(1) if requires else None}")
        target = f"127.0.0.1:{free_port()}"
        server = Server(args.server, [f"--listen={target}", "--metrics_listen=", "--layers=1",
                                      "--devices=1"])
        if not server.ready(60):
            raise RuntimeError("the server did not start: " + "".join(server.log[-20:]))
        outside = os.path.join(scratch, "elsewhere")
        os.makedirs(outside)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        ran = subprocess.run([python, "-c", CHECK, target], cwd=outside, env=env,
                             capture_output=True, text=True, timeout=120)
        print(ran.stdout, end="")
        if ran.returncode != 0:
            failures.append(f"the installed package failed:\n{ran.stderr[-3000:]}")
        else:
            versions = re.search(r"^version (\S+) (\S+)$", ran.stdout, re.M)
            if versions is None or versions.group(1) != versions.group(2):
                failures.append(f"package and server versions differ: {ran.stdout}")
    except Exception as error:  # noqa: BLE001 (reported, then everything is removed)
        failures.append(f"{type(error).__name__}: {error}")
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    return report(failures, began)


if __name__ == "__main__":
    sys.exit(main())
