#!/usr/bin/env bash
# clang's thread-safety analysis over the C++ sources, so that ABSL_GUARDED_BY and
# ABSL_EXCLUSIVE_LOCKS_REQUIRED are checked, not only written (g++ ignores them).
# Bazel here is configured for g++, so this runs clang++-14 -fsyntax-only on every
# .cc of libs/ and services/ (tests included) with the include paths Bazel uses, after
# `bazel build` has generated the protobuf headers. Prints `thread-safety: N files, M
# warnings` and exits non-zero on any warning.
#   bash tools/thread_safety.sh            # every file
#   bash tools/thread_safety.sh FILE.cc    # some files
set -uo pipefail
cd "$(dirname "$0")/.."
CLANG=${CLANG:-clang++-14}
command -v "$CLANG" >/dev/null || { echo "thread-safety: $CLANG not installed (apt-get install clang-14)"; exit 1; }

source tools/clang_common.sh
FLAGS=(-fsyntax-only -Wthread-safety -Wthread-safety-beta -Werror=thread-safety-analysis "${CLANG_FLAGS[@]}")

# One file: its thread-safety diagnostics, or a line saying it did not parse.
check_one() {
  local f=$1 out rc
  out=$("$CLANG" "${FLAGS[@]}" "$f" 2>&1); rc=$?
  if grep -q 'Wthread-safety' <<<"$out"; then
    echo "$out" | grep -E 'Wthread-safety' -A2
  elif ((rc != 0)); then
    echo "thread-safety: clang could not parse $f:"; echo "$out" | grep -m3 'error:'
  fi
}

clang_check_main thread-safety '\[-W.*thread-safety' "$@"
