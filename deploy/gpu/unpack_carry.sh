#!/usr/bin/env bash
# On the GPU host: unpacks .carryz/carry.tar.xz (deploy/gpu/pack_fleet.sh's compressed
# pack, for carries that hold 64 MiB) into .carry, unless .carry is there already.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [[ ! -d .carry/bin && -f .carryz/carry.tar.xz ]]; then
  tar -xJf .carryz/carry.tar.xz
fi
[[ -d .carry/bin ]] || { echo "unpack_carry: neither .carry nor .carryz/carry.tar.xz: run deploy/gpu/pack_fleet.sh" >&2; exit 1; }
