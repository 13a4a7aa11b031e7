"""Builds the rlfleet package: the gRPC stubs of ../proto are generated at build time
with Debian's protoc and grpc_python_plugin (protobuf-compiler, protobuf-compiler-grpc),
so they always match the contracts of the checkout they are built from.

    python3 -m venv --system-site-packages /tmp/venv
    /tmp/venv/bin/pip install --no-build-isolation --no-index ./python
"""
import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_ROOT = os.path.join(HERE, "..", "proto")
PROTOS = ["common", "controller", "rollout", "reward", "buffer", "trainer", "weights"]


class BuildWithStubs(build_py):
    def run(self):
        protoc = shutil.which("protoc")
        plugin = shutil.which("grpc_python_plugin")
        if protoc is None or plugin is None:
            raise SystemExit("rlfleet: building needs protoc and grpc_python_plugin "
                             "(apt install protobuf-compiler protobuf-compiler-grpc)")
        if not os.path.isdir(os.path.join(PROTO_ROOT, "rlfleet", "v1")):
            raise SystemExit(f"rlfleet: no protos under {PROTO_ROOT} (build from the rlfleet checkout's python/)")
        subprocess.check_call([
            protoc, f"-I{PROTO_ROOT}", f"--python_out={HERE}", f"--grpc_python_out={HERE}",
            f"--plugin=protoc-gen-grpc_python={plugin}",
            *[os.path.join(PROTO_ROOT, "rlfleet", "v1", f"{p}.proto") for p in PROTOS],
        ])
        super().run()


setup(cmdclass={"build_py": BuildWithStubs})
