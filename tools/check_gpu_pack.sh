#!/usr/bin/env bash
# deploy/gpu/pack_fleet.sh packs the binaries a GPU host runs the local fleet with;
# deploy/local/launch.sh refuses to start without every binary it lists. This check
# fails when launch.sh needs a binary the pack leaves out (a second list that drifts:
# the gateway once did). Prints `gpu-pack: N binaries packed` or what is missing.
set -uo pipefail
cd "$(dirname "$0")/.."
# launch.sh's list: `for bin in a/rlfleet-x b/rlfleet-y ...; do`, over lines ending in `\`.
needed=$(awk '/^for bin in /{on=1} on{print} on && /; do/{exit}' deploy/local/launch.sh |
  tr ' \\' '\n\n' | grep -E '^[a-z]+/rlfleet[a-z-]*;?$' | tr -d ';')
[[ -n "$needed" ]] || { echo "check_gpu_pack: found no binary list in deploy/local/launch.sh"; exit 1; }
missing=0
for bin in $needed; do
  target="//services/${bin%%/*}:${bin##*/}"
  if ! grep -qF -- "$target" deploy/gpu/pack_fleet.sh; then
    echo "check_gpu_pack: deploy/local/launch.sh needs $bin; deploy/gpu/pack_fleet.sh does not pack $target"
    missing=$((missing + 1))
  fi
done
((missing == 0)) || exit 1
echo "gpu-pack: $(echo "$needed" | wc -w) binaries packed"
