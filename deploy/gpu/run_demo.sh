#!/usr/bin/env bash
# The demo on a GPU host: the local fleet (deploy/local/launch.sh) with rollout and
# trainer on the GPU, through the model backend built here against this host's CUDA
# libtorch (deploy/gpu/build_backends.sh), then the RL loop of tools/demo.sh: GRPO on
# reverse n=3..5 until held-out exact match >= 0.8; then a larger policy
# (d_model 256) on reverse n=4..8. Each run's metrics.csv and output go to $OUT (or
# /tmp) as NAME-metrics.csv and NAME-run.log; the fleets' logs stay under
# $TMPDIR/rlfleet-gpu-demo.
#   build machine:  bash deploy/gpu/pack_fleet.sh
#   GPU host:       bash deploy/gpu/run_demo.sh [DEVICE]     (DEVICE: cuda:0 by default)
# RLFLEET_DEMOS picks demos (default "reverse3to5 reverse4to8_d256"); RLFLEET_ROLLOUT_FLAGS
# go to the rollout replicas (e.g. --dtype=bf16); RLFLEET_DEMO_RUN_FLAGS to `rlfleet run`
# after the demo's own (e.g. --lr=2e-4: the last value of a flag wins).
set -euo pipefail
cd "$(dirname "$0")/../.."
device="${1:-cuda:0}"
out="${OUT:-/tmp}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
bash deploy/gpu/unpack_carry.sh
[[ -x .carry/bin/services/rollout/rlfleet-rollout ]] ||
  { echo "run_demo: no .carry/bin: run deploy/gpu/pack_fleet.sh on the build machine and carry .carry" >&2; exit 1; }
backends="$(deploy/gpu/build_backends.sh)"
export LD_LIBRARY_PATH="$backends:$PWD/.carry/lib:$PWD/.carry/absl/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$PWD/.carry/bin/system:$PATH"
export RLFLEET_BIN="$PWD/.carry/bin/services"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
CLI="$RLFLEET_BIN/controller/rlfleet"

LAUNCHER=""
stop_fleet() {
  [[ -n "$LAUNCHER" ]] || return 0
  kill -TERM "$LAUNCHER" 2>/dev/null || true  # (a background job ignores SIGINT)
  wait "$LAUNCHER" 2>/dev/null || true
  LAUNCHER=""
}
trap stop_fleet EXIT

# demo NAME MODEL_FLAGS -- RUN_FLAGS: one fleet, one run; the run must reach its target.
demo() {
  local name=$1 model=() run=()
  shift
  while [[ $# -gt 0 && $1 != -- ]]; do model+=("$1"); shift; done
  shift
  run=("$@")
  # shellcheck disable=SC2206  # (RLFLEET_DEMO_RUN_FLAGS: extra flags, split on spaces)
  run+=(${RLFLEET_DEMO_RUN_FLAGS:-})
  local dir="${TMPDIR:-/tmp}/rlfleet-gpu-demo/$name"
  rm -rf "$dir" && mkdir -p "$dir"
  echo "== $name: fleet with rollout and trainer on $device (${model[*]})"
  bash deploy/local/launch.sh --rollouts=1 --dir="$dir/fleet" -- --device="$device" "${model[@]}" \
    >"$dir/launch.log" 2>&1 &
  LAUNCHER=$!
  local controller=""
  for ((i = 0; i < 600; i++)); do
    controller=$(grep -o -m1 'fleet up: controller [0-9.:]*' "$dir/launch.log" | awk '{print $4}' || true)
    [[ -n "$controller" ]] && break
    kill -0 "$LAUNCHER" 2>/dev/null || break
    sleep 0.2
  done
  [[ -n "$controller" ]] || { echo "the fleet did not come up:"; tail -30 "$dir/launch.log"; tail -20 "$dir"/fleet/*.log; return 1; }
  grep -h "model on" "$dir"/fleet/trainer.log "$dir"/fleet/rollout0.log | tee -a "$out/demo_summary.txt"
  echo "== $name: rlfleet run ${run[*]}"
  local rc=0
  timeout "${RLFLEET_DEMO_RUN_TIMEOUT:-600}" "$CLI" run --controller="$controller" --timeout=120s "${run[@]}" 2>&1 |
    tee "$dir/run.log" || rc=$?
  cp "$dir/run.log" "$out/$name-run.log"
  find "$dir/fleet/runs" -name metrics.csv -exec cp {} "$out/$name-metrics.csv" \; 2>/dev/null || true
  stop_fleet
  if [[ $rc -ne 0 ]]; then
    echo "== $name: the run failed (exit $rc); service logs:"
    tail -n 15 "$dir"/fleet/trainer.log "$dir"/fleet/rollout0.log "$dir"/fleet/controller.log
    return 1
  fi
  local best
  best=$(grep -o 'held-out exact [0-9.]*' "$dir/run.log" | awk '{print $3}' | sort -g | tail -1)
  echo "== $name: best held-out exact match ${best:-none} (target 0.8)" | tee -a "$out/demo_summary.txt"
  awk -v b="${best:-0}" 'BEGIN { exit !(b >= 0.8) }'
}

rm -f "$out/demo_summary.txt"
failed=0
demos="${RLFLEET_DEMOS:-reverse3to5 reverse4to8_d256}"
if [[ " $demos " == *" reverse3to5 "* ]]; then
  demo reverse3to5 -- --entropy_coef=0.05 --steps=300 --stop_at=0.8 --max_staleness=0 || failed=1
fi
if [[ " $demos " == *" reverse4to8_d256 "* ]]; then
  # (lr 2e-4 and 16 samples per prompt: at the CPU demo's 5e-4 and 8 the d256 policy's
  # entropy collapsed and held-out exact stalled at 0.45-0.66. With entropy_coef 0.05
  # it still stalled at 0.6-0.8 in about half the runs; entropy_coef 0.1 with an upper
  # clip of 0.28 (DAPO's clip-higher) reached >= 0.8 in 8 runs of 8; docs/status.md)
  demo reverse4to8_d256 --d_model=256 --n_layers=4 --n_heads=8 -- \
    --entropy_coef=0.1 --clip_ratio_high=0.28 --steps=600 --stop_at=0.8 --max_staleness=0 --min_len=4 \
    --max_len=8 --lr=2e-4 --loop_samples=16 || failed=1
fi
echo "run_demo: $( ((failed)) && echo FAILED || echo passed); metrics in $out"
exit "$failed"
