#!/usr/bin/env bash
# Checks that the layers of tools/layers.bzl hold: every package under libs/<name>/
# declares lib_visibility("<name>"), every package under services/ declares
# service_visibility(), and Bazel refuses a dependency that reaches up (a probe package
# in libs/common depending on libs/transport) or from a library into a service (a
# probe in libs/model depending on services/buffer). The probes live in a temporary
# package that is removed on exit.
#
#   bash tools/check_layers.sh      # exits non-zero naming each problem
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BAZEL="${BAZEL:-bazel}"
errors=0
while IFS= read -r build; do
  dir=$(dirname "$build")
  name=$(cut -d/ -f2 <<<"$dir")
  if ! grep -q "lib_visibility(\"$name\")" "$build"; then
    echo "check_layers: $build does not declare package(default_visibility = lib_visibility(\"$name\"))" >&2
    errors=$((errors + 1))
  fi
done < <(find libs -name BUILD.bazel | sort)
while IFS= read -r build; do
  if ! grep -q "service_visibility()" "$build"; then
    echo "check_layers: $build does not declare package(default_visibility = service_visibility())" >&2
    errors=$((errors + 1))
  fi
done < <(find services -name BUILD.bazel | sort)

# The probes: each must fail analysis with a visibility error.
PROBES=(libs/common/layer_probe_tmp libs/model/layer_probe_tmp)
cleanup() { for p in "${PROBES[@]}"; do rm -rf "$p"; done; }
trap cleanup EXIT
probe() {  # probe DIR LAYER DEP WHAT
  local dir=$1 layer=$2 dep=$3 what=$4
  mkdir -p "$dir"
  cat >"$dir/BUILD.bazel" <<BUILD
load("//tools:layers.bzl", "lib_visibility")

package(default_visibility = lib_visibility("$layer"))

cc_library(
    name = "probe",
    deps = ["$dep"],
)
BUILD
  local out
  if out=$("$BAZEL" build --nobuild "//$dir:probe" 2>&1); then
    echo "check_layers: $what was accepted ($dir depending on $dep)" >&2
    errors=$((errors + 1))
  elif ! grep -q "is not visible from target" <<<"$out"; then
    echo "check_layers: $what failed, but not on visibility:" >&2
    grep -m3 ERROR <<<"$out" >&2 || true
    errors=$((errors + 1))
  fi
  rm -rf "$dir"
}
probe libs/common/layer_probe_tmp common //libs/transport "a lower library reaching up"
probe libs/model/layer_probe_tmp model //services/buffer:buffer_core "a library using a service"
if [[ $errors -gt 0 ]]; then
  echo "check_layers: $errors problem(s)" >&2
  exit 1
fi
echo "check_layers: every package declares its layer; reaching up and libs -> services are refused"
