#!/usr/bin/env bash
# The gateway battery as a user meets it (issues 43 and 47): a launched local fleet
# (deploy/local/launch.sh, 2 rollout replicas, a small policy) training a run while
# tests/battery/gateway_battery.py attacks its gateway (malformed and oversized
# requests, half-sent heads, abandoned requests, 70 concurrent heavy streams from one
# client); then 40 streams are left open and the gateway is killed (kill -9), and every
# replica's in-flight gauges must return to exactly 0. Passes when the battery has no
# bad case, the gateway was never restarted, the gauges returned to 0, the run advanced
# while the streams ran, and it ended COMPLETED.
#
#   bash tests/battery/gateway_fleet.sh [--steps=N] [--streams=N] [--out=FILE]
#
# Binaries from $RLFLEET_BIN (default bazel-bin/services; `bazel build //services/...`
# first). Prints `gateway_fleet: PASS` (exit 0) or `gateway_fleet: FAIL (reasons)`.
set -uo pipefail
cd "$(dirname "$0")/../.."
REPO=$(pwd)
BIN="${RLFLEET_BIN:-bazel-bin/services}"
[[ "$BIN" = /* ]] || BIN="$REPO/$BIN"
STEPS=300
STREAMS=70
OUT="bench/results/gateway_battery.md"
for a in "$@"; do
  case "$a" in
    --steps=*) STEPS="${a#*=}" ;;
    --streams=*) STREAMS="${a#*=}" ;;
    --out=*) OUT="${a#*=}" ;;
    *) echo "gateway_fleet.sh: unknown argument $a" >&2; exit 2 ;;
  esac
done
DIR=$(mktemp -d "${TMPDIR:-/tmp}/rlfleet-gwfleet.XXXXXX")
cp deploy/local/launch.sh "$DIR/launch.sh"  # (bash reads a script as it runs)
LAUNCH_PID=""
RUN_PID=""
cleanup() {
  [[ -n "$RUN_PID" ]] && kill -TERM "$RUN_PID" 2>/dev/null
  if [[ -n "$LAUNCH_PID" ]] && kill -0 "$LAUNCH_PID" 2>/dev/null; then
    kill -TERM "$LAUNCH_PID"
    for _ in $(seq 1 300); do kill -0 "$LAUNCH_PID" 2>/dev/null || break; sleep 0.1; done
  fi
}
trap cleanup EXIT
START=$(date +%s)
# (a policy with room for long responses: the streams below ask for 2048 tokens)
RLFLEET_BIN="$BIN" bash "$DIR/launch.sh" --rollouts=2 --dir="$DIR/fleet" -- --d_model=64 --n_layers=2 --threads=1 \
  --max_seq_len=4096 \
  >"$DIR/launch.out" 2>&1 &
LAUNCH_PID=$!
for _ in $(seq 1 600); do
  grep -q "fleet up" "$DIR/launch.out" && break
  kill -0 "$LAUNCH_PID" 2>/dev/null || break
  sleep 0.2
done
grep -q "fleet up" "$DIR/launch.out" || { cat "$DIR/launch.out"; echo "gateway_fleet: FAIL (the fleet did not come up)"; exit 2; }
CONTROLLER=$(grep -o -m1 'controller [0-9.]*:[0-9]*' "$DIR/launch.out" | head -1 | awk '{print $2}')
GATEWAY=$(grep -o -m1 'http://[0-9.]*:[0-9]*/v1' "$DIR/launch.out" | sed 's|http://||; s|/v1||')
GATEWAY_PID=$(grep -o -m1 'gateway on [0-9.:]* (pid [0-9]*' "$DIR/launch.out" | grep -o '[0-9]*$')
echo "gateway_fleet: fleet up in $(( $(date +%s) - START )) s: controller $CONTROLLER, gateway $GATEWAY (pid $GATEWAY_PID)"

step_of_run() {  # the active run's step (0 when unknown)
  "$BIN/controller/rlfleet" status --controller="$CONTROLLER" 2>/dev/null | grep -o -m1 'step: [0-9]*' | grep -o '[0-9]*' || echo 0
}
"$BIN/controller/rlfleet" run --controller="$CONTROLLER" --task=reverse --steps="$STEPS" --eval_every=20 --stop_at=0 \
  --timeout=30s >"$DIR/run.out" 2>&1 &
RUN_PID=$!
for _ in $(seq 1 300); do (( $(step_of_run) >= 2 )) && break; sleep 0.5; done
STEP_BEFORE=$(step_of_run)
echo "gateway_fleet: the run is at step $STEP_BEFORE; the battery starts"

FAIL=()
python3 tests/battery/gateway_battery.py --gateway="$GATEWAY" --streams="$STREAMS" --out="$OUT" || FAIL+=("battery")
STEP_AFTER=$(step_of_run)
echo "gateway_fleet: the run went from step $STEP_BEFORE to $STEP_AFTER during the battery"
(( STEP_AFTER > STEP_BEFORE )) || FAIL+=("the run did not advance during the battery")
grep -q "gateway (pid [0-9]*) exited" "$DIR/launch.out" && FAIL+=("the gateway exited during the battery")

# 40 streams open (their heads read: generating), then kill -9 the gateway: the
# replicas' gauges must come back to 0.
python3 - "$GATEWAY" "$DIR/streams.open" <<'EOF' &
import json, select, socket, sys, time
host, port = sys.argv[1].rsplit(":", 1)
body = json.dumps({"model": "rlfleet", "prompt": "reverse:12345", "n": 4, "max_tokens": 512, "ignore_eos": True,
                   "stream": True}).encode()
socks, statuses = [], {}
for _ in range(40):
    s = socket.create_connection((host, int(port)), timeout=30)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    socks.append(s)
waiting, deadline = list(socks), time.time() + 120  # (a busy machine: the first tokens may take a while)
while waiting and time.time() < deadline:
    ready, _, _ = select.select(waiting, [], [], 1.0)
    for s in ready:
        st = s.recv(4096)[9:12].decode() or "closed"
        statuses[st] = statuses.get(st, 0) + 1
        waiting.remove(s)
statuses["no answer"] = len(waiting)
open(sys.argv[2], "w").write(json.dumps(statuses) + "\n")
time.sleep(120)
EOF
CLIENTS=$!
for _ in $(seq 1 1300); do [[ -s "$DIR/streams.open" ]] && break; sleep 0.1; done
echo "gateway_fleet: 40 streams (n=4) sent; answers $(cat "$DIR/streams.open" 2>/dev/null)"
if ! grep -q '"200"' "$DIR/streams.open" 2>/dev/null; then
  FAIL+=("no stream was generating when the gateway was killed")
  tail -5 "$DIR/fleet/gateway.log"
fi
kill -9 "$GATEWAY_PID"
echo "gateway_fleet: killed the gateway (pid $GATEWAY_PID) with those streams open"
gauges() {  # the sum of every replica's in-flight gauges, from their /metrics
  local sum=0 addr v
  for addr in $(grep -ho 'metrics on http://[0-9.:]*' "$DIR"/fleet/rollout*.log | sed 's|metrics on http://||' | sort -u); do
    for v in $(curl -s --max-time 2 "http://$addr/metrics" | grep -E '^rlfleet_rollout_(queued_sequences|active_sequences|open_streams)' | awk '{print $2}'); do
      sum=$(python3 -c "print(int($sum + abs(float('$v'))))")
    done
  done
  echo "$sum"
}
ZERO=0
for _ in $(seq 1 60); do
  g=$(gauges)
  [[ "$g" == 0 ]] && { ZERO=1; break; }
  sleep 0.5
done
kill "$CLIENTS" 2>/dev/null
wait "$CLIENTS" 2>/dev/null
[[ $ZERO -eq 1 ]] && echo "gateway_fleet: every replica's queued / active / open-stream gauges back to 0" ||
  FAIL+=("the replicas' in-flight gauges did not return to 0 (sum |gauges| $(gauges))")
curl -s "http://$(grep -ho 'metrics on http://[0-9.:]*' "$DIR"/fleet/rollout*.log | head -1 | sed 's|metrics on http://||')/metrics" |
  grep -E '^rlfleet_inflight_underflows_total' | awk '$2 != 0 {found=1} END {exit found}' || FAIL+=("a gauge underflowed")

# The run goes on to its end (the launcher restarts the killed gateway meanwhile).
wait "$RUN_PID"
RUN_RC=$?
RUN_PID=""
tail -3 "$DIR/run.out"
[[ $RUN_RC -eq 0 ]] || FAIL+=("the run did not complete (exit $RUN_RC)")
echo "gateway_fleet: $(( $(date +%s) - START )) s in all; logs in $DIR"
if ((${#FAIL[@]})); then
  echo "gateway_fleet: FAIL ($(IFS=';'; echo "${FAIL[*]}"))"
  exit 1
fi
echo "gateway_fleet: PASS"
