#!/usr/bin/env bash
# The model backend's CUDA-only code (#ifdef RLFLEET_TORCH_CUDA: device images, decode
# graphs, CUDA streams) is compiled only on a GPU host, by deploy/gpu's CMake build
# against a CUDA libtorch. This check compiles those translation units here, syntax
# only, with RLFLEET_TORCH_CUDA defined, against Debian's libtorch headers (c10/cuda is
# among them) and CUDA's under /usr/local/cuda: a CUDA path that no longer compiles is
# seen in CI, not on the next GPU run.
#   bash tools/check_cuda_paths.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
cuda="${CUDA_HOME:-/usr/local/cuda}"
[[ -f "$cuda/include/cuda_runtime_api.h" ]] || { echo "check_cuda_paths: no CUDA headers under $cuda" >&2; exit 1; }
[[ -f /usr/include/c10/cuda/CUDAGuard.h ]] || { echo "check_cuda_paths: no c10/cuda headers (libtorch-dev)" >&2; exit 1; }
# (Debian's libtorch ships c10/cuda without the header its CMake build generates)
shim=$(mktemp -d "${TMPDIR:-/tmp}/rlfleet-cuda-paths.XXXXXX")
trap 'rm -rf "$shim"' EXIT
mkdir -p "$shim/c10/cuda/impl"
echo '#define C10_CUDA_BUILD_SHARED_LIBS' >"$shim/c10/cuda/impl/cuda_cmake_macros.h"
mapfile -t files < <(grep -l 'RLFLEET_TORCH_CUDA' libs/*/*.cc services/*/*.cc 2>/dev/null | sort)
((${#files[@]} > 0)) || { echo "check_cuda_paths: no file uses RLFLEET_TORCH_CUDA" >&2; exit 1; }
failed=0
for f in "${files[@]}"; do
  if ! g++ -std=c++17 -fsyntax-only -DRLFLEET_TORCH_CUDA -I. -I"$shim" -I"$cuda/include" \
    -I/usr/include/torch/csrc/api/include "$f" 2>"$shim/err"; then
    echo "check_cuda_paths: $f does not compile with RLFLEET_TORCH_CUDA:" >&2
    grep -m 20 -E 'error' "$shim/err" >&2 || tail -20 "$shim/err" >&2
    failed=1
  fi
done
((failed == 0)) || exit 1
echo "check_cuda_paths: ${#files[@]} files compile with RLFLEET_TORCH_CUDA (${files[*]})"
