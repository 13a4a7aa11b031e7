#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, over what tools/device/pack.sh
# packed: every binary in .carry/bin whose name ends in _test, with the carried
# libraries and the machine's own NCCL. Prints the usual closing `N passed, M failed`.
set -uo pipefail
export NCCL_NVLS_ENABLE=0  # NVLink multicast stays off on shared machines
nccl_dir=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null || true)
export LD_LIBRARY_PATH="$PWD/.carry/lib${nccl_dir:+:$nccl_dir}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
passed=0 failed=0
for t in .carry/bin/*_test; do
  echo "=== $t"
  if "$t"; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
done
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
