#!/usr/bin/env bash
# Runs every CPU test of rlfleet on this machine, from a fresh Debian 12 clone:
#   1. installs the apt packages it needs (tools/setup.sh; quiet when present),
#   2. starts the servers the tests use (redis-server on a random loopback port),
#   3. runs `bazel test //...` without the `gpu`-tagged tests,
#   4. runs the checks beyond unit tests (thread-safety analysis, fuzzers over their
#      corpora, the library tests under ASan + UBSan),
#   5. prints `N passed, M failed` counted from the test cases' and checks' results,
#   6. stops what it started (by pid) and shuts the Bazel server down.
# Exits non-zero if any test failed or anything did not build.
# Extra arguments go to `bazel test` (e.g. a narrower target pattern after `--`).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

bash tools/setup.sh || { echo "setup failed"; echo "0 passed, 1 failed"; exit 1; }

REDIS_PID=""
cleanup() {
  if [[ -n "$REDIS_PID" ]] && kill -0 "$REDIS_PID" 2>/dev/null; then
    kill "$REDIS_PID" 2>/dev/null
    wait "$REDIS_PID" 2>/dev/null
  fi
  [[ -n "${REDIS_DIR:-}" ]] && rm -rf "$REDIS_DIR"
  bazel shutdown >/dev/null 2>&1 || true
}
trap cleanup EXIT

# redis-server on a free loopback port, in a private directory.
REDIS_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
REDIS_DIR=$(mktemp -d)
redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --dir "$REDIS_DIR" --save "" \
  --appendonly no --daemonize no --loglevel warning >"$REDIS_DIR/redis.log" 2>&1 &
REDIS_PID=$!
for _ in $(seq 1 100); do
  redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping >/dev/null 2>&1 && break
  kill -0 "$REDIS_PID" 2>/dev/null || break
  sleep 0.1
done
if ! redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping >/dev/null 2>&1; then
  echo "redis-server did not start:"; cat "$REDIS_DIR/redis.log"
  echo "0 passed, 1 failed"; exit 1
fi
export RLFLEET_REDIS_PORT=$REDIS_PORT
echo "redis-server pid $REDIS_PID on 127.0.0.1:$REDIS_PORT"

DISK_CACHE="${RLFLEET_BAZEL_DISK_CACHE:-$HOME/.cache/rlfleet-bazel-disk}"
mkdir -p "$DISK_CACHE"
START=$(date +%s)
bazel test //... --test_tag_filters=-gpu --disk_cache="$DISK_CACHE" --keep_going "$@"
BAZEL_RC=$?
echo "bazel test finished in $(( $(date +%s) - START )) s (exit $BAZEL_RC)"

TARGETS=$(bazel query 'tests(//...) except attr(tags, "gpu", tests(//...))' 2>/dev/null)
TESTLOGS=$(bazel info bazel-testlogs 2>/dev/null)
python3 "$ROOT/tools/count_test_results.py" "$TESTLOGS" $TARGETS > /tmp/rlfleet_count.$$
COUNT_RC=$?
SUMMARY=$(tail -1 /tmp/rlfleet_count.$$)
head -n -1 /tmp/rlfleet_count.$$
rm -f /tmp/rlfleet_count.$$
if [[ $BAZEL_RC -ne 0 && $COUNT_RC -eq 0 ]]; then
  # Something failed that is not a test case (e.g. a non-test target did not build).
  echo "bazel test exited $BAZEL_RC with no failing test case: counting the build as failed"
  SUMMARY=$(python3 -c 'import sys; w=sys.argv[1].split(", "); p=int(w[0].split()[0]); f=int(w[1].split()[0])+1; print(", ".join([f"{p} passed", f"{f} failed"]+w[2:]))' "$SUMMARY")
  COUNT_RC=1
fi

# Checks beyond the unit tests, each counted as results too (skipped with arguments,
# which narrow the run, or with RLFLEET_QUICK=1):
#   thread-safety   clang's -Wthread-safety over every .cc (tools/thread_safety.sh)
#   fuzz-sources    fuzz/harnesses.txt against the Bazel targets
#   fuzz/<harness>  each libFuzzer harness over its corpus plus 2000 runs
#   asan            the unit tests of the libraries (the model's tokenizer among them;
#                   not its libtorch tests) and of the buffer and weights services
#                   under ASan + UBSan, counted per test case
#   soak            bench/soak.sh --ci: the local fleet busy for 3 minutes, every
#                   service's RSS and open fds flat after a minute's warm-up
#   gateway-battery tests/battery/gateway_fleet.sh: ~48 hostile HTTP cases and 70
#                   concurrent streams against the gateway of a fleet training a run,
#                   then the gateway killed with streams open (replica gauges back to 0)
#   openai/<check>  the official OpenAI client library (npm `openai`) against
#                   rlfleet-gateway and a rollout replica, one result per check
#                   (tools/check_openai.sh, tests/openai/check.mjs)
#   k8s             deploy/k8s's kustomize builds resolve, every object validates against
#                   the Kubernetes OpenAPI schemas, their run files parse for every
#                   binary (tools/check_k8s.sh)
#   cmake-sources   the CMake lists built outside Bazel (deploy/gpu) against the Bazel
#                   targets they mirror (tools/check_cmake_sources.sh)
#   cuda-paths      the model backend's CUDA-only code (RLFLEET_TORCH_CUDA) compiles here,
#                   syntax only, against libtorch's c10/cuda and CUDA's headers
#                   (tools/check_cuda_paths.sh)
#   cmake-backends  deploy/gpu's CMake build of the model backends, here against Debian's
#                   libtorch, loaded by Bazel-built tests and rlfleet-rollout
#                   (tools/check_cmake_backends.sh)
#   tidy            clang-tidy's checks of .clang-tidy over every .cc (tools/tidy.sh)
#   format          every C++ file formatted as .clang-format says (tools/check_format.sh)
#   layers          every package declares its layer (tools/layers.bzl) and Bazel refuses
#                   a library reaching up or into a service (tools/check_layers.sh)
#   tsan            the libraries' unit tests under ThreadSanitizer against an absl
#                   built with TSan (tools/tsan.sh), counted per test case
EXTRA_P=0
EXTRA_F=0
extra() {  # extra NAME COMMAND...: one result
  local name=$1
  shift
  if "$@"; then EXTRA_P=$((EXTRA_P + 1)); echo "$name: passed"; else EXTRA_F=$((EXTRA_F + 1)); echo "FAILED: $name"; fi
}
if [[ $# -eq 0 && -z "${RLFLEET_QUICK:-}" ]]; then
  # (first: the binaries bazel test built are where bazel-bin points until another config runs)
  echo "== soak, CI form (bench/soak.sh --ci)"
  extra soak env RLFLEET_BIN="$(bazel info bazel-bin 2>/dev/null)/services" bash bench/soak.sh --ci --out="$(mktemp -d)"
  echo "== the gateway battery against a launched fleet training a run (tests/battery/gateway_fleet.sh)"
  GW_START=$(date +%s)
  extra gateway-battery env RLFLEET_BIN="$(bazel info bazel-bin 2>/dev/null)/services" bash tests/battery/gateway_fleet.sh \
    --out="$(mktemp -d)/gateway_battery.md"
  echo "gateway battery: $(( $(date +%s) - GW_START )) s"
  echo "== deploy/k8s: kustomize builds against the Kubernetes schemas (tools/check_k8s.sh)"
  extra k8s env RLFLEET_BIN="$(bazel info bazel-bin 2>/dev/null)/services" bash tools/check_k8s.sh
  echo "== the OpenAI client library against rlfleet-gateway (tools/check_openai.sh)"
  OPENAI_LOG=$(RLFLEET_BIN="$(bazel info bazel-bin 2>/dev/null)/services" \
    RLFLEET_MAKE_MODEL="$(bazel info bazel-bin 2>/dev/null)/examples/math/make_tiny_model" bash tools/check_openai.sh 2>&1)
  OPENAI_RC=$?
  echo "$OPENAI_LOG"
  openai_ok=$(echo "$OPENAI_LOG" | grep -c '^ok   ')
  openai_failed=$(echo "$OPENAI_LOG" | grep -c '^FAIL ')
  EXTRA_P=$((EXTRA_P + openai_ok))
  EXTRA_F=$((EXTRA_F + openai_failed))
  if [[ $OPENAI_RC -ne 0 && $openai_failed -eq 0 ]]; then extra openai false; fi
  echo "== the model backends built by CMake, as on a GPU host (tools/check_cmake_backends.sh)"
  extra cmake-backends bash tools/check_cmake_backends.sh
  echo "== the GPU host's pack holds every binary the launcher needs (tools/check_gpu_pack.sh)"
  extra gpu-pack bash tools/check_gpu_pack.sh
  echo "== thread safety (clang -Wthread-safety)"
  extra thread-safety bash tools/thread_safety.sh
  echo "== clang-tidy (.clang-tidy)"
  extra tidy bash tools/tidy.sh
  echo "== fuzzing (clang libFuzzer, ASan + UBSan)"
  extra fuzz-sources bash tools/check_fuzz_sources.sh
  extra cmake-sources bash tools/check_cmake_sources.sh
  extra cuda-paths bash tools/check_cuda_paths.sh
  extra layers bash tools/check_layers.sh
  extra format bash tools/check_format.sh
  FUZZ_OUT_LOG=$(bash tools/fuzz.sh --ci 2000 2>&1)
  FUZZ_RC=$?
  echo "$FUZZ_OUT_LOG" | grep -E ' execs=[0-9]+ crashes=[0-9]+$'
  harnesses=$(echo "$FUZZ_OUT_LOG" | grep -cE ' execs=[0-9]+ crashes=0$')
  crashed=$(echo "$FUZZ_OUT_LOG" | grep -E ' execs=[0-9]+ crashes=[0-9]+$' | grep -cv 'crashes=0$')
  EXTRA_P=$((EXTRA_P + harnesses))
  EXTRA_F=$((EXTRA_F + crashed))
  if [[ $FUZZ_RC -ne 0 && $crashed -eq 0 ]]; then
    echo "$FUZZ_OUT_LOG" | tail -20
    extra fuzz-build false
  fi
  echo "== unit tests under ASan + UBSan"
  ASAN_TARGETS=(//libs/common/... //libs/transport/... //libs/reshard/... //libs/redis/... //libs/registry/...
                //libs/rpc/... //libs/metrics/... //libs/tasks/... //libs/model/tests:hf_tokenizer_test //libs/model/tests:chat_template_test
                //services/buffer/... //services/weights/... //services/gateway/...)
  bazel test --config=asan "${ASAN_TARGETS[@]}" --test_tag_filters=-gpu --disk_cache="$DISK_CACHE" --keep_going \
    >/tmp/rlfleet_asan.$$ 2>&1
  ASAN_RC=$?
  grep -E '^//.*(FAILED|NO STATUS)|^ERROR' /tmp/rlfleet_asan.$$ | head -20
  ASAN_LOGS=$(bazel info --config=asan bazel-testlogs 2>/dev/null)
  ASAN_TESTS=$(bazel query "tests(set(${ASAN_TARGETS[*]})) except attr(tags, 'gpu', tests(set(${ASAN_TARGETS[*]})))" 2>/dev/null)
  ASAN_SUMMARY=$(python3 "$ROOT/tools/count_test_results.py" "$ASAN_LOGS" $ASAN_TESTS | tail -1)
  echo "asan: $ASAN_SUMMARY"
  EXTRA_P=$((EXTRA_P + $(echo "$ASAN_SUMMARY" | awk '{print $1}')))
  EXTRA_F=$((EXTRA_F + $(echo "$ASAN_SUMMARY" | awk -F', ' '{split($2, f, " "); print f[1]}')))
  [[ $ASAN_RC -ne 0 && "$ASAN_SUMMARY" == *", 0 failed"* ]] && extra asan-build false
  rm -f /tmp/rlfleet_asan.$$
  echo "== unit tests under TSan (tools/tsan.sh)"
  TSAN_OUT=$(bash "$ROOT/tools/tsan.sh" 2>&1)
  TSAN_RC=$?
  echo "$TSAN_OUT" | tail -12
  TSAN_SUMMARY=$(echo "$TSAN_OUT" | grep -E '^tsan: [0-9]+ passed, [0-9]+ failed' | tail -1 | sed 's/^tsan: //')
  if [[ -z "$TSAN_SUMMARY" ]]; then
    extra tsan false
  else
    EXTRA_P=$((EXTRA_P + $(echo "$TSAN_SUMMARY" | awk '{print $1}')))
    EXTRA_F=$((EXTRA_F + $(echo "$TSAN_SUMMARY" | awk -F', ' '{split($2, f, " "); print f[1]}')))
    [[ $TSAN_RC -ne 0 && "$TSAN_SUMMARY" == *", 0 failed"* ]] && extra tsan-build false
  fi
fi

SUMMARY=$(python3 -c 'import sys
w = sys.argv[1].split(", ")
p = int(w[0].split()[0]) + int(sys.argv[2]); f = int(w[1].split()[0]) + int(sys.argv[3])
print(", ".join([f"{p} passed", f"{f} failed"] + w[2:]))' "$SUMMARY" "$EXTRA_P" "$EXTRA_F")
[[ $EXTRA_F -ne 0 ]] && COUNT_RC=1
echo "$SUMMARY"
exit $COUNT_RC
