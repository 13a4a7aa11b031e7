# Sourced by tools/thread_safety.sh and tools/tidy.sh: the flags that let clang parse
# our sources as Bazel compiles them (after `bazel build` generated the protobuf
# headers), the files both check, and the driver both run.
#   CLANG_FLAGS       the flags (an array)
#   clang_files       prints the .cc files of libs/ and services/ (tests included; not CUDA)
#   clang_check_main  the driver (below)

# (asked once; the per-file children get it from the environment)
if [[ -z "${RLFLEET_BAZEL_BIN:-}" ]]; then
  RLFLEET_BAZEL_BIN=$(bazel info bazel-bin 2>/dev/null)
  [[ -d "$RLFLEET_BAZEL_BIN/proto/rlfleet/v1" ]] || bazel build //proto/... >/dev/null 2>&1
  export RLFLEET_BAZEL_BIN
fi
CLANG_FLAGS=(-std=c++17 -Wno-unknown-warning-option -D_GLIBCXX_USE_CXX11_ABI=1 -DUSE_C10D_GLOO
             -I. -I"$RLFLEET_BAZEL_BIN/proto" -I"$RLFLEET_BAZEL_BIN" -I/usr/include/torch/csrc/api/include
             -I"${CUDA_HOME:-/usr/local/cuda}/include"
             $(pkg-config --cflags grpc++ protobuf ucx hiredis 2>/dev/null))

clang_files() { git ls-files 'libs/*.cc' 'services/*.cc' | grep -v '/cuda/'; }

# The checks' driver: `SCRIPT --one FILE` runs the caller's check_one on FILE (it prints
# the file's findings, or a line "NAME: ... could not parse FILE:"); otherwise every file
# of clang_files (or the arguments) in parallel over the cores, then
# `NAME: N files, W warnings, F not parsed`, W counting the output lines that match
# WARNING_REGEX (grep -E). Exits 0 only when W and F are 0.
#   clang_check_main NAME WARNING_REGEX "$@"
clang_check_main() {
  local name=$1 warning_regex=$2 out warnings failed files
  shift 2
  if [[ "${1:-}" == "--one" ]]; then check_one "$2"; exit 0; fi
  if (($#)); then files=("$@"); else
    mapfile -t files < <(clang_files)
  fi
  # (each clang is one process; torch's headers make some files take ~10 s)
  out=$(printf '%s\n' "${files[@]}" | xargs -P "$(nproc)" -n 1 bash "$0" --one)
  [[ -n "$out" ]] && echo "$out"
  warnings=$(grep -cE "$warning_regex" <<<"$out")
  failed=$(grep -c "^$name: .*could not parse" <<<"$out")
  echo "$name: ${#files[@]} files, $warnings warnings, $failed not parsed"
  ((warnings == 0 && failed == 0))
  exit
}
