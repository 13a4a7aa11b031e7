# Sourced by tools/thread_safety.sh and tools/tidy.sh: the flags that let clang parse
# our sources as Bazel compiles them (after `bazel build` generated the protobuf
# headers), and the files both check.
#   CLANG_FLAGS   the flags (an array)
#   clang_files   prints the .cc files of libs/ and services/ (tests included; not CUDA)

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
