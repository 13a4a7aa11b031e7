#!/usr/bin/env python3
"""The reference for bench/weight_sync_nccl: torch.distributed (NCCL) moves the same
bytes between the same GPUs. For every (source, destination) pair that the plan has,
in the JSON that weight_sync_nccl wrote, a broadcast of exactly that pair's bytes from
the source within a two-rank group of the pair; all pairs at once (async_op), as our
executor does. The median over repeats of the slowest rank's time; writes JSON.

  python3 weight_sync_torch.py --pairs ours.json --out torch.json [--repeats 5]
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank, world, spec, repeats, port, out):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    groups, mine = [], []
    for src, dst, nbytes in spec["pairs"]:
        g = dist.new_group([src, dst])
        if rank in (src, dst):
            buf = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
            if rank == src:
                buf.random_(0, 255)
            mine.append((g, src, buf))
        groups.append(g)
    times = []
    for rep in range(repeats + 1):
        dist.barrier()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        works = [dist.broadcast(buf, src=src, group=g, async_op=True) for g, src, buf in mine]
        for w in works:
            w.wait()
        torch.cuda.synchronize()
        elapsed = torch.tensor([time.perf_counter() - t0], device="cuda")
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        if rep > 0:
            times.append(elapsed.item())
    if rank == 0:
        times.sort()
        median = times[len(times) // 2]
        with open(out, "w") as f:
            json.dump({"median_s": median, "GBps": spec["bytes_needed"] / median / 1e9,
                       "times": times, "torch": torch.__version__,
                       "nccl": ".".join(map(str, torch.cuda.nccl.version()))}, f)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--pairs", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--port", type=int, default=29533)
    a = p.parse_args()
    spec = json.load(open(a.pairs))
    world = spec["D"] + spec["T"]
    mp.spawn(worker, args=(world, spec, a.repeats, a.port, a.out), nprocs=world)


if __name__ == "__main__":
    main()
