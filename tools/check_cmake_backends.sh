#!/usr/bin/env bash
# Builds the model backends the way a GPU host does (deploy/gpu/build_backends.sh, CMake),
# here against Debian's libtorch, and runs Bazel-built binaries on that build instead
# of Bazel's own: the policy and Gloo tests pass on it, and rlfleet-rollout names it as
# the backend it loaded. So the second build (which CI cannot run on a GPU) stays one
# that configures, compiles, links and keeps policy.h's ABI with the services.
#   bash tools/check_cmake_backends.sh     (after `bazel build` of the tests below)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
build=$(mktemp -d "${TMPDIR:-/tmp}/rlfleet-cmake-backends.XXXXXX")
trap 'rm -rf "$build"' EXIT
TORCH_DIR=/usr/lib/x86_64-linux-gnu/cmake/Torch bash deploy/gpu/build_backends.sh "$build" >/dev/null
bin=$(bazel info bazel-bin 2>/dev/null)
bazel build //libs/model/tests:policy_test //libs/dist/tests:gloo_group_test //services/rollout:rlfleet-rollout \
  >/dev/null 2>&1
for t in libs/model/tests/policy_test libs/dist/tests/gloo_group_test; do
  (cd "$build" && TEST_TMPDIR="$build" LD_LIBRARY_PATH="$build" "$bin/$t" >"$build/test.log" 2>&1) ||
    { tail -30 "$build/test.log"; echo "check_cmake_backends: $t failed on the CMake-built backends" >&2; exit 1; }
done
said=$(LD_LIBRARY_PATH="$build" "$bin/services/rollout/rlfleet-rollout" --host=127.0.0.1 --port=0 --device=cuda:0 2>&1 |
       tail -1 || true)
if [[ "$said" != *"$build/librlfleet_model.so"* ]]; then
  echo "check_cmake_backends: rlfleet-rollout did not load $build/librlfleet_model.so: $said" >&2
  exit 1
fi
echo "check_cmake_backends: policy_test and gloo_group_test pass on the CMake-built backends; rlfleet-rollout loads them"
