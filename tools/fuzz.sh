#!/usr/bin/env bash
# Builds the libFuzzer harnesses in fuzz/ with Debian's clang-14 (libFuzzer + ASan +
# UBSan) and runs them over their seed corpora (fuzz/corpus/<harness>/).
#
#   bash tools/fuzz.sh [SECONDS]        each harness SECONDS (default 10), new inputs kept
#                                       in a scratch corpus (not the repo's)
#   bash tools/fuzz.sh --ci [RUNS]      CI: each harness over its corpus plus RUNS
#                                       executions (default 5000, -runs=N; deterministic seed)
#   bash tools/fuzz.sh --build          build only
#   FUZZ_ONLY="a b" bash tools/fuzz.sh  only those harnesses
#
# Prints per harness `<harness> execs=N crashes=M` and exits non-zero on any crash (the
# reproducer is copied to fuzz/crashes/<harness>-<hash>). What each harness compiles is
# fuzz/harnesses.txt, checked against the Bazel targets by tools/check_fuzz_sources.sh.
# Bazel here is configured for g++, so this builds outside it: protoc from /usr/bin
# into a scratch directory, pkg-config for Abseil / protobuf / hiredis.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${FUZZ_OUT:-${TMPDIR:-/tmp}/rlfleet-fuzz}"
CXX="${FUZZ_CXX:-clang++-14}"
MODE=time
ARG=10
case "${1:-}" in
  --ci) MODE=ci; ARG="${2:-5000}" ;;
  --build) MODE=build ;;
  "") ;;
  *) ARG="$1" ;;
esac

command -v "$CXX" >/dev/null || { echo "fuzz.sh: $CXX not found (apt-get install -y clang-14 libclang-rt-14-dev)" >&2; exit 2; }

SAN="-fsanitize=address,undefined -fno-sanitize=vptr -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
PKGS="absl_status absl_statusor absl_strings absl_str_format absl_time absl_synchronization absl_flags
      absl_flags_parse absl_flags_usage absl_flags_reflection absl_hash absl_flat_hash_map absl_flat_hash_set
      absl_random_random absl_cleanup absl_span absl_optional absl_variant protobuf"
# (fuzzer-no-link: coverage feedback from the code under test, not only the harness)
CXXFLAGS="-std=c++17 -g -O1 $SAN -fsanitize=fuzzer-no-link -I$ROOT -I$OUT/gen $(pkg-config --cflags $PKGS)"
# (-Wl,--start-group: Abseil's static archives refer to each other in both directions)
LIBS_BASE="$(pkg-config --libs $PKGS)"

mkdir -p "$OUT" "$ROOT/fuzz/crashes"
# Objects built with other flags are stale.
if [[ "$(cat "$OUT/flags" 2>/dev/null)" != "$CXX $CXXFLAGS" ]]; then rm -rf "$OUT/obj"; fi
echo "$CXX $CXXFLAGS" > "$OUT/flags"
mkdir -p "$OUT/obj" "$OUT/gen" "$OUT/bin"

# The table: harness -> sources, protos, pkg-config packages, linker flags.
declare -A SRCS PROTOS PKG LIBS
HARNESSES=()
while read -r harness target rest; do
  [[ -z "$harness" || "$harness" == \#* ]] && continue
  if [[ " ${HARNESSES[*]} " != *" $harness "* ]]; then HARNESSES+=("$harness"); fi
  case "$target" in
    pkg) PKG[$harness]="${PKG[$harness]:-} $rest"; continue ;;
    lib) LIBS[$harness]="${LIBS[$harness]:-} $rest"; continue ;;
  esac
  for src in $rest; do
    case "$src" in
      !*) ;;
      *.proto) PROTOS[$harness]="${PROTOS[$harness]:-} $src" ;;
      *) SRCS[$harness]="${SRCS[$harness]:-} $src" ;;
    esac
  done
done < "$ROOT/fuzz/harnesses.txt"
if [[ -n "${FUZZ_ONLY:-}" ]]; then read -r -a HARNESSES <<< "$FUZZ_ONLY"; fi

# Compiles $1 (a path) to $2 unless $2 is newer than it and every header it read.
compile() {
  local src="$1" obj="$2"
  if [[ -f "$obj" && -f "$obj.d" ]]; then
    local stale=0 dep
    for dep in $(sed -e 's/^[^:]*://' -e 's/\\$//' "$obj.d"); do
      if [[ "$dep" -nt "$obj" ]]; then stale=1; break; fi
    done
    [[ $stale == 0 ]] && return 0
  fi
  mkdir -p "$(dirname "$obj")"
  echo "  CXX $src" >&2
  $CXX $CXXFLAGS ${3:-} -MMD -MF "$obj.d" -c "$src" -o "$obj"
}

build() {
  local h="$1" objs=() src proto
  for proto in ${PROTOS[$h]:-}; do
    local pbcc="$OUT/gen/${proto%.proto}.pb.cc"
    if [[ ! -f "$pbcc" || "$ROOT/proto/$proto" -nt "$pbcc" ]]; then
      /usr/bin/protoc -I"$ROOT/proto" --cpp_out="$OUT/gen" "$ROOT/proto/$proto"
    fi
  done
  for proto in ${PROTOS[$h]:-}; do
    local pbcc="$OUT/gen/${proto%.proto}.pb.cc"
    compile "$pbcc" "$OUT/obj/gen/${proto%.proto}.pb.o" "-w"
    objs+=("$OUT/obj/gen/${proto%.proto}.pb.o")
  done
  for src in ${SRCS[$h]:-} "fuzz/${h}_fuzzer.cc"; do
    compile "$ROOT/$src" "$OUT/obj/${src%.cc}.o"
    objs+=("$OUT/obj/${src%.cc}.o")
  done
  local extra=""
  [[ -n "${PKG[$h]:-}" ]] && extra="$(pkg-config --libs ${PKG[$h]})"
  $CXX $SAN -fsanitize=fuzzer "${objs[@]}" -o "$OUT/bin/${h}_fuzzer" \
    -Wl,--start-group $LIBS_BASE -Wl,--end-group $extra ${LIBS[$h]:-} -lpthread
}

for h in "${HARNESSES[@]}"; do
  echo "building $h" >&2
  build "$h"
done
[[ $MODE == build ]] && exit 0

# The fake Redis and loopback transports need no environment; ucx_rkey runs two UCX
# transports over tcp in-process (fuzz/lsan.supp: what LSan cannot follow inside UCX).
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}"
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$ROOT/fuzz/lsan.supp}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
failed=0
for h in "${HARNESSES[@]}"; do
  corpus="$ROOT/fuzz/corpus/$h"
  mkdir -p "$corpus"
  log="$OUT/$h.log"
  work="$OUT/work/$h"
  rm -rf "$work" "$OUT/artifacts/$h"
  mkdir -p "$work" "$OUT/artifacts/$h"
  flags=(-rss_limit_mb=4096 -timeout=10 -max_len=65536 -artifact_prefix="$OUT/artifacts/$h/" -print_final_stats=1)
  if [[ $MODE == ci ]]; then
    flags+=(-runs="$ARG" -seed=1)
  else
    flags+=(-max_total_time="$ARG")
  fi
  set +e
  # New inputs go to the scratch corpus (first directory); the seeds are read only.
  "$OUT/bin/${h}_fuzzer" "${flags[@]}" "$work" "$corpus" > "$log" 2>&1
  rc=$?
  set -e
  execs="$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1 || true)"
  crashes=0
  for a in "$OUT/artifacts/$h"/*; do
    [[ -f "$a" ]] || continue
    crashes=$((crashes + 1))
    cp "$a" "$ROOT/fuzz/crashes/$h-$(basename "$a")"
  done
  if [[ $rc != 0 && $crashes == 0 ]]; then crashes=1; fi
  echo "$h execs=${execs:-0} crashes=$crashes"
  if [[ $crashes != 0 ]]; then
    failed=1
    echo "  log: $log; reproducers: fuzz/crashes/$h-*" >&2
    grep -m3 -E "ERROR: |runtime error|SUMMARY" "$log" | sed 's/^/  /' >&2 || true
  fi
done
exit $failed
