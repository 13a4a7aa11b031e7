#!/usr/bin/env bash
# The local fleet demo, on one machine over loopback.
#
# Installs what is missing, builds the fleet, starts the services (the controller,
# then reward, buffer, trainer, the weights service and rollout replicas, each
# registering with the controller's registry) on free loopback ports, shows that they
# answer, has the controller run the RL loop across them (rollout generates, reward
# scores, the buffer groups, the trainer updates, the weights service checks each new
# version and has the rollout replicas install it) while a newcomer watches held-out
# accuracy rise, then shows the
# trained policy answering and stops everything by pid. RLFLEET_DEMO_STEPS bounds
# the loop (default 300, at most about 3 minutes on 2 cores).
#   bash tools/demo.sh            # start, show, stop
#   bash tools/demo.sh --keep     # leave the fleet running until Ctrl-C
set -euo pipefail
cd "$(dirname "$0")/.."
KEEP=0
[[ "${1:-}" == "--keep" ]] && KEEP=1

bash tools/setup.sh
DISK_CACHE="${RLFLEET_BAZEL_DISK_CACHE:-$HOME/.cache/rlfleet-bazel-disk}"
mkdir -p "$DISK_CACHE"
echo "== building the fleet (first build on a cold cache takes a few minutes)"
bazel build --disk_cache="$DISK_CACHE" //services/... 2>&1 | grep -E "^(ERROR|FAILED)" || true
B=bazel-bin/services
for bin in controller/rlfleet-controller reward/rlfleet-reward buffer/rlfleet-buffer rollout/rlfleet-rollout trainer/rlfleet-trainer weights/rlfleet-weights controller/rlfleet; do
  [[ -x $B/$bin ]] || { echo "build failed: $bin missing"; exit 1; }
done

RUN_DIR=$(mktemp -d "${TMPDIR:-/tmp}/rlfleet-demo.XXXXXX")
PIDS=()
stop() {
  for pid in "${PIDS[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${PIDS[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
  [[ ${#PIDS[@]} -gt 0 ]] && echo "== stopped ${#PIDS[@]} services (pids ${PIDS[*]})"
  [[ $KEEP -eq 1 ]] || bazel shutdown >/dev/null 2>&1 || true
}
trap stop EXIT

# start NAME BINARY [FLAGS...]: starts a service on a free loopback port; sets ADDR_<NAME>.
start() {
  local name=$1 bin=$2
  shift 2
  "$B/$bin" --host=127.0.0.1 --port=0 --port_file="$RUN_DIR/$name.port" "$@" >"$RUN_DIR/$name.log" 2>&1 &
  local pid=$!
  PIDS+=("$pid")
  for _ in $(seq 1 300); do
    [[ -s "$RUN_DIR/$name.port" ]] && break
    kill -0 "$pid" 2>/dev/null || { echo "$name failed:"; cat "$RUN_DIR/$name.log"; exit 1; }
    sleep 0.1
  done
  [[ -s "$RUN_DIR/$name.port" ]] || { echo "$name did not start"; exit 1; }
  printf -v "ADDR_$name" '127.0.0.1:%s' "$(cat "$RUN_DIR/$name.port")"
  echo "   $(grep -m1 "listening on" "$RUN_DIR/$name.log") (pid $pid)"
}

echo "== starting the fleet on loopback"
# The controller first: every other service registers with it (--registry_address)
# and runs find them through its registry.
start controller controller/rlfleet-controller --runs_dir="$RUN_DIR/runs"
# registered NAME: waits for NAME's "registered as" line.
registered() {
  for _ in $(seq 1 100); do grep -q "registered as" "$RUN_DIR/$1.log" && break; sleep 0.1; done
  grep -q "registered as" "$RUN_DIR/$1.log" || { echo "$1 did not register:"; cat "$RUN_DIR/$1.log"; exit 1; }
  echo "   $(grep -m1 "registered as" "$RUN_DIR/$1.log")"
}
start reward reward/rlfleet-reward --registry_address="$ADDR_controller"
registered reward
start buffer buffer/rlfleet-buffer --store=memory:// --registry_address="$ADDR_controller"
registered buffer
# (no --publish_dir: the trainer keeps each version in memory on its UCX data plane)
start trainer trainer/rlfleet-trainer --buffer="$ADDR_buffer" --registry_address="$ADDR_controller" \
  --checkpoint_root="$RUN_DIR/checkpoints"
registered trainer
# Every version the trainer publishes goes through the weights service, which checks
# its digest and pushes it to the rollout replicas (with RLFLEET_DEMO_ROLLOUTS > 1,
# chained: each relays every chunk to the next as it arrives).
start weights weights/rlfleet-weights --registry_address="$ADDR_controller" --relay_fanout=1
registered weights
ROLLOUTS="${RLFLEET_DEMO_ROLLOUTS:-1}"
for i in $(seq 1 "$ROLLOUTS"); do
  name=rollout; [[ $i -gt 1 ]] && name="rollout$i"
  start "$name" rollout/rlfleet-rollout --registry_address="$ADDR_controller"
  registered "$name"
done

health() {
  for name in controller reward buffer rollout trainer weights; do
    addr_var="ADDR_$name"
    printf '   %-10s ' "$name"
    $B/controller/rlfleet health --controller="${!addr_var}" | sed 's/^controller //' || true
  done
}
echo "== health (the rollout replica is NOT_SERVING until it has verified weights)"
health
echo "== rlfleet status --controller=$ADDR_controller"
$B/controller/rlfleet status --controller="$ADDR_controller"
STEPS="${RLFLEET_DEMO_STEPS:-300}"
echo "== the RL loop, run by the controller: rollout -> reward -> buffer -> trainer -> weights service -> rollout ($STEPS steps at most)"
echo "   GRPO on reverse n=3..5, 32 prompts x 8 samples per step; held-out greedy exact match every 10 steps"
echo "   rlfleet run --controller=$ADDR_controller (rlfleet stop in another terminal ends it early)"
$B/controller/rlfleet run --controller="$ADDR_controller" --entropy_coef="${RLFLEET_DEMO_ENTROPY:-0.05}" \
  --steps="$STEPS" --stop_at="${RLFLEET_DEMO_STOP_AT:-0.8}" --max_staleness="${RLFLEET_DEMO_STALENESS:-0}" --timeout=120s
echo "== health now"
health
echo "== the trained policy on one prompt"
$B/controller/rlfleet try --rollout="$ADDR_rollout" --reward="$ADDR_reward" --prompt=reverse:4817 --samples=4
echo "== the fleet answers; logs in $RUN_DIR"
if [[ $KEEP -eq 1 ]]; then
  echo "running; Ctrl-C to stop"
  wait
fi
