# Sourced by bench scripts: a local fleet on loopback (as tools/demo.sh starts it) that
# runs one `rlfleet run` and stops (every process by pid).
#   fleet_run DIR SEED [RLFLEET RUN FLAGS...]
# starts controller, reward, buffer, trainer, weights and one rollout replica in DIR
# (their logs DIR/<name>.log), runs `rlfleet run --seed=SEED FLAGS` (its output
# DIR/run.log), copies the run's metrics.csv to DIR/metrics.csv and stops the fleet.
# Returns non-zero when a service does not start or the run fails. Binaries from
# $B (default bazel-bin/services).
B="${B:-bazel-bin/services}"
export OPENBLAS_NUM_THREADS=1
FLEET_PIDS=()  # every process started, for a caller's trap

fleet_run() {
  local dir=$1 seed=$2
  shift 2
  local pids=() ADDR="" ctl
  mkdir -p "$dir"
  _fleet_start() {  # NAME BINARY FLAGS...: sets ADDR
    local name=$1 bin=$2
    shift 2
    "$B/$bin" --host=127.0.0.1 --port=0 --port_file="$dir/$name.port" "$@" >"$dir/$name.log" 2>&1 &
    pids+=("$!")
    FLEET_PIDS+=("$!")
    for _ in $(seq 1 600); do [[ -s "$dir/$name.port" ]] && break; sleep 0.1; done
    [[ -s "$dir/$name.port" ]] || { echo "$name did not start"; cat "$dir/$name.log"; return 1; }
    ADDR="127.0.0.1:$(cat "$dir/$name.port")"
    [[ $name == controller ]] && return 0
    for _ in $(seq 1 300); do grep -q "registered as" "$dir/$name.log" && return 0; sleep 0.1; done
    echo "$name did not register"
    cat "$dir/$name.log"
    return 1
  }
  local rc=0
  {
    _fleet_start controller controller/rlfleet-controller --runs_dir="$dir/runs" && ctl=$ADDR &&
      _fleet_start reward reward/rlfleet-reward --registry_address="$ctl" &&
      _fleet_start buffer buffer/rlfleet-buffer --store=memory:// --registry_address="$ctl" &&
      _fleet_start trainer trainer/rlfleet-trainer --buffer="$ADDR" --registry_address="$ctl" \
        --checkpoint_root="$dir/checkpoints" &&
      _fleet_start weights weights/rlfleet-weights --registry_address="$ctl" --relay_fanout=1 &&
      _fleet_start rollout rollout/rlfleet-rollout --registry_address="$ctl" &&
      "$B/controller/rlfleet" run --controller="$ctl" --seed="$seed" --timeout=120s "$@" >"$dir/run.log" 2>&1 &&
      cp "$(find "$dir/runs" -name metrics.csv | head -1)" "$dir/metrics.csv"
  } || rc=1
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  return $rc
}
