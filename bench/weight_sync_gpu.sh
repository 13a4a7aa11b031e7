#!/usr/bin/env bash
# Runs on the GPU machine (issue 8, run 2), from the repository root, over what
#   tools/device/pack.sh //bench:weight_sync_nccl
# packed into .carry: for each (D, T) that the GPU count allows, our planner + executor
# over NCCL, then torch.distributed moving the same pairs' bytes on the same GPUs in the
# same run. Writes a table to ${OUT:-.}/weight_sync_gpu.md and prints as its last line
# weight_sync_gpu_ratio_vs_torch=<min over configurations of ours / torch GB/s>.
set -uo pipefail
export NCCL_NVLS_ENABLE=0  # NVLink multicast stays off on shared machines
nccl_dir=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null || true)
export LD_LIBRARY_PATH="$PWD/.carry/lib${nccl_dir:+:$nccl_dir}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
out="${OUT:-.}"
mkdir -p "$out"
gpus=$(nvidia-smi -L | wc -l)
model_mib=${MODEL_MIB:-2048}
repeats=${REPEATS:-5}
# EXTRA_ARGS: more weight_sync_nccl flags (e.g. --chunk_mib=256).
# "D T split [cast]". TP by columns is left out here: its many row-sized pieces go
# through staging one cudaMemcpyAsync each (a gather kernel is the next step).
configs=("1 1 rows")
if (( gpus >= 3 )); then configs+=("1 2 rows" "2 1 rows"); fi
if (( gpus >= 4 )); then configs+=("2 2 rows" "2 2 rows cast"); fi
table="$out/weight_sync_gpu.md"
{
  echo "# weight path GPU to GPU: planner + executor over NCCL vs torch.distributed"
  echo
  echo "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x $gpus; model ${model_mib} MiB bf16 (4096x4096 matrices + replicated norms); median of $repeats after a warm-up; NCCL_NVLS_ENABLE=0."
  echo
  echo "| D -> T | TP split | bytes needed | moved/needed | ours GB/s | torch GB/s | ratio | verified |"
  echo "|---|---|---|---|---|---|---|---|"
} > "$table"
min_ratio=""
port=29533
for c in "${configs[@]}"; do
  read -r d t split cast <<< "$c"
  name="${d}_${t}_${split}${cast:+_cast}"
  json="$out/ours_${name}.json"
  .carry/bin/weight_sync_nccl --src_ranks="$d" --dst_ranks="$t" --dst_split="$split" \
    ${cast:+--cast} --model_mib="$model_mib" --repeats="$repeats" --json="$json" ${EXTRA_ARGS:-} \
    > "$out/ours_${name}.log" 2>&1
  tail -1 "$out/ours_${name}.log"
  ref="$out/torch_${name}.json"
  port=$((port + 1))
  python3 bench/weight_sync_torch.py --pairs "$json" --out "$ref" --repeats "$repeats" --port "$port" \
    > "$out/torch_${name}.log" 2>&1 || { echo "torch reference failed:"; tail -5 "$out/torch_${name}.log"; }
  row=$(python3 - "$json" "$ref" "$split${cast:+ (f32 -> bf16)}" <<'PY'
import json, sys
ours = json.load(open(sys.argv[1])); ref = json.load(open(sys.argv[2]))
moved = sum(p[2] for p in ours["pairs"])
ratio = ours["GBps"] / ref["GBps"]
print(f'| {ours["D"]} -> {ours["T"]} | {sys.argv[3]} | {ours["bytes_needed"]} | {moved / ours["bytes_needed"]:.2f} | '
      f'{ours["GBps"]:.1f} | {ref["GBps"]:.1f} | {ratio:.3f} | {"yes" if ours["verified"] else "NO"} |')
print(ratio)
PY
)
  echo "$row" | head -1 | tee -a "$table"
  r=$(echo "$row" | tail -1)
  if [[ -z "$min_ratio" ]] || python3 -c "import sys; sys.exit(0 if $r < $min_ratio else 1)"; then min_ratio=$r; fi
done
echo "weight_sync_gpu_ratio_vs_torch=$min_ratio" | tee -a "$table"
