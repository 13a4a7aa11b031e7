#!/usr/bin/env bash
# bench/async_vs_sync: the same policy, task and batch through the local fleet
# (deploy/local/launch.sh) in three loop modes, each on a fresh fleet for the same
# number of steps, without evaluation:
#   sync        --max_staleness=0: generate, then train, then publish
#   overlap     --max_staleness=1: the next step's generation overlaps this step's training
#   fully_async --max_staleness=K --fully_async: producers stream groups into the buffer
#               without a step barrier, up to K steps ahead; versions install mid-generation
# Throughput: rollout samples (every step generates PROMPTS x SAMPLES) and trained
# samples (those of groups with a learning signal the trainer took) per second of wall
# time over the steps after the first WARMUP, and the ratios of rollout samples/s:
#   overlap_over_sync=<x>
#   async_over_sync=<x>          (the fully asynchronous mode; the GPU script calls it
#                                 async_over_sync_gpu)
# and of trained samples/s (trained_overlap_over_sync, trained_async_over_sync).
# Writes its table to $OUT (default bench/results/async_vs_sync_<device>.md) and prints
# the CPU model.
#   bash bench/async_vs_sync.sh [DEVICE]      (cpu, default; cuda:0 on a GPU host)
# Binaries from $RLFLEET_BIN (default: bazel-bin/services, built here). STEPS (30),
# WARMUP (3), PROMPTS (64), SAMPLES (8), ROLLOUTS (2), K (2), TASK_FLAGS and
# MODEL_FLAGS pick the workload; KEEP_WORK=1 keeps each mode's fleet logs (the path is
# printed).
set -euo pipefail
cd "$(dirname "$0")/.."
device="${1:-cpu}"
STEPS="${STEPS:-30}"
WARMUP="${WARMUP:-3}"
PROMPTS="${PROMPTS:-64}"
SAMPLES="${SAMPLES:-8}"
ROLLOUTS="${ROLLOUTS:-2}"
K="${K:-2}"
TASK_FLAGS="${TASK_FLAGS:---task=reverse --min_len=4 --max_len=8}"
MODEL_FLAGS="${MODEL_FLAGS:---d_model=256 --n_layers=4 --n_heads=8}"
OUT="${OUT:-bench/results/async_vs_sync_${device//:/}.md}"
if [[ -z "${RLFLEET_BIN:-}" ]]; then
  bazel build //services/... >/dev/null 2>&1 || { echo "bazel build failed" >&2; exit 1; }
  RLFLEET_BIN="$PWD/bazel-bin/services"
fi
export RLFLEET_BIN
CLI="$RLFLEET_BIN/controller/rlfleet"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/rlfleet-async-bench.XXXXXX")
cpu=$(awk -F': ' '/^model name/{print $2; exit}' /proc/cpuinfo)
echo "cpu: $cpu ($(nproc) cores); device $device" >&2

LAUNCHER=""
stop_fleet() {
  [[ -n "$LAUNCHER" ]] || return 0
  kill -TERM "$LAUNCHER" 2>/dev/null || true
  wait "$LAUNCHER" 2>/dev/null || true
  LAUNCHER=""
}
trap stop_fleet EXIT

# measure NAME RUN_FLAGS...: prints "<samples/s> <trained samples/s> <mean generate_s> <mean train_s> <mean sync_s>
# <idle steps>"
measure() {
  local name=$1
  shift
  local dir="$WORK/$name"
  mkdir -p "$dir"
  # shellcheck disable=SC2086  # (MODEL_FLAGS: flags split on spaces)
  bash deploy/local/launch.sh --rollouts="$ROLLOUTS" --dir="$dir/fleet" -- --device="$device" $MODEL_FLAGS \
    >"$dir/launch.log" 2>&1 &
  LAUNCHER=$!
  local controller=""
  for ((i = 0; i < 900; i++)); do
    controller=$(grep -o -m1 'fleet up: controller [0-9.:]*' "$dir/launch.log" | awk '{print $4}' || true)
    [[ -n "$controller" ]] && break
    kill -0 "$LAUNCHER" 2>/dev/null || break
    sleep 0.2
  done
  [[ -n "$controller" ]] || { echo "the fleet did not come up:" >&2; tail -30 "$dir/launch.log" >&2; exit 1; }
  echo "== $name: rlfleet run $* ($STEPS steps)" >&2
  # shellcheck disable=SC2086
  "$CLI" run --controller="$controller" --timeout=120s --steps="$STEPS" --eval_every=0 \
    --loop_prompts="$PROMPTS" --loop_samples="$SAMPLES" --entropy_coef=0.03 $TASK_FLAGS "$@" >"$dir/run.log" 2>&1 ||
    { echo "$name: the run failed:" >&2; tail -20 "$dir/run.log" >&2; tail -5 "$dir"/fleet/*.log >&2; exit 1; }
  stop_fleet
  local csv
  csv=$(find "$dir/fleet/runs" -name metrics.csv | head -1)
  cp "$csv" "$WORK/$name-metrics.csv"
  python3 - "$csv" "$WARMUP" "$PROMPTS" "$SAMPLES" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
warm, prompts, samples = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
first, last = rows[warm - 1], rows[-1]
steps = int(last["step"]) - int(first["step"])
seconds = float(last["seconds"]) - float(first["seconds"])
rest = rows[warm:]
mean = lambda k: sum(float(r[k]) for r in rest) / len(rest)
trained = int(last["trained_sequences"]) - int(first["trained_sequences"])
print(f"{steps * prompts * samples / seconds:.1f} {trained / seconds:.1f} {mean('generate_s'):.3f} "
      f"{mean('train_s'):.3f} {mean('sync_s'):.3f} {last['idle_steps']}")
PY
}

sync=$(measure sync --max_staleness=0)
echo "sync: $sync" >&2
overlap=$(measure overlap --max_staleness=1)
echo "overlap: $overlap" >&2
async=$(measure fully_async --max_staleness="$K" --fully_async)
echo "fully_async: $async" >&2
rate() { awk '{print $1}' <<<"$1"; }
trained() { awk '{print $2}' <<<"$1"; }
ratio() { python3 -c "print(f'{$1 / $2:.3f}')"; }
overlap_ratio=$(ratio "$(rate "$overlap")" "$(rate "$sync")")
async_ratio=$(ratio "$(rate "$async")" "$(rate "$sync")")
trained_overlap_ratio=$(ratio "$(trained "$overlap")" "$(trained "$sync")")
trained_async_ratio=$(ratio "$(trained "$async")" "$(trained "$sync")")
row() { awk -v n="$1" '{printf "| %s | %s | %s | %s | %s | %s | %s |\n", n, $1, $2, $3, $4, $5, $6}' <<<"$2"; }
mkdir -p "$(dirname "$OUT")"
{
  echo "# Loop modes: sync, overlap (k=1), fully asynchronous (k=$K) on $device"
  echo
  echo "cpu: $cpu ($(nproc) cores). $TASK_FLAGS, $MODEL_FLAGS, $PROMPTS prompts x $SAMPLES samples per step,"
  echo "$ROLLOUTS rollout replicas, $STEPS steps per mode on a fresh fleet (deploy/local/launch.sh), no"
  echo "evaluation; rates over steps $WARMUP..$STEPS. generate_s: the step's wait for rollouts"
  echo "(sync: generating and scoring them), train_s, sync_s: publish and install (fully async:"
  echo "the part on the trainer's path; the install overlaps the next step). An idle step: its"
  echo "groups had been trained by the step before (a step takes up to $PROMPTS groups, the oldest first)."
  echo
  echo "| mode | rollout samples/s | trained samples/s | generate_s | train_s | sync_s | idle steps |"
  echo "|---|---|---|---|---|---|---|"
  row sync "$sync"
  row "overlap (k=1)" "$overlap"
  row "fully async (k=$K)" "$async"
  echo
  echo "overlap_over_sync=$overlap_ratio"
  echo "trained_overlap_over_sync=$trained_overlap_ratio"
  echo "trained_async_over_sync=$trained_async_ratio"
  echo "async_over_sync=$async_ratio"
} >"$OUT"
cat "$OUT"
if [[ -n "${KEEP_WORK:-}" ]]; then echo "fleet logs kept under $WORK" >&2; else rm -rf "$WORK"; fi
