"""The Python package as users install it (docs/api.md, "Clients"): the venv recipe that README
and docs/api.md both show (the same lines in each, or the test fails), run as written from a
copy of the checkout, its environment in a scratch folder and pip told to use no index and no
cache (PIP_NO_INDEX: nothing may be downloaded; Debian's python3-torch, 1.13.0a0, must meet
the [torch] extra). Then, from a folder outside the checkout, the installed package imported
(generated stubs, mlaserve.flash_mla with torch, the cluster client) with the server's version,
and a real server called through it: GetServerInfo and a decode against a float64 reference.
The copy, the environment and the server go at the end.

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

# Where the recipe puts its environment; the test puts it in its scratch folder.
RECIPE_ENV = "~/mlaserve-env"


def venv_recipe(source):
    """The lines of the fenced sh block that makes the venv, the same in README and api.md."""
    found = {}
    for doc in ("README.md", os.path.join("docs", "api.md")):
        with open(os.path.join(source, doc)) as f:
            blocks = re.findall(r"^```sh\n(.*?)^```", f.read(), re.M | re.S)
        found[doc] = [b for b in blocks if "-m venv --system-site-packages" in b]
        if len(found[doc]) != 1:
            raise RuntimeError(f"{doc}: {len(found[doc])} venv recipes, not one")
    if len({blocks[0] for blocks in found.values()}) != 1:
        raise RuntimeError(f"README.md and docs/api.md show different venv recipes: {found}")
    lines = [line for line in found["README.md"][0].splitlines() if line.strip()]
    if not all(RECIPE_ENV in line for line in lines):
        raise RuntimeError(f"a recipe line outside {RECIPE_ENV}: {lines}")
    return lines

CHECK = r'''
import sys
import numpy as np
import mlaserve
import mlaserve.flash_mla  # noqa: F401
import torch  # the [torch] extra's
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
# A pip-installed package has no C++ client: decode_batch goes over grpcio, and answers as
# decode does.
assert not mlaserve.native.available()
assert not client.on_data_plane()
batch = client.decode_batch(["pkg"], 0, latent=mlaserve.float_to_bf16_bits(q)[None])
assert np.array_equal(batch.out[0], result.out), "decode_batch over grpcio"
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
        offline = dict(os.environ, PIP_NO_INDEX="1", PIP_NO_CACHE_DIR="1",
                       PIP_DISABLE_PIP_VERSION_CHECK="1")
        offline.pop("PYTHONPATH", None)
        for line in venv_recipe(args.source):
            ran = subprocess.run(["bash", "-c", line.replace(RECIPE_ENV, venv)], cwd=checkout,
                                 env=offline, capture_output=True, text=True, timeout=300)
            print(f"$ {line}\n{ran.stdout[-300:]}", end="")
            if ran.returncode != 0:
                raise RuntimeError(f"{line}: exit {ran.returncode}:\n{ran.stdout}\n{ran.stderr}")
        python = os.path.join(venv, "bin", "python")
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
