#!/usr/bin/env bash
# GRPO on arithmetic word problems, on this machine's CPU, through the whole fleet:
#  1. examples/math/make_problems.py writes a JSONL of word problems (answers in GSM8K's
#     "#### N" form);
#  2. make_tiny_model writes a tiny random Qwen2-architecture model directory for a
#     byte-level BPE tokenizer (default: the Qwen2-style test tokenizer of
#     libs/model/testdata; pass your own with RLFLEET_TOKENIZER=DIR);
#  3. it writes the run file DIR/run.yaml (libs/common/run_file.h): the model written
#     once, the data, the algorithm's settings, each service's own flags, the fleet;
#  4. deploy/local/launch.sh --run_file=DIR/run.yaml starts the fleet from it (rollout
#     and trainer on the model directory, the controller allowed to read DIR);
#  5. `rlfleet run --config=DIR/run.yaml` runs GRPO, the reward service scoring each
#     response's stated answer (math_exact) against the record's.
# A random tiny model answers few problems right: this shows the pipeline working end
# to end, not a model learning arithmetic (on a GPU, start from a real checkpoint).
#   bash examples/math/run_cpu.sh            (STEPS=20, DIR=/tmp/rlfleet-math by default)
# With RLFLEET_BIN set (binaries built already, e.g. a test's runfiles) nothing is
# built; RLFLEET_MAKE_MODEL names the make_tiny_model binary then. RLFLEET_MODEL_DIR
# runs a model directory of yours instead of the tiny one (examples/math/run_gpu.sh), and
# RLFLEET_MODEL_FLAGS go to the rollout and trainer (e.g. --device=cuda:0).
# RLFLEET_LOOP_FLAGS go to `rlfleet run` after the example's own.
set -euo pipefail
cd "$(dirname "$0")/../.."
STEPS="${STEPS:-20}"
DIR="${DIR:-/tmp/rlfleet-math}"
TOKENIZER="${RLFLEET_TOKENIZER:-libs/model/testdata/hf/tokenizer_qwen2}"
if [[ -z "${RLFLEET_BIN:-}" ]]; then
  bash tools/setup.sh
  bazel build //services/... //examples/math:make_tiny_model 2>&1 | grep -E "^(ERROR|FAILED)" || true
  export RLFLEET_BIN="$PWD/bazel-bin/services"
  RLFLEET_MAKE_MODEL="$PWD/bazel-bin/examples/math/make_tiny_model"
fi
mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"
rm -rf "$DIR/fleet" "$DIR/problems.jsonl" "$DIR/launch.log"
if [[ -n "${RLFLEET_MODEL_DIR:-}" ]]; then
  RLFLEET_MODEL_DIR="$(cd "$RLFLEET_MODEL_DIR" && pwd)"
  [[ "$RLFLEET_MODEL_DIR" == "$DIR"/* ]] ||
    { echo "run_cpu.sh: RLFLEET_MODEL_DIR must lie under DIR=$DIR (the controller's --data_root)" >&2; exit 2; }
else
  rm -rf "$DIR/model"
fi
python3 examples/math/make_problems.py "$DIR/problems.jsonl" --count 300 --max_value 4
echo "== $(wc -l <"$DIR/problems.jsonl") problems in $DIR/problems.jsonl, e.g. $(head -1 "$DIR/problems.jsonl")"
MODEL="${RLFLEET_MODEL_DIR:-$DIR/model}"
[[ -n "${RLFLEET_MODEL_DIR:-}" ]] || "$RLFLEET_MAKE_MODEL" --tokenizer="$TOKENIZER" --out="$MODEL"

LAUNCHER=""
stop_fleet() {
  [[ -n "$LAUNCHER" ]] || return 0
  kill -TERM "$LAUNCHER" 2>/dev/null || true
  wait "$LAUNCHER" 2>/dev/null || true
  LAUNCHER=""
}
trap stop_fleet EXIT
# The whole run in one file. (The controller reads the problems and the tokenizer under
# its data_root only.)
cat >"$DIR/run.yaml" <<YAML
# GRPO on arithmetic word problems (examples/math/run_cpu.sh wrote this).
model:
  dir: $MODEL
  max_seq_len: 256
data:
  dataset: $DIR/problems.jsonl
  prompt_field: question
  answer_field: answer
algorithm:
  steps: $STEPS
  loop_prompts: 16
  loop_samples: 8
  temperature: 1.0
  lr: 1e-3
  max_staleness: 0
run:
  eval_every: 5
  stop_at: 1.0
  timeout: 120s
controller:
  data_root: $DIR
rollout:
  threads: 1
trainer:
  threads: 1
fleet:
  rollouts: 1
YAML
echo "== run file $DIR/run.yaml"
# shellcheck disable=SC2086  # (RLFLEET_MODEL_FLAGS: extra flags, split on spaces)
bash deploy/local/launch.sh --run_file="$DIR/run.yaml" --dir="$DIR/fleet" -- ${RLFLEET_MODEL_FLAGS:-} \
  >"$DIR/launch.log" 2>&1 &
LAUNCHER=$!
controller=""
for ((i = 0; i < 900; i++)); do
  controller=$(grep -o -m1 'fleet up: controller [0-9.:]*' "$DIR/launch.log" | awk '{print $4}' || true)
  [[ -n "$controller" ]] && break
  kill -0 "$LAUNCHER" 2>/dev/null || break
  sleep 0.2
done
[[ -n "$controller" ]] || { echo "the fleet did not come up:"; tail -30 "$DIR/launch.log"; exit 1; }
grep -h "from $MODEL" "$DIR"/fleet/rollout0.log "$DIR"/fleet/trainer.log || true
echo "== rlfleet run: GRPO on $DIR/problems.jsonl ($STEPS steps)"
# shellcheck disable=SC2086  # (RLFLEET_LOOP_FLAGS: extra flags, split on spaces)
"$RLFLEET_BIN/controller/rlfleet" run --controller="$controller" --config="$DIR/run.yaml" ${RLFLEET_LOOP_FLAGS:-}
echo "== metrics: $(find "$DIR/fleet/runs" -name metrics.csv | head -1)"
