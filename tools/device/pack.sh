#!/usr/bin/env bash
# Packs Bazel-built binaries for the GPU machine (no Bazel, gRPC or absl there) into
# .carry/: binaries in .carry/bin, the shared libraries they need that the GPU machine
# lacks in .carry/lib. glibc, libstdc++ and NCCL (218 MiB here; the GPU machine has its
# own 2.28) stay behind.
#   tools/device/pack.sh //libs/gpu/tests:gpu_probe_test [more targets...]
set -euo pipefail
cd "$(dirname "$0")/../.."
[[ $# -gt 0 ]] || { echo "usage: $0 //bazel:target ..." >&2; exit 2; }
bazel build "$@" >&2
rm -rf .carry && mkdir -p .carry/bin .carry/lib
for target in "$@"; do
  path="bazel-bin/$(echo "${target#//}" | tr ':' '/')"
  cp -L "$path" .carry/bin/
  ldd "$path" | awk '$3 ~ /^\// {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libstdc++.so*|libgcc_s.so*|libpthread.so*|librt.so*|libdl.so*|ld-linux*|libnccl.so*) ;;
      *) cp -Ln "$lib" .carry/lib/ 2>/dev/null || true ;;
    esac
  done
done
du -sh .carry >&2
