#!/usr/bin/env bash
# bench/e2e: the same task in sync mode (k = 0) and async mode (k = 1: the next step's
# generation overlaps this step's training) on a fresh fleet each, for the same number
# of steps; trained samples per second of each, and as its last line
#   async_over_sync_throughput=<async / sync>
# Async can beat sync by at most (G + T + S) / max(G, T + S) (G generate+score, T train,
# S weight sync per step, from the sync run's metrics.csv; printed), and only where
# rollout and trainer have cores of their own; on 2 cores they share them. The table
# says what these cores allow. Writes bench/results/e2e.md (or $OUT).
#   bash bench/e2e.sh [steps]
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS="${1:-40}"
OUT="${OUT:-bench/results/e2e.md}"
bazel build //services/... >/dev/null 2>&1
B=bazel-bin/services
DIR=$(mktemp -d "${TMPDIR:-/tmp}/rlfleet-e2e.XXXXXX")
PIDS=()
stop_fleet() {
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  PIDS=()
}
trap stop_fleet EXIT
start() {
  local name=$1 bin=$2
  shift 2
  "$B/$bin" --host=127.0.0.1 --port=0 --port_file="$DIR/$name.port" "$@" >"$DIR/$name.log" 2>&1 &
  PIDS+=("$!")
  for _ in $(seq 1 300); do [[ -s "$DIR/$name.port" ]] && break; sleep 0.1; done
  [[ -s "$DIR/$name.port" ]] || { echo "$name did not start"; cat "$DIR/$name.log"; exit 1; }
  printf -v "ADDR_$name" '127.0.0.1:%s' "$(cat "$DIR/$name.port")"
}
measure() {  # mode k
  rm -f "$DIR"/*.port
  start reward reward/rlfleet-reward
  start buffer buffer/rlfleet-buffer --store=memory://
  start rollout rollout/rlfleet-rollout --threads=1 --publish_dir="$DIR/weights-$1"
  start trainer trainer/rlfleet-trainer --threads=1 --buffer="$ADDR_buffer" --publish_dir="$DIR/weights-$1"
  $B/controller/rlfleet loop --loop_rollout="$ADDR_rollout" --loop_reward="$ADDR_reward" --loop_buffer="$ADDR_buffer" \
    --loop_trainer="$ADDR_trainer" --steps="$STEPS" --eval_every=0 --entropy_coef=0.03 --max_staleness="$1" \
    --run_dir="$DIR/run-$1" --timeout=120s | grep "^trained"
  stop_fleet
}
echo "== sync (k=0), $STEPS steps" >&2
sync_line=$(measure 0)
echo "$sync_line" >&2
echo "== async (k=1), $STEPS steps" >&2
async_line=$(measure 1)
echo "$async_line" >&2
rate() { sed -E 's/.*: ([0-9.]+) samples\/s.*/\1/' <<< "$1"; }
ratio=$(python3 -c "print(f'{$(rate "$async_line") / $(rate "$sync_line"):.3f}')")
# The sync run's phases (metrics.csv): generate+score G, train T, weight sync S per
# step. With generation on cores of its own, async overlaps G with T + S: at most
# (G + T + S) / max(G, T + S) times sync.
phases=$(python3 - "$DIR/run-0/metrics.csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))[1:]  # step 1 warms up
g = sum(float(r["generate_s"]) for r in rows) / len(rows)
t = sum(float(r["train_s"]) for r in rows) / len(rows)
s = sum(float(r["sync_s"]) for r in rows) / len(rows)
print(f"generate+score {g*1e3:.0f} ms, train {t*1e3:.0f} ms, weight sync {s*1e3:.0f} ms per step; "
      f"bound with separate cores: {(g + t + s) / max(g, t + s):.2f}")
PY
)
mkdir -p "$(dirname "$OUT")"
{
  echo "# e2e: sync vs async (k=1) on one 2-core machine"
  echo
  echo "reverse n=3..5, d_model 128, 4 layers, 32 prompts x 8 samples, $STEPS steps each on a fresh fleet"
  echo "(reward, buffer, rollout --threads=1, trainer --threads=1), no evaluation."
  echo
  echo "- sync:  $sync_line"
  echo "- async: $async_line"
  echo "- sync run's phases: $phases"
  echo
  echo "async_over_sync_throughput=$ratio"
} > "$OUT"
echo "sync run's phases: $phases"
echo "async_over_sync_throughput=$ratio"
