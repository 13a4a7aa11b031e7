#!/usr/bin/env bash
# On the build machine (Bazel): packs what deploy/gpu/run_demo.sh needs on a GPU host
# that has PyTorch but no Bazel, gRPC, absl or Redis into .carry/ (git-ignored): the
# fleet's binaries and the GPU bench (tools/device/pack.sh), redis-server and
# redis-cli, and Debian's absl headers and libraries to build the backends against
# (tools/device/pack_absl.sh). About 92 MB since the tokenizer brought ICU (31 MB of it
# ICU's data), more than a carry to the GPU machine holds (64 MiB): so it is also packed
# as .carryz/carry.tar.xz (about 21 MB), which deploy/gpu/unpack_carry.sh unpacks there.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash tools/device/pack.sh //services/controller:rlfleet-controller //services/controller:rlfleet \
  //services/reward:rlfleet-reward //services/buffer:rlfleet-buffer //services/trainer:rlfleet-trainer \
  //services/rollout:rlfleet-rollout //services/weights:rlfleet-weights //services/gateway:rlfleet-gateway \
  //bench:rollout_tokens \
  "$(command -v redis-server)" "$(command -v redis-cli)"
bash tools/device/pack_absl.sh
du -sh .carry >&2
mkdir -p .carryz
tar -cJf .carryz/carry.tar.xz .carry
du -sh .carryz/carry.tar.xz >&2
