#!/usr/bin/env bash
# bench/autoscale_ramp: closed-loop rollout autoscaling through the local fleet
# (deploy/local/launch.sh, the controller with --autoscale_rollout=1:MAX). Load comes
# and goes: idle, then a rollout-bound run (long responses, one PPO epoch: the trainer
# waits for rollouts), then idle again. Every second it records the autoscaler's
# gauges (desired replicas, the trainer's wait fraction, the replicas' busy fraction)
# and the registered / admitted rollout replicas (`rlfleet status`) into a CSV, draws
# them (gnuplot: PNG and text), and checks the trace: the replicas went from 1 above 1
# while the run was on and back to 1 after it, the run completed, and the buffer took
# every experience the run made (steps x prompts x samples: none lost while replicas
# joined and left). The controller's autoscale log lines say why each change happened.
#   bash bench/autoscale_ramp.sh [DEVICE]      (cpu, default; cuda:0 on a GPU host)
# MAX (4), STEPS (40), OUT (bench/results/autoscale_ramp_<device>.{csv,png,txt,md}),
# RUN_FLAGS (the run's workload), MODEL_FLAGS; binaries from $RLFLEET_BIN.
set -euo pipefail
cd "$(dirname "$0")/.."
device="${1:-cpu}"
MAX="${MAX:-4}"
STEPS="${STEPS:-40}"
PROMPTS="${PROMPTS:-32}"
SAMPLES="${SAMPLES:-8}"
RUN_FLAGS="${RUN_FLAGS:---task=reverse --min_len=10 --max_len=16 --ppo_epochs=1 --max_staleness=0}"
MODEL_FLAGS="${MODEL_FLAGS:-}"
OUT="${OUT:-bench/results/autoscale_ramp_${device//:/}}"
IDLE_S="${IDLE_S:-90}"  # the longest wait for the scale-in after the run
if [[ -z "${RLFLEET_BIN:-}" ]]; then
  bazel build //services/... >/dev/null 2>&1 || { echo "bazel build failed" >&2; exit 1; }
  RLFLEET_BIN="$PWD/bazel-bin/services"
fi
export RLFLEET_BIN
CLI="$RLFLEET_BIN/controller/rlfleet"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/rlfleet-autoscale.XXXXXX")
echo "cpu: $(awk -F': ' '/^model name/{print $2; exit}' /proc/cpuinfo) ($(nproc) cores); device $device" >&2
LAUNCHER="" SAMPLER=""
cleanup() {
  [[ -n "$SAMPLER" ]] && kill "$SAMPLER" 2>/dev/null && wait "$SAMPLER" 2>/dev/null
  [[ -n "$LAUNCHER" ]] && kill -TERM "$LAUNCHER" 2>/dev/null && wait "$LAUNCHER" 2>/dev/null
  true
}
trap cleanup EXIT
# shellcheck disable=SC2086  # (MODEL_FLAGS: split on spaces)
RLFLEET_CONTROLLER_FLAGS="--autoscale_rollout=1:$MAX --autoscale_interval=2s --autoscale_cooldown=6s" \
  bash deploy/local/launch.sh --rollouts=1 --dir="$WORK/fleet" -- --device="$device" $MODEL_FLAGS \
  >"$WORK/launch.log" 2>&1 &
LAUNCHER=$!
controller=""
for ((i = 0; i < 900; i++)); do
  controller=$(grep -o -m1 'fleet up: controller [0-9.:]*' "$WORK/launch.log" | awk '{print $4}' || true)
  [[ -n "$controller" ]] && break
  kill -0 "$LAUNCHER" 2>/dev/null || break
  sleep 0.2
done
[[ -n "$controller" ]] || { echo "the fleet did not come up:" >&2; tail -20 "$WORK/launch.log" >&2; exit 1; }
metrics=$(grep -o -m1 'metrics on http://[0-9.:]*' "$WORK/fleet/controller.log" | sed 's|metrics on http://||')
mkdir -p "$(dirname "$OUT")"
# The sampler: t, desired, registered, admitted, trainer wait fraction, busy fraction, run on.
(
  t0=$(date +%s.%N)
  echo "t,desired,registered,admitted,wait_fraction,utilization,run"
  while true; do
    status=$("$CLI" status --controller="$controller" 2>/dev/null || true)
    gauges=$(curl -s "http://$metrics/metrics" 2>/dev/null | awk '/^rlfleet_autoscale_trainer_wait_fraction/{w=$2} /^rlfleet_autoscale_rollout_utilization/{u=$2} END {printf "%s,%s", w+0, u+0}')
    awk -v t="$(date +%s.%N)" -v t0="$t0" -v g="$gauges" '
      $1 == "run:" { run = ($4 == "RUN_STATE_RUNNING" || $4 == "RUN_STATE_STARTING") }
      $1 == "rollout" { for (i = 1; i < NF; i++) { if ($i == "registered") r = $(i+1); if ($i == "admitted") a = $(i+1); if ($i == "desired") d = $(i+1) } }
      END { printf "%.1f,%s,%s,%s,%s,%d\n", t - t0, d + 0, r + 0, a + 0, g, run }' <<<"$status"
    sleep 1
  done
) >"$OUT.csv" &
SAMPLER=$!
sleep 8  # (idle before the load)
echo "== the load: rlfleet run --steps=$STEPS $RUN_FLAGS" >&2
# shellcheck disable=SC2086
"$CLI" run --controller="$controller" --timeout=120s --steps="$STEPS" --eval_every=0 --loop_prompts="$PROMPTS" \
  --loop_samples="$SAMPLES" $RUN_FLAGS >"$WORK/run.log" 2>&1 || { echo "the run failed:" >&2; tail -20 "$WORK/run.log" >&2; exit 1; }
accepted=$("$CLI" status --controller="$controller" | awk '/experiences accepted/{print $3}')
echo "== the load is off; waiting up to ${IDLE_S}s for the scale-in" >&2
for ((i = 0; i < IDLE_S; i++)); do
  [[ $(tail -1 "$OUT.csv" | cut -d, -f3) == 1 && $(tail -1 "$OUT.csv" | cut -d, -f2) == 1 ]] && break
  sleep 1
done
sleep 4
kill "$SAMPLER" 2>/dev/null || true; wait "$SAMPLER" 2>/dev/null || true; SAMPLER=""
grep "autoscale:" "$WORK/fleet/controller.log" >"$OUT.log" || true
if command -v gnuplot >/dev/null; then
  for term in "pngcairo size 900,500" "dumb size 100,28"; do
    ext=png; [[ $term == dumb* ]] && ext=txt
    gnuplot -e "set terminal $term; set output '$OUT.$ext'; set datafile separator ','; set key autotitle columnhead;
      set xlabel 'seconds'; set ylabel 'replicas'; set yrange [0:${MAX}+1]; set y2label 'fraction'; set y2range [0:1]; set ytics nomirror; set y2tics;
      plot '$OUT.csv' using 1:2 with steps lw 2 title 'desired', '' using 1:3 with steps title 'registered',
      '' using 1:5 axes x1y2 with lines title 'trainer wait', '' using 1:6 axes x1y2 with lines title 'replicas busy',
      '' using 1:7 axes x1y2 with steps title 'run on'" 2>/dev/null || true
  done
fi
rc=0
python3 - "$OUT.csv" "$accepted" "$((STEPS * PROMPTS * SAMPLES))" "$OUT.md" "$device" <<'PY' || rc=$?
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
accepted, expected, md, device = int(sys.argv[2] or 0), int(sys.argv[3]), sys.argv[4], sys.argv[5]
on = [r for r in rows if r["run"] == "1"]
peak = max(int(r["registered"]) for r in rows)
first_up = next((float(r["t"]) for r in rows if int(r["desired"]) > 1), None)
end_run = max((float(r["t"]) for r in on), default=None)
back = next((float(r["t"]) for r in rows if end_run is not None and float(r["t"]) > end_run
             and int(r["registered"]) == 1 and int(r["desired"]) == 1), None)
checks = [("replicas rose above 1 during the run", peak > 1),
          ("back to 1 replica after it", back is not None),
          (f"every experience stored ({accepted} of {expected})", accepted == expected)]
lines = [f"# Closed-loop rollout autoscaling on {device}", "",
         f"peak registered replicas {peak}; first scale-up at {first_up} s; run ended at {end_run} s; "
         f"back to 1 at {back} s ({(back - end_run) if back and end_run else float('nan'):.0f} s after)", ""]
lines += [f"- {'ok  ' if ok else 'FAIL'} {what}" for what, ok in checks]
open(md, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
sys.exit(0 if all(ok for _, ok in checks) else 1)
PY
cat "$OUT.log"
[[ -f "$OUT.txt" ]] && cat "$OUT.txt"
exit $rc
