#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, over what tools/device/pack.sh
# packed: every binary in .carry/bin whose name ends in _test, with the carried
# libraries and the machine's own NCCL. Prints the usual closing `N passed, M failed`
# (and `, S skipped` for binaries whose every case skipped: they are not counted passed).
set -uo pipefail
export NCCL_NVLS_ENABLE=0  # NVLink multicast stays off on shared machines
nccl_dir=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null || true)
export LD_LIBRARY_PATH="$PWD/.carry/lib${nccl_dir:+:$nccl_dir}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
passed=0 failed=0 skipped=0
for t in .carry/bin/*_test; do
  echo "=== $t"
  out=$("$t" 2>&1)
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
