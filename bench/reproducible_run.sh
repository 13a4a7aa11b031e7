#!/usr/bin/env bash
# Same seed, same curve: the demo's loop (GRPO on reverse n=3..5, synchronous) run
# twice with one seed on fresh local fleets, the second time while a second fleet
# trains beside it on the same machine; then the learning columns of the two
# metrics.csv are compared (every column but the timings: seconds, generate_s,
# train_s, sync_s, tokens_per_s).
#   bash bench/reproducible_run.sh [SEED] [STEPS]     (defaults 7 and 30)
# Prints `reproducible=yes` (or `reproducible=no` and the first differing rows) and
# writes bench/results/reproducible_run.md. Binaries from bazel-bin/services (build
# them first: bazel build //services/...).
set -euo pipefail
cd "$(dirname "$0")/.."
SEED="${1:-7}"
STEPS="${2:-30}"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/rlfleet-repro.XXXXXX")
source bench/local_fleet.sh
trap 'for p in "${FLEET_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done' EXIT
# fleet DIR SEED: the demo's loop, synchronous, STEPS steps, no early stop.
fleet() {
  fleet_run "$1" "$2" --entropy_coef=0.05 --steps="$STEPS" --stop_at=0 --max_staleness=0 ||
    { cat "$1/run.log"; return 1; }
}

# The learning columns (all but the timings) of a metrics.csv.
learning() {
  python3 - "$1" <<'PY'
import csv, sys
timing = {"seconds", "generate_s", "train_s", "sync_s", "tokens_per_s"}
rows = list(csv.DictReader(open(sys.argv[1])))
keep = [k for k in rows[0].keys() if k not in timing]
print(",".join(keep))
for r in rows:
    print(",".join(r[k] for k in keep))
PY
}

echo "== run 1: seed $SEED, $STEPS steps, machine as it is (load: $(cut -d' ' -f1-3 /proc/loadavg))"
t0=$(date +%s)
fleet "$WORK/alone" "$SEED"
t1=$(date +%s)
echo "== run 2: seed $SEED again, while a second fleet trains (seed $((SEED + 1))) beside it"
fleet "$WORK/beside" "$((SEED + 1))" &
neighbour=$!
fleet "$WORK/loaded" "$SEED"
t2=$(date +%s)
wait "$neighbour" || true
learning "$WORK/alone/metrics.csv" >"$WORK/alone.learning"
learning "$WORK/loaded/metrics.csv" >"$WORK/loaded.learning"
if cmp -s "$WORK/alone.learning" "$WORK/loaded.learning"; then
  verdict=yes
else
  verdict=no
  diff "$WORK/alone.learning" "$WORK/loaded.learning" | head -20 || true
fi
mkdir -p bench/results
{
  echo "# Same seed, same curve ($(date -u +%Y-%m-%d), $(nproc) cores)"
  echo
  echo "Seed $SEED, $STEPS synchronous steps of the demo's loop (reverse n=3..5, 32 prompts x 8), fresh fleet each run."
  echo "Run 1 alone took $((t1 - t0)) s; run 2, beside a second fleet training seed $((SEED + 1)), took $((t2 - t1)) s."
  echo "Learning columns of metrics.csv (all but the timings) identical: **$verdict**."
  echo
  echo '```'
  cat "$WORK/loaded.learning"
  echo '```'
} >bench/results/reproducible_run.md
echo "run 1 $((t1 - t0)) s alone, run 2 $((t2 - t1)) s beside another fleet; files in $WORK"
echo "reproducible=$verdict"
