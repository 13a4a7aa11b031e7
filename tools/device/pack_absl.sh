#!/usr/bin/env bash
# Copies Debian's absl (headers and shared libraries, ~6 MB) into .carry/absl for code
# that is built on the GPU machine with CMake against its CUDA libtorch (that machine
# has no absl). Keeps the rest of .carry (tools/device/pack.sh's binaries).
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf .carry/absl && mkdir -p .carry/absl/include .carry/absl/lib
cp -r /usr/include/absl .carry/absl/include/
cp -L /usr/lib/x86_64-linux-gnu/libabsl_*.so.2* .carry/absl/lib/
du -sh .carry/absl >&2
