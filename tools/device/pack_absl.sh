#!/usr/bin/env bash
# Copies Debian's absl (headers and shared libraries, ~6 MB) into .carry/absl for code
# that is built on the GPU machine with CMake against its CUDA libtorch (that machine
# has no absl). Keeps the rest of .carry (tools/device/pack.sh's binaries).
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf .carry/absl && mkdir -p .carry/absl/include .carry/absl/lib
cp -r /usr/include/absl .carry/absl/include/
cp -L /usr/lib/x86_64-linux-gnu/libabsl_*.so.2* .carry/absl/lib/
rm -f .carry/lib/libabsl_*  # (tools/device/pack.sh's copies: the same files, now in .carry/absl/lib)
# Gloo's headers too: c10d's ProcessGroupGloo.hpp includes them, and PyTorch's wheel
# ships c10d's headers but not Gloo's (its Gloo is inside libtorch_cpu).
rm -rf .carry/gloo && mkdir -p .carry/gloo/include && cp -r /usr/include/gloo .carry/gloo/include/
du -sh .carry/absl .carry/gloo >&2
