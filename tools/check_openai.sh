#!/usr/bin/env bash
# The official OpenAI client library (npm `openai`, pinned by tests/openai/package-lock.json
# and installed once into ~/.cache/rlfleet-openai-check) against rlfleet-gateway in front
# of a real rollout replica serving a tiny random Qwen2-shaped model directory (made by
# examples/math:make_tiny_model, with the Qwen2.5 chat template of libs/model/testdata),
# the API key required: tests/openai/check.mjs.
# Needs the binaries built (RLFLEET_BIN, default bazel-bin/services; RLFLEET_MAKE_MODEL,
# default bazel-bin/examples/math/make_tiny_model), node and npm. Prints each check and
# `openai: N passed, M failed`; exits non-zero on any failure. Stops what it started, by pid.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BIN="${RLFLEET_BIN:-$ROOT/bazel-bin/services}"
MAKE_MODEL="${RLFLEET_MAKE_MODEL:-$ROOT/bazel-bin/examples/math/make_tiny_model}"
SUDO=""
[[ $(id -u) -ne 0 ]] && SUDO="sudo"
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  ${SUDO:-} apt-get install -y -qq nodejs npm >/dev/null 2>&1 || { echo "check_openai: no node / npm"; exit 1; }
fi
for b in "$BIN/rollout/rlfleet-rollout" "$BIN/gateway/rlfleet-gateway" "$MAKE_MODEL"; do
  [[ -x "$b" ]] || { echo "check_openai: $b is not built"; exit 1; }
done
CACHE="${RLFLEET_OPENAI_CACHE:-$HOME/.cache/rlfleet-openai-check}"
mkdir -p "$CACHE"
if ! cmp -s "$ROOT/tests/openai/package-lock.json" "$CACHE/package-lock.json" || [[ ! -d "$CACHE/node_modules" ]]; then
  cp "$ROOT/tests/openai/package.json" "$ROOT/tests/openai/package-lock.json" "$CACHE/"
  (cd "$CACHE" && npm ci --ignore-scripts --no-audit --no-fund >npm.log 2>&1) ||
    { echo "check_openai: npm ci failed:"; tail -5 "$CACHE/npm.log"; exit 1; }
fi
cp "$ROOT/tests/openai/check.mjs" "$CACHE/"

DIR=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$DIR"
}
trap cleanup EXIT
wait_for_file() {  # wait_for_file FILE PID: until FILE is written, while PID lives (30 s at most)
  for _ in $(seq 1 300); do
    [[ -s "$1" ]] && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
"$MAKE_MODEL" --tokenizer="$ROOT/libs/model/testdata/hf/tokenizer_qwen2" --out="$DIR/tiny" >/dev/null ||
  { echo "check_openai: make_tiny_model failed"; exit 1; }
cp "$ROOT/libs/model/testdata/chat/qwen2_5.jinja" "$DIR/tiny/chat_template.jinja"
head -c 24 /dev/urandom | base64 | tr -d '/+=' >"$DIR/key"

"$BIN/rollout/rlfleet-rollout" --model_dir="$DIR/tiny" --max_seq_len=1024 --port=0 --port_file="$DIR/rollout.port" \
  >"$DIR/rollout.log" 2>&1 &
PIDS+=($!)
wait_for_file "$DIR/rollout.port" "${PIDS[-1]}" || { echo "check_openai: the rollout did not start:"; cat "$DIR/rollout.log"; exit 1; }
"$BIN/gateway/rlfleet-gateway" --rollouts="127.0.0.1:$(cat "$DIR/rollout.port")" --model_dir="$DIR/tiny" \
  --api_key_file="$DIR/key" --http_port=0 --http_port_file="$DIR/http.port" >"$DIR/gateway.log" 2>&1 &
PIDS+=($!)
wait_for_file "$DIR/http.port" "${PIDS[-1]}" || { echo "check_openai: the gateway did not start:"; cat "$DIR/gateway.log"; exit 1; }

(cd "$CACHE" && OPENAI_BASE_URL="http://127.0.0.1:$(cat "$DIR/http.port")/v1" OPENAI_API_KEY="$(cat "$DIR/key")" \
  MODEL=tiny timeout 300 node check.mjs)
RC=$?
if [[ $RC -ne 0 ]]; then
  echo "-- gateway log"; tail -20 "$DIR/gateway.log"
  echo "-- rollout log"; tail -20 "$DIR/rollout.log"
fi
exit $RC
