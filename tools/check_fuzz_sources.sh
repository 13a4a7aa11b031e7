#!/usr/bin/env bash
# Checks fuzz/harnesses.txt (what tools/fuzz.sh compiles, outside Bazel) against the
# Bazel targets it names, so the fuzz build cannot silently drift from the real one:
#   - every .cc / .proto in a listed target's srcs is listed (compiled, or !-excluded);
#   - every listed source is in its target's srcs (no stale entry);
#   - for a harness whose first target is compiled whole, every in-repo cc_library that
#     target depends on is listed for the harness too (a new dependency is noticed).
# Exits non-zero naming each mismatch. Uses `bazel query` (offline, no build).
#
#   bash tools/check_fuzz_sources.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BAZEL="${BAZEL:-bazel}"
errors=0
fail() {
  echo "check_fuzz_sources: $*" >&2
  errors=$((errors + 1))
}

# Sources of `target` as repo paths (.cc and .proto only). A *_cc_proto target's sources
# are its .proto files (those of the matching *_proto filegroup, imports included).
target_sources() {
  local target="$1"
  local query="labels(srcs, $target)"
  if [[ "$target" == *_cc_proto ]]; then query="kind('source file', deps(${target%_cc_proto}_proto))"; fi
  "$BAZEL" query --noshow_progress "$query" 2>/dev/null |
    sed -e 's|^//||' -e 's|^:||' -e 's|:|/|' |
    { grep -E '\.(cc|proto)$' || true; } |
    sed -e 's|^proto/||'
}

declare -A LISTED    # "harness target" -> sources (with ! marks)
declare -A FIRST     # harness -> its first target
declare -A TARGETS   # harness -> its targets
while read -r harness target rest; do
  [[ -z "$harness" || "$harness" == \#* ]] && continue
  [[ "$target" == pkg || "$target" == lib ]] && continue
  [[ -z "${FIRST[$harness]:-}" ]] && FIRST[$harness]="$target"
  TARGETS[$harness]="${TARGETS[$harness]:-} $target"
  LISTED["$harness $target"]="$rest"
  [[ -f "fuzz/${harness}_fuzzer.cc" ]] || fail "$harness: fuzz/${harness}_fuzzer.cc does not exist"
done < fuzz/harnesses.txt

for key in "${!LISTED[@]}"; do
  read -r harness target <<< "$key"
  listed=" ${LISTED[$key]} "
  actual="$(target_sources "$target")"
  if [[ -z "$actual" ]]; then
    fail "$harness: $target has no .cc / .proto sources (renamed or removed?)"
    continue
  fi
  for src in $actual; do
    if [[ "$listed" != *" $src "* && "$listed" != *" !$src "* ]]; then
      fail "$harness: $target has $src, which fuzz/harnesses.txt does not list (compile it or !-exclude it)"
    fi
  done
  for src in ${LISTED[$key]}; do
    src="${src#!}"
    if ! grep -qxF "$src" <<< "$actual"; then
      fail "$harness: fuzz/harnesses.txt lists $src, which is not in $target's srcs"
    fi
  done
done

# The closure of a harness whose code under fuzz is compiled whole.
for harness in "${!FIRST[@]}"; do
  first="${FIRST[$harness]}"
  [[ "${LISTED["$harness $first"]}" == *"!"* ]] && continue
  deps="$("$BAZEL" query --noshow_progress "kind(cc_library, deps($first))" 2>/dev/null | { grep '^//' || true; })"
  for dep in $deps; do
    # Header-only libraries have nothing to compile.
    [[ -z "$(target_sources "$dep")" ]] && continue
    if [[ " ${TARGETS[$harness]} " != *" $dep "* ]]; then
      fail "$harness: $first depends on $dep, which fuzz/harnesses.txt does not list for it"
    fi
  done
done

if [[ $errors != 0 ]]; then
  echo "check_fuzz_sources: $errors problem(s) in fuzz/harnesses.txt" >&2
  exit 1
fi
echo "check_fuzz_sources: fuzz/harnesses.txt matches the Bazel targets"
