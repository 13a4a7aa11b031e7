#!/usr/bin/env bash
# Builds the fleet's libtorch backends (deploy/gpu/CMakeLists.txt) against this host's
# libtorch: PyTorch's by default (CUDA when it has it), or TORCH_DIR=<libtorch dir>.
# Prints the directory to put on LD_LIBRARY_PATH before starting the Bazel-built
# services (the services print the backend they loaded).
#   deploy/gpu/build_backends.sh [BUILD_DIR]    (default: /tmp/rlfleet-backends)
set -euo pipefail
cd "$(dirname "$0")/../.."
build="${1:-/tmp/rlfleet-backends}"
if [[ -n "${TORCH_DIR:-}" ]]; then
  prefix="$TORCH_DIR"
else
  prefix="$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')" ||
    { echo "build_backends: no PyTorch here; set TORCH_DIR to a libtorch directory" >&2; exit 1; }
fi
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
echo "build_backends: libtorch from $prefix, into $build" >&2
mkdir -p "$build"
extra=()
if [[ ! -d .carry/absl && -f /usr/include/absl/base/config.h ]]; then  # (Debian: its own absl)
  extra=(-DABSL_INCLUDE_DIR=/usr/include -DABSL_LIB_DIR=/usr/lib/x86_64-linux-gnu -DGLOO_INCLUDE_DIR=/usr/include)
fi
cmake -S deploy/gpu -B "$build" "${generator[@]}" -DCMAKE_PREFIX_PATH="$prefix" "${extra[@]}" >"$build/cmake.log" 2>&1 ||
  { tail -40 "$build/cmake.log" >&2; exit 1; }
cmake --build "$build" -j "$(nproc)" >"$build/build.log" 2>&1 || { tail -60 "$build/build.log" >&2; exit 1; }
ls "$build"/librlfleet_model.so "$build"/librlfleet_gloo.so >/dev/null
echo "$build"
