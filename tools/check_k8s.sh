#!/usr/bin/env bash
# Checks deploy/k8s offline: every kustomize build (base, overlays/pools, overlays/dev)
# resolves, every object in it validates against the Kubernetes OpenAPI schemas
# (kubernetes-models, and the prometheus-operator and KEDA models for their CRDs:
# deploy/k8s/validate, its npm packages pinned by package-lock.json and installed once
# into ~/.cache/rlfleet-k8s-validate), and the run file each build mounts parses for
# every binary (each started with --config=run.yaml --help: exit 2 means the file is
# wrong for it) when the binaries are built (RLFLEET_BIN, default bazel-bin/services).
# Needs kubectl (its kustomize; Debian's kubernetes-client when none is installed),
# node and npm. Prints `k8s: N objects valid in M builds` and exits non-zero on any
# problem.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SUDO=""
[[ $(id -u) -ne 0 ]] && SUDO="sudo"
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  ${SUDO:-} apt-get install -y -qq nodejs npm >/dev/null 2>&1 || { echo "check_k8s: no node / npm"; exit 1; }
fi
if ! command -v kubectl >/dev/null; then
  ${SUDO:-} apt-get install -y -qq kubernetes-client >/dev/null 2>&1 || { echo "check_k8s: no kubectl"; exit 1; }
fi
CACHE="${RLFLEET_K8S_CACHE:-$HOME/.cache/rlfleet-k8s-validate}"
mkdir -p "$CACHE"
if ! cmp -s "$ROOT/deploy/k8s/validate/package-lock.json" "$CACHE/package-lock.json" || [[ ! -d "$CACHE/node_modules" ]]; then
  cp "$ROOT/deploy/k8s/validate/package.json" "$ROOT/deploy/k8s/validate/package-lock.json" "$CACHE/"
  (cd "$CACHE" && npm ci --ignore-scripts --no-audit --no-fund >npm.log 2>&1) ||
    { echo "check_k8s: npm ci failed:"; tail -5 "$CACHE/npm.log"; exit 1; }
fi
cp "$ROOT/deploy/k8s/validate/validate.mjs" "$CACHE/"
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
args=()
for build in base overlays/pools overlays/dev; do
  name=$(basename "$build")
  if ! kubectl kustomize "$ROOT/deploy/k8s/$build" >"$OUT/$name.yaml" 2>"$OUT/$name.err"; then
    echo "check_k8s: kubectl kustomize deploy/k8s/$build failed:"; cat "$OUT/$name.err"; exit 1
  fi
  args+=("$name=$OUT/$name.yaml")
done
mkdir -p "$OUT/run"
RESULT=$(cd "$CACHE" && RUN_FILES_DIR="$OUT/run" node validate.mjs "${args[@]}")
RC=$?
echo "$RESULT" | grep -v ' objects (' || true
objects=$(echo "$RESULT" | grep -o ': [0-9]* objects' | awk '{s += $2} END {print s + 0}')
[[ $RC -eq 0 ]] || { echo "check_k8s: objects that do not validate (above)"; exit 1; }

BIN="${RLFLEET_BIN:-$ROOT/bazel-bin/services}"
runs=0
if [[ -x "$BIN/controller/rlfleet" ]]; then
  for run in "$OUT"/run/*.run.yaml; do
    for bin in controller/rlfleet-controller reward/rlfleet-reward buffer/rlfleet-buffer trainer/rlfleet-trainer \
               weights/rlfleet-weights rollout/rlfleet-rollout gateway/rlfleet-gateway; do
      "$BIN/$bin" --config="$run" --help >"$OUT/help.log" 2>&1
      if [[ $? -eq 2 ]]; then echo "check_k8s: $(basename "$run") for $bin:"; grep -v '^ ' "$OUT/help.log" | head -3; exit 1; fi
    done
    "$BIN/controller/rlfleet" run-file fleet.rollouts --config="$run" >/dev/null ||
      { echo "check_k8s: $(basename "$run") for rlfleet"; exit 1; }
    runs=$((runs + 1))
  done
else
  echo "check_k8s: $BIN not built: the run files were not checked against the binaries"
fi
echo "k8s: $objects objects valid in ${#args[@]} builds; $runs run files parse for every binary"
