#!/usr/bin/env bash
# Runs on a GPU machine: records NCCL_DEBUG=INFO logs of small PyTorch NCCL jobs into
# $OUT (or /tmp) as test data for the NCCL log parser (libs/nccl/log_parser):
#  - allreduce_<n>gpu.log: an all-reduce over every GPU (one process each), INIT,
#    GRAPH, ENV and NET subsystems;
#  - duplicate_gpu.log: two ranks on one GPU, which NCCL refuses (an error log).
set -uo pipefail
out="${OUT:-/tmp}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
n=$(python3 -c 'import torch; print(torch.cuda.device_count())')
cat > /tmp/nccl_job.py <<'PY'
import os, sys, torch, torch.distributed as dist
rank, world, same_gpu = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
torch.cuda.set_device(0 if same_gpu else rank)
dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29533", rank=rank, world_size=world,
                        device_id=torch.device("cuda", 0 if same_gpu else rank))
x = torch.ones(64 << 20, device="cuda")
dist.all_reduce(x)
torch.cuda.synchronize()
print("rank", rank, "sum", x[0].item(), flush=True)
dist.destroy_process_group()
PY
job() {  # world same_gpu log
  local world=$1 same=$2 log=$3 pids=()
  for ((r = 0; r < world; r++)); do
    NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,GRAPH,ENV,NET timeout 120 python3 /tmp/nccl_job.py "$r" "$world" "$same" \
      >>"$log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
}
job "$n" 0 "$out/allreduce_${n}gpu.log"
job 2 1 "$out/duplicate_gpu.log"
nvidia-smi topo -m > "$out/topo.txt" 2>&1
wc -l "$out"/*.log
