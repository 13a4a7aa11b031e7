#!/usr/bin/env bash
# Runs on the GPU machine: issue 20's GPU benchmarks, each against its reference in the
# same run, then bench/gpu/gpu_summary.py collects their ratio lines into
# $OUT/gpu_summary.txt (or /tmp):
#  - decode: bench/rollout_tokens on cuda (CUDA graphs; and without, for the table) vs
#    Hugging Face generate (bench/gpu/hf_generate.py), batch 32 and 256, fp32 and bf16,
#    with peak GPU memory;
#  - train step: bench/train_step vs the same step in PyTorch eager
#    (bench/train_step_torch.py), fp32 and bf16 autocast;
#  - weight install GPU to GPU between two processes (bench/gpu_install: CUDA IPC) vs
#    cudaMemcpy device-to-device of the same bytes.
# The model backend is built there against PyTorch's CUDA libtorch
# (deploy/gpu/build_backends.sh); the benches are Bazel-built here and carried.
#   here:  tools/device/pack.sh //bench:rollout_tokens //bench:train_step //bench:gpu_install &&
#          tools/device/pack_absl.sh
#   there: bash bench/gpu/run_gpu_bench.sh     (carry: [".carry"])
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
backends="$(deploy/gpu/build_backends.sh)"
export LD_LIBRARY_PATH="$backends:$PWD/.carry/lib:$PWD/.carry/absl/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  grep -m1 "model name" /proc/cpuinfo | sed 's/.*: /CPU: /'
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
} >"$out/gpu_env.txt"
cat "$out/gpu_env.txt" >&2
rm -f "$out/decode.jsonl" "$out/decode_eager.jsonl"
for dtype in fp32 bf16; do
  echo "== decode, $dtype: ours, then Hugging Face generate" >&2
  .carry/bin/bench/rollout_tokens --device=cuda --torch_script= --batches=32,256 --dtype="$dtype" --repeats=3 \
    --rounds=1 --jsonl="$out/decode.jsonl" --out="$out/rollout_tokens_gpu_$dtype.md" >&2
  python3 bench/gpu/hf_generate.py --device cuda --dtype "$dtype" --batches 32,256 --repeats 3 >>"$out/decode.jsonl"
done
echo "== decode, fp32, without CUDA graphs (for the table)" >&2
.carry/bin/bench/rollout_tokens --device=cuda --torch_script= --batches=32,256 --cuda_graphs=false --repeats=3 \
  --rounds=1 --jsonl="$out/decode_eager.jsonl" --out=/dev/null >&2
for precision in fp32 bf16; do
  echo "== train step, $precision: ours vs PyTorch eager" >&2
  .carry/bin/bench/train_step --device=cuda --precision="$precision" --steps=20 --rounds=3 --out="$out/train_step_gpu_$precision.md" >&2
done
echo "== weight install GPU to GPU between processes vs cudaMemcpy D2D" >&2
nccl_dir=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null || true)
LD_LIBRARY_PATH="$LD_LIBRARY_PATH${nccl_dir:+:$nccl_dir}" .carry/bin/bench/gpu_install --out="$out/gpu_install.md" >&2
if [[ -x .carry/bin/services/controller/rlfleet && "${RLFLEET_SKIP_LOOPS:-0}" != 1 ]]; then
  echo "== loop modes on the GPU: sync, overlap, fully asynchronous (bench/async_vs_sync.sh)" >&2
  RLFLEET_BIN="$PWD/.carry/bin/services" PATH="$PWD/.carry/bin/system:$PATH" OUT="$out/async_vs_sync_cuda0.md" \
    bash bench/async_vs_sync.sh cuda:0 >&2
fi
python3 bench/gpu/gpu_summary.py "$out" | tee "$out/gpu_summary.txt"
