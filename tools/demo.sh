#!/usr/bin/env bash
# The local fleet demo, on one machine over loopback.
#
# Today the fleet that exists is the controller (registry + status) and the `rlfleet`
# CLI: this script installs what is missing, builds them, starts the controller on a
# free loopback port, registers nothing by hand but shows that it answers (health,
# status, replicas), and stops it by pid. The full RL loop joins here as the rollout,
# reward, buffer, trainer and weights services land.
#   bash tools/demo.sh            # start, show, stop
#   bash tools/demo.sh --keep     # leave the controller running until Ctrl-C
set -euo pipefail
cd "$(dirname "$0")/.."
KEEP=0
[[ "${1:-}" == "--keep" ]] && KEEP=1

bash tools/setup.sh
DISK_CACHE="${RLFLEET_BAZEL_DISK_CACHE:-$HOME/.cache/rlfleet-bazel-disk}"
mkdir -p "$DISK_CACHE"
echo "== building the fleet (first build on a cold cache takes a few minutes)"
bazel build --disk_cache="$DISK_CACHE" //services/... 2>&1 | grep -E "^(ERROR|INFO: Build completed|FAILED)" || true
BIN=bazel-bin/services/controller
[[ -x $BIN/rlfleet-controller ]] || { echo "build failed"; exit 1; }

RUN_DIR=$(mktemp -d "${TMPDIR:-/tmp}/rlfleet-demo.XXXXXX")
CONTROLLER_PID=""
stop() {
  if [[ -n "$CONTROLLER_PID" ]] && kill -0 "$CONTROLLER_PID" 2>/dev/null; then
    echo "== stopping controller (pid $CONTROLLER_PID)"
    kill -TERM "$CONTROLLER_PID"
    wait "$CONTROLLER_PID" 2>/dev/null || true
  fi
  [[ $KEEP -eq 1 ]] || bazel shutdown >/dev/null 2>&1 || true
}
trap stop EXIT

echo "== starting rlfleet-controller on a free loopback port"
$BIN/rlfleet-controller --host=127.0.0.1 --port=0 --port_file="$RUN_DIR/controller.port" \
  >"$RUN_DIR/controller.log" 2>&1 &
CONTROLLER_PID=$!
for _ in $(seq 1 100); do
  [[ -s "$RUN_DIR/controller.port" ]] && break
  kill -0 "$CONTROLLER_PID" 2>/dev/null || { cat "$RUN_DIR/controller.log"; exit 1; }
  sleep 0.1
done
PORT=$(cat "$RUN_DIR/controller.port")
ADDR=127.0.0.1:$PORT
head -1 "$RUN_DIR/controller.log"

echo "== rlfleet health --controller=$ADDR"
$BIN/rlfleet health --controller="$ADDR"
echo "== rlfleet status --controller=$ADDR"
$BIN/rlfleet status --controller="$ADDR"
echo "== rlfleet replicas --controller=$ADDR"
$BIN/rlfleet replicas --controller="$ADDR"
echo "== the fleet answers; logs in $RUN_DIR"
if [[ $KEEP -eq 1 ]]; then
  echo "controller running on $ADDR (pid $CONTROLLER_PID); Ctrl-C to stop"
  wait "$CONTROLLER_PID"
fi
