#!/usr/bin/env bash
# ThreadSanitizer over the tests whose threads meet in our code and in absl: the
# libraries below gRPC and libtorch (common, metrics, transport, reshard, dist, redis,
# registry) and the buffer's core.
#
#   bash tools/tsan.sh [bazel test targets...]     # ends with `tsan: N passed, M failed`
#
# Debian's absl is not built with TSan, so absl::Mutex's synchronisation is invisible to
# it and every Mutex-guarded field reads as a race. This script builds the same absl
# (Debian's source, abseil 20220623.1, with Debian's options.h so the ABI is the same)
# with -fsanitize=thread once, into ~/.cache/rlfleet-tsan, and runs the tests built with
# --config=tsan against it through LD_LIBRARY_PATH (the same sonames as Debian's).
# Tests that use libtorch are left out (its thread pool is uninstrumented); what
# Debian's gRPC, UCX and absl itself do on their own threads is suppressed
# (tools/tsan.supp, each entry with its reason).
set -euo pipefail
cd "$(dirname "$0")/.."

ABSL=20220623.1
ABSL_SHA256=abfe2897f3a30edaa74bc34365afe3c2a3cd012091a97dc7e008f7016adcd5fe
ABSL_URL="http://deb.debian.org/debian/pool/main/a/abseil/abseil_${ABSL}.orig.tar.gz"
CACHE="${RLFLEET_TSAN_CACHE:-$HOME/.cache/rlfleet-tsan}"
PREFIX="$CACHE/absl-$ABSL-tsan"

debian_absl=$(dpkg-query -W -f='${Version}' libabsl-dev 2>/dev/null || true)
if [[ "$debian_absl" != "$ABSL"* ]]; then
  echo "tsan: Debian's libabsl-dev is '$debian_absl', this script builds $ABSL: update ABSL and ABSL_SHA256" >&2
  exit 2
fi
for tool in cmake curl g++; do
  command -v "$tool" >/dev/null || { echo "tsan: $tool missing (apt-get install cmake curl g++)" >&2; exit 2; }
done

if [[ ! -f "$PREFIX/.built" ]]; then
  echo "tsan: building absl $ABSL with -fsanitize=thread into $PREFIX (once; a few minutes)"
  work=$(mktemp -d "${TMPDIR:-/tmp}/rlfleet-tsan-absl.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  curl -sSfo "$work/absl.tar.gz" "$ABSL_URL"
  echo "$ABSL_SHA256  $work/absl.tar.gz" | sha256sum -c --quiet -
  tar xzf "$work/absl.tar.gz" -C "$work"
  src="$work/abseil-$ABSL"
  cp /usr/include/absl/base/options.h "$src/absl/base/options.h"  # (Debian's choices: the same ABI)
  sed -i 's/SOVERSION "2206.0.0"/SOVERSION "20220623"/' "$src/CMake/AbseilHelpers.cmake"
  cmake -S "$src" -B "$work/build" -DBUILD_SHARED_LIBS=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_STANDARD=17 -DABSL_PROPAGATE_CXX_STD=ON -DBUILD_TESTING=OFF \
    -DCMAKE_CXX_FLAGS="-fsanitize=thread -fno-omit-frame-pointer" -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread \
    -DCMAKE_INSTALL_PREFIX="$PREFIX" >"$work/cmake.log" 2>&1 || { tail -20 "$work/cmake.log"; exit 1; }
  cmake --build "$work/build" -j"$(nproc)" >"$work/build.log" 2>&1 || { tail -20 "$work/build.log"; exit 1; }
  cmake --install "$work/build" >/dev/null
  touch "$PREFIX/.built"
fi
LIB="$PREFIX/lib"
[[ -d "$LIB" ]] || LIB="$PREFIX/lib64"
# Every absl library a test loads must come from here (one uninstrumented Mutex is enough
# to report false races): check that each of Debian's sonames has its twin.
missing=0
for so in /usr/lib/x86_64-linux-gnu/libabsl_*.so.20220623; do
  [[ -e "$LIB/$(basename "$so")" ]] || { echo "tsan: $(basename "$so") was not built" >&2; missing=1; }
done
[[ $missing -eq 0 ]] || exit 1

if [[ $# -gt 0 ]]; then
  targets=("$@")
else
  targets=(
    //libs/common/tests:common_test //libs/common/tests:checksum_test //libs/common/tests:files_test
    //libs/metrics/tests:metrics_test
    //libs/transport/tests:loopback_conformance_test //libs/transport/tests:fault_transport_test
    //libs/transport/tests:ucx_conformance_test //libs/transport/tests:descriptor_fetcher_test
    //libs/reshard:executor_test //libs/reshard:round_test //libs/reshard:plan_test
    //libs/dist/tests:transport_group_test //libs/dist/tests:collectives_test
    //libs/redis/tests:redis_client_test //libs/registry/tests:registry_test
    //services/buffer/tests:buffer_core_test //services/buffer/tests:buffer_store_test
  )
fi

# Cases whose point is a deadline that TSan's 5-15x slowdown misses (a 16 MB /metrics
# exposition rendered twice within 4 s); not run here (so not counted), run by
# tools/test.sh and under ASan.
# Also left out: cases that serve gRPC (BufferService.*, BufferStreamMerging.*,
# MetricsBindFlag.*): gRPC's own threads pass an absl::Status, a call's op set and a
# callback tag between them through synchronisation TSan cannot see (Debian's gRPC is
# uninstrumented). Tried for BufferStreamMerging: suppressing each in turn
# (grpc_core::Status*, CallOpSet::FillOps / FinalizeResult) only moved the report to the
# next hand-off (CallbackWithSuccessTag::Run, under which our reactors run and so cannot
# be suppressed); about 1 run in 8 reported one.
LEFT_OUT="MetricsServer.AClientThatDoesNotReadDoesNotBlockAScrape:BufferService.*:BufferStreamMerging.*:MetricsBindFlag.*"

set +e
bazel test --config=tsan --disk_cache="$HOME/.cache/rlfleet-bazel-disk" --test_env=LD_LIBRARY_PATH="$LIB" \
  --test_env=TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tools/tsan.supp" \
  --test_env=UCX_MEM_EVENTS=no --test_filter="-$LEFT_OUT" \
  --test_timeout=900 --keep_going "${targets[@]}" \
  >"${TMPDIR:-/tmp}/rlfleet_tsan.$$" 2>&1
rc=$?
set -e
grep -E '^//.*(FAILED|NO STATUS|TIMEOUT)|^ERROR|WARNING: ThreadSanitizer' "${TMPDIR:-/tmp}/rlfleet_tsan.$$" | head -20 || true
rm -f "${TMPDIR:-/tmp}/rlfleet_tsan.$$"
testlogs=$(bazel info --config=tsan bazel-testlogs 2>/dev/null)
tests=$(bazel query "tests(set(${targets[*]}))" 2>/dev/null)
# shellcheck disable=SC2086  # (one target per word)
summary=$(python3 tools/count_test_results.py "$testlogs" $tests | tail -1 || true)
echo "tsan: $summary"
[[ $rc -eq 0 && "$summary" == *", 0 failed"* ]]
