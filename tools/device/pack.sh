#!/usr/bin/env bash
# Packs Bazel-built binaries for the GPU machine (no Bazel, gRPC or absl there) into
# .carry/: each binary under .carry/bin/<its package>/ (//services/rollout:rlfleet-rollout
# -> .carry/bin/services/rollout/rlfleet-rollout, the layout deploy/local/launch.sh's
# RLFLEET_BIN wants), and the shared libraries they need that the GPU machine lacks in
# .carry/lib. Left behind: glibc, libstdc++ and NCCL (the GPU machine has its own), and
# the libtorch backends (librlfleet_model.so, librlfleet_gloo.so) with everything only
# they need (Debian's CPU libtorch): the GPU machine builds those against its own
# libtorch (deploy/gpu/build_backends.sh), so no binary there loads Debian's.
# An argument that is an absolute path (a Debian program, e.g. /usr/bin/redis-server)
# is copied to .carry/bin/system/ with its libraries.
#   tools/device/pack.sh //libs/gpu/tests:gpu_probe_test [more targets or /paths...]
# RLFLEET_PACK_BAZEL_FLAGS: flags for that build (e.g. "-c opt": bazel-bin then points
# at the optimised outputs).
set -euo pipefail
cd "$(dirname "$0")/../.."
[[ $# -gt 0 ]] || { echo "usage: $0 //bazel:target ..." >&2; exit 2; }
targets=()
for arg in "$@"; do [[ $arg == //* ]] && targets+=("$arg"); done
# shellcheck disable=SC2086  # (RLFLEET_PACK_BAZEL_FLAGS: e.g. "-c opt" for a benchmark; split on spaces)
((${#targets[@]} == 0)) || bazel build ${RLFLEET_PACK_BAZEL_FLAGS:-} "${targets[@]}" >&2
rm -rf .carry/bin .carry/lib && mkdir -p .carry/bin/system .carry/lib
for target in "$@"; do
  if [[ $target != //* ]]; then
    rel="system/$(basename "$target")"
    src="$target"
  else
    rel="$(echo "${target#//}" | tr ':' '/')"
    src="bazel-bin/$rel"
    mkdir -p ".carry/bin/$(dirname "$rel")"
  fi
  cp -L "$src" ".carry/bin/$rel"
  # The libraries the binary needs, walking DT_NEEDED from it and not through the
  # backends (ldd resolves the names to paths; readelf says who needs what).
  # (ldd on the original: its RUNPATH finds the per-library .so files of a test)
  python3 - "$src" <<'PY' | while read -r lib; do cp -Ln "$lib" .carry/lib/ 2>/dev/null || true; done
import re, subprocess, sys
exe = sys.argv[1]
paths = {}
for line in subprocess.run(["ldd", exe], capture_output=True, text=True).stdout.splitlines():
    m = re.match(r"\s*(\S+) => (/\S+)", line)
    if m:
        paths[m.group(1)] = m.group(2)
def needed(path):
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[(\S+)\]", out)
system = re.compile(r"^(libc|libm|libstdc\+\+|libgcc_s|libpthread|librt|libdl|ld-linux.*|libnccl)\.so")
seen, todo = set(), needed(exe)
while todo:
    name = todo.pop()
    if name in seen or name.startswith("librlfleet_") or system.match(name):
        continue
    if name not in paths:
        print(f"pack.sh: {exe} needs {name}, which ldd does not find", file=sys.stderr)
        continue
    if re.match(r"^(libtorch|libc10)", name):
        sys.exit(f"pack.sh: {exe} needs {name} other than through a backend: it would run Debian's libtorch")
    seen.add(name)
    print(paths[name])
    todo.extend(needed(paths[name]))
PY
done
# Symbols stay behind (a carry holds 64 MiB): each binary loses about half its size.
find .carry/bin .carry/lib -type f -exec strip --strip-unneeded {} + 2>/dev/null || true
du -sh .carry >&2
