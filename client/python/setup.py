"""Builds the mlaserve package with its gRPC stubs generated from the checkout's proto/ at
build time (they are never committed), and its version read from the top CMakeLists.txt, so
that the package and the server it talks to carry the same version. Needs protoc and
grpc_python_plugin (Debian's protobuf-compiler and protobuf-compiler-grpc); pyproject.toml
holds everything else."""

import os
import re
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
CHECKOUT = os.path.normpath(os.path.join(HERE, "..", ".."))
PROTO_ROOT = os.path.join(CHECKOUT, "proto")
# The messages mlaserve.v1 holds; the service's stubs come from mlaserve.proto.
PROTOS = ["tensor", "decode", "data_plane", "server_info", "kv_cache", "admin", "mlaserve",
          "kv_state"]


def server_version():
    with open(os.path.join(CHECKOUT, "CMakeLists.txt")) as cmake:
        found = re.search(r"project\(mlaserve VERSION ([0-9.]+)", cmake.read())
    if found is None:
        raise RuntimeError(f"no project(mlaserve VERSION ...) in {CHECKOUT}/CMakeLists.txt")
    return found.group(1)


class BuildWithStubs(build_py):
    """build_py, then the stubs and _version.py written into the built package."""

    def run(self):
        super().run()
        protoc = shutil.which("protoc")
        plugin = shutil.which("grpc_python_plugin")
        if protoc is None or plugin is None:
            raise RuntimeError("building mlaserve needs protoc and grpc_python_plugin "
                               "(apt install protobuf-compiler protobuf-compiler-grpc)")
        out = self.build_lib
        package = os.path.join(out, "mlaserve")
        os.makedirs(os.path.join(package, "v1"), exist_ok=True)
        with open(os.path.join(package, "v1", "__init__.py"), "w") as init:
            init.write('"""mlaserve.v1 messages and stubs, generated from proto/mlaserve/v1."""\n')
        for name in PROTOS:
            command = [protoc, f"--proto_path={PROTO_ROOT}", f"--python_out={out}",
                       os.path.join(PROTO_ROOT, "mlaserve", "v1", f"{name}.proto")]
            if name == "mlaserve":
                command[2:2] = [f"--grpc_python_out={out}",
                                f"--plugin=protoc-gen-grpc_python={plugin}"]
            subprocess.run(command, check=True)
        with open(os.path.join(package, "_version.py"), "w") as version:
            version.write(f'__version__ = "{server_version()}"\n')


setup(version=server_version(), cmdclass={"build_py": BuildWithStubs})
