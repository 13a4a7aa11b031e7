#!/usr/bin/env bash
# Checks the CMake build lists that build parts of the tree outside Bazel (on the GPU
# machine, which has no Bazel) against the Bazel targets they mirror, so that they
# cannot drift silently (a bench's list once lacked libs/common and stopped linking):
# every in-repo .cc that the Bazel target compiles, its own and its dependencies', must
# be in the CMake target's source list, and nothing else may be.
#
#   bash tools/check_cmake_sources.sh      # exits non-zero naming each mismatch
#
# The pairs: <CMakeLists.txt> <CMake target> <Bazel target>.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BAZEL="${BAZEL:-bazel}"
PAIRS=(
  "deploy/gpu/CMakeLists.txt rlfleet_model //libs/model:librlfleet_model.so"
  "deploy/gpu/CMakeLists.txt rlfleet_gloo //libs/dist:librlfleet_gloo.so"
)
errors=0
for pair in "${PAIRS[@]}"; do
  read -r cmake target label <<<"$pair"
  # The CMake target's sources: the ${REPO}/... paths inside add_executable(<target> ...)
  # or add_library(<target> ...).
  listed=$(python3 - "$cmake" "$target" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
m = re.search(r'add_(?:executable|library)\(\s*' + re.escape(sys.argv[2]) + r'\b([^)]*)\)', text)
if not m:
    sys.exit(f"no add_executable/add_library({sys.argv[2]} ...) in {sys.argv[1]}")
for path in re.findall(r'\$\{REPO\}/(\S+\.(?:cc|cu|cpp))', m.group(1)):
    print(path)
PY
  ) || { echo "check_cmake_sources: $cmake: cannot read target $target" >&2; errors=$((errors + 1)); continue; }
  wanted=$("$BAZEL" query --noshow_progress "kind('source file', deps($label))" 2>/dev/null |
           grep -E '^//(libs|bench|services|tools)[/:].*\.(cc|cu|cpp)$' | sed -e 's|^//||' -e 's|:|/|' | sort -u)
  [[ -n "$wanted" ]] || { echo "check_cmake_sources: bazel query found no sources for $label" >&2; errors=$((errors + 1)); continue; }
  missing=$(comm -23 <(echo "$wanted") <(echo "$listed" | sort -u))
  extra=$(comm -13 <(echo "$wanted") <(echo "$listed" | sort -u))
  for f in $missing; do echo "check_cmake_sources: $cmake ($target) lacks $f, which $label compiles" >&2; errors=$((errors + 1)); done
  for f in $extra; do echo "check_cmake_sources: $cmake ($target) lists $f, which $label does not compile" >&2; errors=$((errors + 1)); done
done
if [[ $errors -ne 0 ]]; then
  echo "check_cmake_sources: $errors mismatches" >&2
  exit 1
fi
echo "check_cmake_sources: ${#PAIRS[@]} CMake targets match their Bazel targets"
