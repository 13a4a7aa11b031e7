#!/usr/bin/env bash
# An agentic RL run on this machine's CPU: the policy (the built-in character model,
# from random weights) learns to multiply by calling a calculator tool.
#
# Task `mul` (libs/tasks): a prompt "mul:37*4"; the policy may write a call "[37*4]",
# the controller's episode driver (services/controller/tool_episodes.h) stops the turn
# there, splices the calculator's answer "(148)" into the response, and lets the policy
# go on; its answer is what follows the last result. Each multi-turn trajectory goes to
# the buffer as one experience, the tool's tokens out of the loss
# (Experience.response_loss_mask), and GRPO trains on it. Reward: 1 for the right
# answer, else partial credit against the ideal "[37*4](148)148".
#
#   bash examples/calculator/run.sh        (STEPS=400, DIR=/tmp/rlfleet-calculator)
#
# Starts the local fleet (deploy/local/launch.sh, 2 rollout replicas), runs until
# held-out exact match reaches STOP_AT (0.85) or STEPS, prints what the trained policy
# writes for a few prompts through the OpenAI-compatible gateway (its first turn), and
# stops everything it started. With RLFLEET_BIN set nothing is built.
set -euo pipefail
cd "$(dirname "$0")/../.."
STEPS="${STEPS:-400}"
STOP_AT="${STOP_AT:-0.85}"
DIR="${DIR:-/tmp/rlfleet-calculator}"
if [[ -z "${RLFLEET_BIN:-}" ]]; then
  bash tools/setup.sh
  bazel build //services/... 2>&1 | grep -E "^(ERROR|FAILED)" || true
  export RLFLEET_BIN="$PWD/bazel-bin/services"
fi
rm -rf "$DIR"
mkdir -p "$DIR"
LAUNCHER=""
GATEWAY=""
stop_all() {
  [[ -n "$GATEWAY" ]] && kill "$GATEWAY" 2>/dev/null && wait "$GATEWAY" 2>/dev/null
  [[ -n "$LAUNCHER" ]] && kill -TERM "$LAUNCHER" 2>/dev/null && wait "$LAUNCHER" 2>/dev/null
  GATEWAY=""
  LAUNCHER=""
}
trap stop_all EXIT
bash deploy/local/launch.sh --rollouts=2 --dir="$DIR/fleet" >"$DIR/launch.log" 2>&1 &
LAUNCHER=$!
for _ in $(seq 1 300); do
  grep -q "fleet up" "$DIR/launch.log" 2>/dev/null && break
  kill -0 "$LAUNCHER" 2>/dev/null || { echo "the fleet did not start:"; cat "$DIR/launch.log"; exit 1; }
  sleep 0.5
done
CONTROLLER=$(grep -o "fleet up: controller [0-9.:]*" "$DIR/launch.log" | awk '{print $4}')
[[ -n "$CONTROLLER" ]] || { echo "the fleet did not start:"; cat "$DIR/launch.log"; exit 1; }
echo "== fleet up (controller $CONTROLLER, logs in $DIR/fleet)"
echo "== rlfleet run --task=mul: multi-turn episodes with the calculator"
"$RLFLEET_BIN/controller/rlfleet" run --controller="$CONTROLLER" --task=mul --min_len=1 --max_len=2 \
  --steps="$STEPS" --entropy_coef=0.1 --eval_every=20 --stop_at="$STOP_AT" --timeout=120s

# The trained policy's first turn for a few prompts, through the gateway.
"$RLFLEET_BIN/gateway/rlfleet-gateway" --registry_address="$CONTROLLER" --http_port=0 \
  --http_port_file="$DIR/gateway.port" >"$DIR/gateway.log" 2>&1 &
GATEWAY=$!
for _ in $(seq 1 100); do [[ -s "$DIR/gateway.port" ]] && break; sleep 0.1; done
echo "== what it writes first (greedy), through the OpenAI-compatible gateway:"
for prompt in "mul:7*4" "mul:37*4" "mul:52*3" "mul:9*8"; do
  curl -s "http://127.0.0.1:$(cat "$DIR/gateway.port")/v1/completions" \
    -d "{\"model\":\"rlfleet\",\"prompt\":\"$prompt\",\"temperature\":0,\"max_tokens\":8,\"stop\":\"]\"}" |
    python3 -c 'import json,sys; d=json.load(sys.stdin); print("  '"$prompt"' ->", d["choices"][0]["text"] + "]")'
done
