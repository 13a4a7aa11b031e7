#!/usr/bin/env bash
# Installs every Debian package rlfleet needs to build, test and run.
# Idempotent: when everything is present it prints nothing and returns at once.
set -euo pipefail

PACKAGES=(
  bazel-bootstrap bazel-rules-java default-jdk-headless pkg-config g++ git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libhiredis-dev libucx-dev ucx-utils
  libtorch-dev libopenblas0-pthread libgloo-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  redis-server redis-tools python3 python3-grpcio openssl ca-certificates
  python3-torch gnuplot-nox prometheus libssl-dev nlohmann-json3-dev libicu-dev
  libyaml-cpp-dev python3-venv python3-protobuf python3-setuptools
  clang-14 libclang-rt-14-dev clang-format-14 clang-tidy-14 cmake curl
  libcpp-httplib-dev
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "setup: installing ${#missing[@]} missing packages: ${missing[*]}" >&2
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq >/dev/null
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Debian's libtorch links libblas.so.3; make sure it resolves to OpenBLAS, not the
# reference BLAS (several times slower; see DESIGN.md).
if [[ -x /usr/sbin/update-alternatives ]]; then
  blas=$(update-alternatives --query libblas.so.3-x86_64-linux-gnu 2>/dev/null | awk '/^Value:/{print $2}')
  if [[ -n "$blas" && "$blas" != *openblas* ]]; then
    alt=$(update-alternatives --list libblas.so.3-x86_64-linux-gnu | grep openblas | head -1 || true)
    if [[ -n "$alt" ]]; then
      ${SUDO:-} update-alternatives --set libblas.so.3-x86_64-linux-gnu "$alt" >/dev/null
    fi
  fi
fi
