#!/usr/bin/env bash
# The local fleet launcher: every rlfleet service as its own process on loopback.
#
#   deploy/local/launch.sh [--rollouts=N] [--redis=redis://host:port] [--dir=DIR] [-- MODEL FLAGS...]
#
# Starts redis-server (the embedded default, on a free loopback port, when no --redis
# is given), the controller (registry in Redis, --scaler=launcher), reward, the buffer
# (durable in Redis), the trainer and N rollout replicas that register with the
# controller. Each service writes DIR/<name>.log. While it runs it keeps the rollout
# replicas at the count `rlfleet scale rollout=N` asks for (a new one registers, gets
# the current weights and is admitted; a removed one gets SIGTERM, deregisters and is
# drained by the controller). Ctrl-C (or SIGTERM), or any core service dying, stops
# everything it started, by pid, and leaves no process behind.
# Binaries come from $RLFLEET_BIN (default bazel-bin/services; build them first with
# `bazel build //services/...`). MODEL FLAGS go to the rollout replicas and the
# trainer (e.g. -- --d_model=64 --n_layers=2).
set -uo pipefail
BIN="${RLFLEET_BIN:-bazel-bin/services}"
ROLLOUTS=1
REDIS_URL=""
DIR=""
MODEL=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rollouts=*) ROLLOUTS="${1#*=}" ;;
    --redis=*) REDIS_URL="${1#*=}" ;;
    --dir=*) DIR="${1#*=}" ;;
    --) shift; MODEL=("$@"); break ;;
    *) echo "launch.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[[ -n "$DIR" ]] || DIR=$(mktemp -d "${TMPDIR:-/tmp}/rlfleet-local.XXXXXX")
mkdir -p "$DIR"
for bin in controller/rlfleet-controller controller/rlfleet reward/rlfleet-reward buffer/rlfleet-buffer \
           rollout/rlfleet-rollout trainer/rlfleet-trainer weights/rlfleet-weights; do
  [[ -x "$BIN/$bin" ]] || { echo "launch.sh: $BIN/$bin missing: bazel build //services/..." >&2; exit 2; }
done

CORE_PIDS=()       # redis, controller, reward, buffer, trainer, weights
ROLLOUT_PIDS=()    # in start order
ROLLOUT_NAMES=()
STOPPING=0
stop_all() {
  STOPPING=1
  local pid
  for pid in "${ROLLOUT_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for pid in "${ROLLOUT_PIDS[@]}"; do wait "$pid" 2>/dev/null; done
  # The others in reverse start order (redis last).
  for ((i = ${#CORE_PIDS[@]} - 1; i >= 0; i--)); do
    kill -TERM "${CORE_PIDS[$i]}" 2>/dev/null
    wait "${CORE_PIDS[$i]}" 2>/dev/null
  done
  echo "launch.sh: stopped $(( ${#ROLLOUT_PIDS[@]} + ${#CORE_PIDS[@]} )) processes; logs in $DIR"
}
trap 'stop_all; exit 0' INT TERM

# start NAME COMMAND...: a service on a free loopback port; sets ADDR and PID.
start() {
  local name=$1
  shift
  rm -f "$DIR/$name.port"
  "$@" --host=127.0.0.1 --port=0 --port_file="$DIR/$name.port" >"$DIR/$name.log" 2>&1 &
  PID=$!
  for _ in $(seq 1 600); do
    [[ -s "$DIR/$name.port" ]] && break
    kill -0 "$PID" 2>/dev/null || { echo "launch.sh: $name failed:"; tail -5 "$DIR/$name.log"; return 1; }
    sleep 0.1
  done
  [[ -s "$DIR/$name.port" ]] || { echo "launch.sh: $name did not start"; return 1; }
  ADDR="127.0.0.1:$(cat "$DIR/$name.port")"
  echo "launch.sh: $name on $ADDR (pid $PID, log $DIR/$name.log)"
  add_target "$name"
}

# Prometheus: every service's /metrics address into DIR/prometheus/targets.json, and
# DIR/prometheus/prometheus.yml (deploy/prometheus with the paths filled in).
HERE="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$DIR/prometheus"
declare -A TARGETS=()
write_targets() {
  (IFS=,; echo "[${TARGETS[*]}]") > "$DIR/prometheus/targets.json.tmp"
  mv "$DIR/prometheus/targets.json.tmp" "$DIR/prometheus/targets.json"
}
add_target() {
  local metrics
  metrics=$(grep -o 'metrics on http://[0-9.:]*' "$DIR/$1.log" | head -1 | sed 's|metrics on http://||')
  [[ -n "$metrics" ]] && TARGETS[$1]="{\"targets\": [\"$metrics\"], \"labels\": {\"service\": \"$1\"}}"
  write_targets
}
remove_target() {
  unset "TARGETS[$1]"
  write_targets
}
if [[ -f "$HERE/../prometheus/prometheus.yml" ]]; then
  cp "$HERE/../prometheus/alerts.yml" "$DIR/prometheus/alerts.yml"
  sed -e "s|RULES_PATH|$DIR/prometheus/alerts.yml|" -e "s|TARGETS_PATH|$DIR/prometheus/targets.json|" \
    "$HERE/../prometheus/prometheus.yml" > "$DIR/prometheus/prometheus.yml"
fi

fail() { echo "launch.sh: $*" >&2; stop_all; exit 1; }

if [[ -z "$REDIS_URL" ]]; then
  REDIS_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  mkdir -p "$DIR/redis"
  redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --dir "$DIR/redis" --appendonly yes --save "" \
    --daemonize no --loglevel warning >"$DIR/redis.log" 2>&1 &
  CORE_PIDS+=($!)
  for _ in $(seq 1 100); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
  redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 || fail "redis-server did not start: $(tail -3 "$DIR/redis.log")"
  REDIS_URL="redis://127.0.0.1:$REDIS_PORT"
  echo "launch.sh: redis-server on $REDIS_URL (pid ${CORE_PIDS[0]}, AOF in $DIR/redis)"
fi
# The controller first: the other services register with it (--registry_address) and
# runs find them through its registry (Redis-backed here).
start controller "$BIN/controller/rlfleet-controller" --registry="$REDIS_URL/registry:" --scaler=launcher \
  --runs_dir="$DIR/runs" || fail "controller"
CORE_PIDS+=("$PID"); CONTROLLER=$ADDR
# registered NAME: waits until NAME's log says it registered with the controller.
registered() {
  for _ in $(seq 1 100); do grep -q "registered as" "$DIR/$1.log" && return 0; sleep 0.1; done
  echo "launch.sh: $1 did not register: $(tail -3 "$DIR/$1.log")"
  return 1
}
start reward "$BIN/reward/rlfleet-reward" --registry_address="$CONTROLLER" || fail "reward"
CORE_PIDS+=("$PID")
registered reward || fail "reward"
start buffer "$BIN/buffer/rlfleet-buffer" --store="$REDIS_URL/buffer:" --registry_address="$CONTROLLER" ||
  fail "buffer"
CORE_PIDS+=("$PID"); BUFFER=$ADDR
registered buffer || fail "buffer"
start trainer "$BIN/trainer/rlfleet-trainer" --buffer="$BUFFER" "${MODEL[@]}" \
  --registry_address="$CONTROLLER" || fail "trainer"
CORE_PIDS+=("$PID")
registered trainer || fail "trainer"
# Versions are pushed to the replicas in two relay chains (each replica passing every
# chunk on to the next as it arrives), so rlfleet-weights sends each at most twice
# however many replicas there are.
start weights "$BIN/weights/rlfleet-weights" --registry_address="$CONTROLLER" \
  --relay_fanout="${RLFLEET_RELAY_FANOUT:-2}" || fail "weights"
CORE_PIDS+=("$PID")
registered weights || fail "weights"

NEXT_ROLLOUT=0
add_rollout() {
  start "rollout$NEXT_ROLLOUT" "$BIN/rollout/rlfleet-rollout" --registry_address="$CONTROLLER" "${MODEL[@]}" ||
    fail "rollout$NEXT_ROLLOUT"
  ROLLOUT_PIDS+=("$PID")
  ROLLOUT_NAMES+=("rollout$NEXT_ROLLOUT")
  NEXT_ROLLOUT=$((NEXT_ROLLOUT + 1))
}
remove_rollout() {  # the newest: SIGTERM, it deregisters and the controller drains it
  local last=$(( ${#ROLLOUT_PIDS[@]} - 1 ))
  local pid=${ROLLOUT_PIDS[$last]}
  kill -TERM "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  remove_target "${ROLLOUT_NAMES[$last]}"
  unset "ROLLOUT_PIDS[$last]" "ROLLOUT_NAMES[$last]"
  ROLLOUT_PIDS=("${ROLLOUT_PIDS[@]}")
  ROLLOUT_NAMES=("${ROLLOUT_NAMES[@]}")
  echo "launch.sh: rollout replica pid $pid stopped (scale down)"
}
for _ in $(seq 1 "$ROLLOUTS"); do add_rollout; done
"$BIN/controller/rlfleet" scale "rollout=$ROLLOUTS" --controller="$CONTROLLER" >/dev/null || fail "scale"
echo "launch.sh: fleet up: controller $CONTROLLER (rlfleet run|status|scale|stop --controller=$CONTROLLER)"
echo "launch.sh: metrics of every service: prometheus --config.file=$DIR/prometheus/prometheus.yml"

# Keep the rollout count at the desired one; stop everything if a core service dies.
while [[ $STOPPING -eq 0 ]]; do
  for pid in "${CORE_PIDS[@]}"; do
    kill -0 "$pid" 2>/dev/null || fail "a core service (pid $pid) exited; see the logs in $DIR"
  done
  desired=$("$BIN/controller/rlfleet" status --controller="$CONTROLLER" 2>/dev/null |
            awk '$1 == "rollout" { for (i = 1; i < NF; i++) if ($i == "desired") print $(i + 1) }')
  if [[ -n "$desired" ]]; then
    while (( ${#ROLLOUT_PIDS[@]} < desired )); do add_rollout; done
    while (( ${#ROLLOUT_PIDS[@]} > desired )); do remove_rollout; done
  fi
  sleep 1 &
  wait $! 2>/dev/null
done
