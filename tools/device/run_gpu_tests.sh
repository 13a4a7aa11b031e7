#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, over what
# tools/device/pack_gpu_tests.sh (or tools/device/pack.sh) packed: every binary under
# .carry/bin whose name ends in _test, with the carried libraries, the machine's own
# NCCL and the model backends built here against its CUDA libtorch
# (deploy/gpu/build_backends.sh), the tests of code that runs the model on
# RLFLEET_TEST_DEVICE (default cuda:0). Prints the usual closing `N passed, M failed`
# (and `, S skipped` for binaries whose every case skipped: they are not counted passed).
set -uo pipefail
export NCCL_NVLS_ENABLE=0  # NVLink multicast stays off on shared machines
export RLFLEET_TEST_DEVICE="${RLFLEET_TEST_DEVICE:-cuda:0}"
# Runfiles as Bazel gives them: $TEST_SRCDIR/$TEST_WORKSPACE is this checkout (the
# tests' fixtures, e.g. libs/model/testdata, are read from there).
export TEST_SRCDIR="$(dirname "$PWD")" TEST_WORKSPACE="$(basename "$PWD")"
nccl_dir=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null || true)
backends=""
if [[ -d .carry/absl ]]; then
  backends=$(deploy/gpu/build_backends.sh) || { echo "the model backends did not build"; echo "0 passed, 1 failed"; exit 1; }
fi
export LD_LIBRARY_PATH="${backends:+$backends:}$PWD/.carry/lib:$PWD/.carry/absl/lib${nccl_dir:+:$nccl_dir}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
passed=0 failed=0 skipped=0
for t in $(find .carry/bin -type f -name "*_test" | sort); do
  echo "=== $t"
  TEST_TMPDIR=$(mktemp -d)  # (as Bazel gives each test)
  out=$(TEST_TMPDIR="$TEST_TMPDIR" "$t" 2>&1)
  rc=$?
  echo "$out"
  if [[ $rc -ne 0 ]]; then
    failed=$((failed + 1))
  elif grep -q '^\[  PASSED  \] 0 tests' <<<"$out"; then
    skipped=$((skipped + 1))  # (every case skipped, e.g. a multi-GPU test on one GPU: not a pass)
  else
    passed=$((passed + 1))
  fi
done
echo "$passed passed, $failed failed$( ((skipped)) && echo ", $skipped skipped")"
[[ $failed -eq 0 ]]
