#!/usr/bin/env bash
# clang-tidy with the checks of .clang-tidy over the C++ sources of libs/ and services/
# (tools/clang_common.sh: the flags and files tools/thread_safety.sh uses too).
# Prints `tidy: N files, M warnings, K not parsed`; exits non-zero on any.
#   bash tools/tidy.sh            # every file
#   bash tools/tidy.sh FILE.cc    # some files
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
TIDY="${CLANG_TIDY:-clang-tidy-14}"
command -v "$TIDY" >/dev/null || { echo "tidy: $TIDY not installed (apt-get install clang-tidy-14)"; exit 1; }
source tools/clang_common.sh
FLAGS=("${CLANG_FLAGS[@]}")
check_one() {
  local f=$1 out rc
  out=$("$TIDY" --quiet "$f" -- "${FLAGS[@]}" 2>&1); rc=$?
  if grep -qE 'warning:|error: .*\[[a-z]+-' <<<"$out"; then
    grep -E '(warning|error):' -A2 <<<"$out" | grep -v '^--$'
  elif ((rc != 0)); then
    echo "tidy: clang-tidy could not parse $f:"; grep -m3 'error:' <<<"$out"
  fi
}
clang_check_main tidy '(warning|error): .*\[[a-z]+-[a-z-]+(,[a-z-]+)*\]$' "$@"
