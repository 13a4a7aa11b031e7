#!/usr/bin/env bash
# The local fleet launcher: every rlfleet service as its own process on loopback.
#
#   deploy/local/launch.sh [--run_file=run.yaml] [--rollouts=N] [--redis=redis://host:port] [--dir=DIR]
#                          [--gateway_port=P] [-- MODEL FLAGS...]
#
# --run_file: a run file (libs/common/run_file.h) every service is started with
# (--config=run.yaml: each reads its section and the shared model / transport / nccl
# ones); its fleet.rollouts is the replica count unless --rollouts says otherwise.
# Ports and hosts are the launcher's (each service's --port and --host win).
#
# Starts redis-server (the embedded default, on a free loopback port, when no --redis
# is given), the controller (registry in Redis, --scaler=launcher), reward, the buffer
# (durable in Redis), the trainer and N rollout replicas that register with the
# controller, and rlfleet-gateway: the OpenAI-compatible HTTP API in front of the
# admitted replicas, on 127.0.0.1:P (--gateway_port; default a free port, printed;
# the MODEL FLAGS' --model_dir gives it the tokenizer). Each service writes DIR/<name>.log. While it runs it keeps the rollout
# replicas at the count `rlfleet scale rollout=N` asks for (a new one registers, gets
# the current weights and is admitted; a removed one gets SIGTERM, deregisters and is
# drained by the controller). A rollout replica that dies (a crash, kill -9) is
# replaced; a core service that dies (redis, controller, reward, buffer, trainer,
# weights) is restarted on the same port with the same flags, so the others find it
# where they left it (the controller resumes its active run from the record it keeps
# in Redis, the trainer from its newest checkpoint: --resume=latest); one that keeps dying (more than RLFLEET_MAX_RESTARTS, default 5,
# in 5 minutes) stops the fleet. Ctrl-C (or SIGTERM) stops everything it started, by
# pid, and leaves no process behind. (Nothing after startup runs a $(command
# substitution): bash 5.2 loses a SIGINT/SIGTERM trap that fires while it reads one,
# "interrupt trap: unexpected EOF while looking for matching `)'", and the fleet then
# ignored Ctrl-C. Helpers write to files under DIR and `read` them instead.)
# RLFLEET_PEER_TIMEOUT (default 120s) is the deadline of each call a run makes (a hung
# replica is dropped after it); RLFLEET_CONTROLLER_FLAGS, RLFLEET_BUFFER_FLAGS,
# RLFLEET_WEIGHTS_FLAGS and RLFLEET_ROLLOUT_FLAGS, extra flags for rlfleet-controller
# (e.g. --data_root=DIR), rlfleet-buffer (e.g. --dedupe_ids=N), rlfleet-weights (e.g.
# --host_copy=always) and each rollout replica (e.g. --dtype=bf16).
# Binaries come from $RLFLEET_BIN (default bazel-bin/services; build them first with
# `bazel build //services/...`). MODEL FLAGS go to the rollout replicas and the
# trainer (e.g. -- --d_model=64 --n_layers=2).
set -uo pipefail
BIN="${RLFLEET_BIN:-bazel-bin/services}"
ROLLOUTS=""
REDIS_URL=""
DIR=""
GATEWAY_PORT=0
RUN_FILE=""
MODEL=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rollouts=*) ROLLOUTS="${1#*=}" ;;
    --run_file=*) RUN_FILE="${1#*=}" ;;
    --redis=*) REDIS_URL="${1#*=}" ;;
    --dir=*) DIR="${1#*=}" ;;
    --gateway_port=*) GATEWAY_PORT="${1#*=}" ;;
    --) shift; MODEL=("$@"); break ;;
    *) echo "launch.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[[ -n "$DIR" ]] || DIR=$(mktemp -d "${TMPDIR:-/tmp}/rlfleet-local.XXXXXX")
mkdir -p "$DIR"
for bin in controller/rlfleet-controller controller/rlfleet reward/rlfleet-reward buffer/rlfleet-buffer \
           rollout/rlfleet-rollout trainer/rlfleet-trainer weights/rlfleet-weights gateway/rlfleet-gateway; do
  [[ -x "$BIN/$bin" ]] || { echo "launch.sh: $BIN/$bin missing: bazel build //services/..." >&2; exit 2; }
done
CONFIG=()  # --config=RUN_FILE for every service, when given
if [[ -n "$RUN_FILE" ]]; then
  [[ -f "$RUN_FILE" ]] || { echo "launch.sh: --run_file=$RUN_FILE: no such file" >&2; exit 2; }
  RUN_FILE=$(cd "$(dirname "$RUN_FILE")" && pwd)/$(basename "$RUN_FILE")
  CONFIG=(--config="$RUN_FILE")
  FLEET_ROLLOUTS=$("$BIN/controller/rlfleet" run-file fleet.rollouts "${CONFIG[@]}") || exit 2
  [[ -z "$ROLLOUTS" && -n "$FLEET_ROLLOUTS" ]] && ROLLOUTS=$FLEET_ROLLOUTS
fi
ROLLOUTS=${ROLLOUTS:-1}
[[ "$ROLLOUTS" =~ ^[0-9]+$ ]] || { echo "launch.sh: the rollout count \"$ROLLOUTS\" is not a number" >&2; exit 2; }
[[ "$GATEWAY_PORT" =~ ^[0-9]+$ ]] || { echo "launch.sh: --gateway_port=$GATEWAY_PORT is not a port" >&2; exit 2; }

CORE_PIDS=()       # redis, controller, reward, buffer, trainer, weights
CORE_NAMES=()      # their names, in the same order
ROLLOUT_PIDS=()    # in start order
ROLLOUT_NAMES=()
declare -A CMD_OF=()       # name -> its command line (quoted), to restart it
declare -A PORT_OF=()      # name -> its port
declare -A RESTARTS_OF=()  # name -> start times (epoch seconds) of its recent restarts
MAX_RESTARTS="${RLFLEET_MAX_RESTARTS:-5}"
STOPPING=0
stop_all() {
  [[ $STOPPING -eq 1 ]] && return
  STOPPING=1
  local pid
  for pid in "${ROLLOUT_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for pid in "${ROLLOUT_PIDS[@]}"; do wait "$pid" 2>/dev/null; done
  # The others in reverse start order (redis last).
  for ((i = ${#CORE_PIDS[@]} - 1; i >= 0; i--)); do
    kill -TERM "${CORE_PIDS[$i]}" 2>/dev/null
    wait "${CORE_PIDS[$i]}" 2>/dev/null
  done
  # Anything started but not yet in the lists (Ctrl-C while a replacement was starting
  # or had just printed its pid) is still one of this shell's jobs.
  jobs -p >"$DIR/.jobs"
  while read -r pid; do kill -TERM "$pid" 2>/dev/null; done <"$DIR/.jobs"
  while read -r pid; do wait "$pid" 2>/dev/null; done <"$DIR/.jobs"
  echo "launch.sh: stopped $(( ${#ROLLOUT_PIDS[@]} + ${#CORE_PIDS[@]} )) processes; logs in $DIR"
}
trap 'stop_all; exit 0' INT TERM
trap 'stop_all' EXIT  # (also when this script itself fails: nothing is left orphaned)

# start NAME COMMAND...: a service on a free loopback port (or on $START_PORT when set:
# a restart); sets ADDR and PID, and remembers the command and port (restart NAME).
start() {
  local name=$1
  shift
  rm -f "$DIR/$name.port"
  printf -v "CMD_OF[$name]" '%q ' "$@"
  [[ -f "$DIR/$name.log" ]] && cat "$DIR/$name.log" >>"$DIR/$name.log.prev"  # keep a dead one's log
  if [[ $name == gateway ]]; then  # (HTTP, its own flag names)
    "$@" --http_host=127.0.0.1 --http_port="${START_PORT:-0}" --http_port_file="$DIR/$name.port" >"$DIR/$name.log" 2>&1 &
  else
    "$@" --host=127.0.0.1 --port="${START_PORT:-0}" --port_file="$DIR/$name.port" >"$DIR/$name.log" 2>&1 &
  fi
  PID=$!
  for ((try = 0; try < 600; try++)); do
    [[ -s "$DIR/$name.port" ]] && break
    kill -0 "$PID" 2>/dev/null || { echo "launch.sh: $name failed:"; tail -5 "$DIR/$name.log"; return 1; }
    sleep 0.1
  done
  [[ -s "$DIR/$name.port" ]] || { echo "launch.sh: $name did not start"; return 1; }
  read -r "PORT_OF[$name]" <"$DIR/$name.port"
  ADDR="127.0.0.1:${PORT_OF[$name]}"
  echo "launch.sh: $name on $ADDR (pid $PID, log $DIR/$name.log)"
  add_target "$name"
}

# restart NAME: starts NAME again with the command and port it had; sets PID.
restart() {
  local name=$1 cmd
  eval "cmd=(${CMD_OF[$name]})"
  START_PORT=${PORT_OF[$name]} start "$name" "${cmd[@]}"
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
  grep -o -m1 'metrics on http://[0-9.:]*' "$DIR/$1.log" >"$DIR/.metrics" || true
  metrics=""
  read -r metrics <"$DIR/.metrics" || true
  metrics=${metrics#metrics on http://}
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

# The embedded redis-server on $REDIS_PORT (its AOF in DIR/redis survives a restart);
# sets PID.
start_redis() {
  redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --dir "$DIR/redis" --appendonly yes --save "" \
    --daemonize no --loglevel warning >>"$DIR/redis.log" 2>&1 &
  PID=$!
  for ((try = 0; try < 100; try++)); do
    if redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; then
      echo "launch.sh: redis-server on redis://127.0.0.1:$REDIS_PORT (pid $PID, AOF in $DIR/redis)"
      return 0
    fi
    sleep 0.1
  done
  return 1
}

if [[ -z "$REDIS_URL" ]]; then
  REDIS_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  mkdir -p "$DIR/redis"
  start_redis || fail "redis-server did not start: $(tail -3 "$DIR/redis.log")"
  CORE_PIDS+=("$PID"); CORE_NAMES+=(redis)
  REDIS_URL="redis://127.0.0.1:$REDIS_PORT"
fi
# The controller first: the other services register with it (--registry_address) and
# runs find them through its registry (Redis-backed here).
# shellcheck disable=SC2086  # (RLFLEET_CONTROLLER_FLAGS: extra flags, split on spaces)
start controller "$BIN/controller/rlfleet-controller" "${CONFIG[@]}" --registry="$REDIS_URL/registry:" --scaler=launcher \
  --runs_dir="$DIR/runs" --peer_timeout="${RLFLEET_PEER_TIMEOUT:-120s}" ${RLFLEET_CONTROLLER_FLAGS:-} ||
  fail "controller"
CORE_PIDS+=("$PID"); CORE_NAMES+=(controller); CONTROLLER=$ADDR
# registered NAME: waits until NAME's log says it registered with the controller.
registered() {
  for ((try = 0; try < 100; try++)); do grep -q "registered as" "$DIR/$1.log" && return 0; sleep 0.1; done
  echo "launch.sh: $1 did not register: $(tail -3 "$DIR/$1.log")"
  return 1
}
start reward "$BIN/reward/rlfleet-reward" "${CONFIG[@]}" --registry_address="$CONTROLLER" || fail "reward"
CORE_PIDS+=("$PID"); CORE_NAMES+=(reward)
registered reward || fail "reward"
# shellcheck disable=SC2086  # (RLFLEET_BUFFER_FLAGS: extra flags, split on spaces)
start buffer "$BIN/buffer/rlfleet-buffer" "${CONFIG[@]}" --store="$REDIS_URL/buffer:" --registry_address="$CONTROLLER" \
  ${RLFLEET_BUFFER_FLAGS:-} ||
  fail "buffer"
CORE_PIDS+=("$PID"); CORE_NAMES+=(buffer); BUFFER=$ADDR
registered buffer || fail "buffer"
start trainer "$BIN/trainer/rlfleet-trainer" "${CONFIG[@]}" --buffer="$BUFFER" "${MODEL[@]}" \
  --registry_address="$CONTROLLER" --checkpoint_root="$DIR/checkpoints" --resume=latest || fail "trainer"
CORE_PIDS+=("$PID"); CORE_NAMES+=(trainer)
registered trainer || fail "trainer"
# Versions are pushed to the replicas in two relay chains (each replica passing every
# chunk on to the next as it arrives), so rlfleet-weights sends each at most twice
# however many replicas there are.
# shellcheck disable=SC2086  # (RLFLEET_WEIGHTS_FLAGS: extra flags, split on spaces)
start weights "$BIN/weights/rlfleet-weights" "${CONFIG[@]}" --registry_address="$CONTROLLER" \
  --relay_fanout="${RLFLEET_RELAY_FANOUT:-2}" ${RLFLEET_WEIGHTS_FLAGS:-} || fail "weights"
CORE_PIDS+=("$PID"); CORE_NAMES+=(weights)
registered weights || fail "weights"
GATEWAY_FLAGS=()  # (of the model flags, the tokenizer's directory)
for flag in "${MODEL[@]}"; do [[ $flag == --model_dir=* ]] && GATEWAY_FLAGS+=("$flag"); done
START_PORT=$GATEWAY_PORT start gateway "$BIN/gateway/rlfleet-gateway" "${CONFIG[@]}" --registry_address="$CONTROLLER" \
  "${GATEWAY_FLAGS[@]}" || fail "gateway"
CORE_PIDS+=("$PID"); CORE_NAMES+=(gateway); GATEWAY=$ADDR

NEXT_ROLLOUT=0
add_rollout() {  # returns 1 if it did not start
  local name="rollout$NEXT_ROLLOUT"
  NEXT_ROLLOUT=$((NEXT_ROLLOUT + 1))
  # shellcheck disable=SC2086  # (RLFLEET_ROLLOUT_FLAGS: extra flags, split on spaces)
  start "$name" "$BIN/rollout/rlfleet-rollout" "${CONFIG[@]}" --registry_address="$CONTROLLER" "${MODEL[@]}" \
    ${RLFLEET_ROLLOUT_FLAGS:-} || return 1
  ROLLOUT_PIDS+=("$PID")
  ROLLOUT_NAMES+=("$name")
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
for ((r = 0; r < ROLLOUTS; r++)); do add_rollout || fail "rollout replica"; done
"$BIN/controller/rlfleet" scale "rollout=$ROLLOUTS" --controller="$CONTROLLER" >/dev/null || fail "scale"
echo "launch.sh: fleet up: controller $CONTROLLER (rlfleet run|status|scale|stop --controller=$CONTROLLER)"
echo "launch.sh: OpenAI-compatible API: http://$GATEWAY/v1 (rlfleet-gateway; the admitted replicas)"
echo "launch.sh: metrics of every service: prometheus --config.file=$DIR/prometheus/prometheus.yml"

# restart_core I: core service I died; starts it again where it was (or stops the fleet
# if it keeps dying).
restart_core() {
  local i=$1 name=${CORE_NAMES[$1]:-core$1} pid=${CORE_PIDS[$1]} rc now recent=() t
  wait "$pid" 2>/dev/null
  rc=$?
  now=$EPOCHSECONDS
  for t in ${RESTARTS_OF[$name]:-}; do (( now - t < 300 )) && recent+=("$t"); done
  (( ${#recent[@]} >= MAX_RESTARTS )) &&
    fail "$name (pid $pid) exited (status $rc) after ${#recent[@]} restarts in 5 minutes; see $DIR/$name.log"
  RESTARTS_OF[$name]="${recent[*]} $now"
  echo "launch.sh: $name (pid $pid) exited (status $rc); restarting it on the same port (log $DIR/$name.log)"
  if [[ $name == redis ]]; then
    start_redis || { echo "launch.sh: redis-server did not restart; trying again"; CORE_PIDS[$i]=$PID; return; }
  else
    restart "$name" || { echo "launch.sh: $name did not restart; trying again"; CORE_PIDS[$i]=$PID; return; }
  fi
  CORE_PIDS[$i]=$PID
}

# Replaces rollout replicas that died (they are not coming back).
reap_rollouts() {
  local k pid keep_pids=() keep_names=()
  for k in "${!ROLLOUT_PIDS[@]}"; do
    pid=${ROLLOUT_PIDS[$k]}
    if kill -0 "$pid" 2>/dev/null; then
      keep_pids+=("$pid"); keep_names+=("${ROLLOUT_NAMES[$k]}")
    else
      wait "$pid" 2>/dev/null
      echo "launch.sh: rollout replica ${ROLLOUT_NAMES[$k]} (pid $pid) exited (status $?); replacing it"
      remove_target "${ROLLOUT_NAMES[$k]}"
    fi
  done
  ROLLOUT_PIDS=("${keep_pids[@]}")
  ROLLOUT_NAMES=("${keep_names[@]}")
}

# Keep every core service up and the rollout count at the desired one.
DESIRED=$ROLLOUTS
while [[ $STOPPING -eq 0 ]]; do
  for i in "${!CORE_PIDS[@]}"; do
    kill -0 "${CORE_PIDS[$i]}" 2>/dev/null || restart_core "$i"
  done
  reap_rollouts
  "$BIN/controller/rlfleet" status --controller="$CONTROLLER" 2>/dev/null |
    awk '$1 == "rollout" { for (i = 1; i < NF; i++) if ($i == "desired") print $(i + 1) }' >"$DIR/.desired"
  desired=""
  read -r desired <"$DIR/.desired" || true
  [[ -n "$desired" ]] && DESIRED=$desired  # (the controller unreachable: the last count)
  while (( ${#ROLLOUT_PIDS[@]} < DESIRED )); do
    add_rollout || { echo "launch.sh: a rollout replica did not start; trying again"; break; }
  done
  while (( ${#ROLLOUT_PIDS[@]} > DESIRED )); do remove_rollout; done
  sleep 1 &
  wait $! 2>/dev/null
done
