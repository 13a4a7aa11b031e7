#!/usr/bin/env bash
# Runs on the GPU machine: builds bench/rollout_tokens against PyTorch's CUDA libtorch
# (bench/gpu/CMakeLists.txt; absl from tools/device/pack_absl.sh in .carry/absl), runs
# it on the GPU, then Hugging Face transformers' generate for the same configs and
# batches (bench/gpu/hf_generate.py). Tables go to $OUT (or /tmp).
#   here:  tools/device/pack_absl.sh
#   there: bash bench/gpu/run_rollout_gpu.sh     (carry: [".carry"])
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
prefix="$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')"
build=/tmp/rlfleet_gpu_build
echo "configuring (torch at $prefix)" >&2
cmake -S bench/gpu -B "$build" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >"$out/cmake.log" 2>&1 ||
  { tail -40 "$out/cmake.log"; exit 1; }
echo "building" >&2
cmake --build "$build" -j "$(nproc)" >"$out/build.log" 2>&1 || { tail -60 "$out/build.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$out/gpu.txt"
echo "ours (libs/model on cuda)" >&2
LD_LIBRARY_PATH="$PWD/.carry/absl/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$build/rollout_tokens" --device=cuda --torch_script= --repeats=3 --rounds=1 \
  --out="$out/rollout_tokens_gpu.md"
echo "Hugging Face generate" >&2
python3 bench/gpu/hf_generate.py --device cuda --repeats 3 | tee "$out/hf_generate.jsonl"
