#!/usr/bin/env bash
# Runs on the GPU machine: bench/rollout_tokens (built by Bazel, carried) on the GPU
# through the model backend built there against PyTorch's CUDA libtorch
# (deploy/gpu/build_backends.sh), then Hugging Face transformers' generate for the same
# configs and batches (bench/gpu/hf_generate.py). Tables go to $OUT (or /tmp).
#   here:  tools/device/pack.sh //bench:rollout_tokens && tools/device/pack_absl.sh
#   there: bash bench/gpu/run_rollout_gpu.sh     (carry: [".carry"])
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
backends="$(deploy/gpu/build_backends.sh)"
export LD_LIBRARY_PATH="$backends:$PWD/.carry/lib:$PWD/.carry/absl/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$out/gpu.txt"
echo "ours (libs/model on cuda)" >&2
.carry/bin/bench/rollout_tokens --device=cuda --torch_script= --repeats=3 --rounds=1 --out="$out/rollout_tokens_gpu.md"
echo "Hugging Face generate" >&2
python3 bench/gpu/hf_generate.py --device cuda --repeats 3 | tee "$out/hf_generate.jsonl"
