#!/usr/bin/env bash
# Runs every CPU test of rlfleet on this machine, from a fresh Debian 12 clone:
#   1. installs the apt packages it needs (tools/setup.sh; quiet when present),
#   2. starts the servers the tests use (redis-server on a random loopback port),
#   3. runs `bazel test //...` without the `gpu`-tagged tests,
#   4. prints `N passed, M failed` counted from the test cases' results,
#   5. stops what it started (by pid) and shuts the Bazel server down.
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
  SUMMARY=$(echo "$SUMMARY" | awk -F', ' '{split($2,f," "); $2=(f[1]+1)" failed"; print $1", "$2}')
  COUNT_RC=1
fi
echo "$SUMMARY"
exit $COUNT_RC
