#!/usr/bin/env python3
"""Collects the GPU benchmarks' results in DIR (bench/gpu/run_gpu_bench.sh writes them)
into one summary on stdout: the decode table (ours vs Hugging Face generate, tokens/s and
peak GPU memory, per config, batch and dtype), the train-step ratios, and the named
`name=value` ratio lines of issue 20. A ratio no benchmark measured says so.

  gpu_summary.py DIR > DIR/gpu_summary.txt
"""
import json
import os
import re
import sys


def main():
    d = sys.argv[1]
    lines = []
    env = os.path.join(d, "gpu_env.txt")
    if os.path.exists(env):
        lines += ["# " + l for l in open(env).read().splitlines()]
    rows = {}
    for name in ("decode.jsonl", "decode_eager.jsonl"):
        path = os.path.join(d, name)
        if not os.path.exists(path):
            continue
        for line in open(path):
            if not line.strip():
                continue
            r = json.loads(line)
            side = r["side"] if name == "decode.jsonl" else "ours_eager"
            rows[(r["config"], r["batch"], r["dtype"], side)] = r
    keys = sorted({k[:3] for k in rows})
    ratios = {}
    lines.append("")
    lines.append("decode: config batch dtype | ours tok/s (decode) | ours eager tok/s | HF tok/s | ours/HF | "
                 "ours peak MiB | HF peak MiB")
    for config, batch, dtype in keys:
        ours = rows.get((config, batch, dtype, "ours"))
        hf = rows.get((config, batch, dtype, "hf"))
        eager = rows.get((config, batch, dtype, "ours_eager"))
        if ours is None or hf is None:
            continue
        ratio = ours["tokens_per_s"] / hf["tokens_per_s"]
        ratios.setdefault(batch, []).append(ratio)
        lines.append("  %s %4d %s | %9.0f (%s) | %s | %9.0f | %5.2f | %7.1f | %7.1f" % (
            config, batch, dtype, ours["tokens_per_s"], ours["decode"],
            "%9.0f" % eager["tokens_per_s"] if eager else "        -", hf["tokens_per_s"], ratio,
            ours["peak_bytes"] / 2**20, hf["peak_bytes"] / 2**20))
        lines.append("decode_ratio_vs_hf_%s_b%d_%s=%.3f" % (config, batch, dtype, ratio))
    train = {}
    for name in sorted(os.listdir(d)):
        m = re.match(r"train_step_gpu_(\w+)\.md$", name)
        if not m:
            continue
        for line in open(os.path.join(d, name)):
            row = re.match(r"\| (\w+) \| (\d+) \| (\d+) \| ([0-9.]+) \|", line)
            if row:
                train["%s_%s" % (row.group(1), m.group(1))] = float(row.group(4))
                lines.append("train %s: %s" % (m.group(1), line.strip()))
    lines.append("")
    lines.append("# the named ratios: the lowest over configs (a, b) and dtypes (fp32, bf16) measured")
    for batch in (32, 256):
        if batch in ratios:
            lines.append("decode_ratio_vs_hf_b%d=%.3f" % (batch, min(ratios[batch])))
        else:
            lines.append("decode_ratio_vs_hf_b%d: not measured" % batch)
    if train:
        lines.append("train_ratio_vs_torch_eager=%.3f" % min(train.values()))
        for k, v in sorted(train.items()):
            lines.append("train_ratio_vs_torch_eager_%s=%.3f" % (k, v))
    else:
        lines.append("train_ratio_vs_torch_eager: not measured")
    install = os.path.join(d, "gpu_install.md")
    named = re.findall(r"^(gpu_install\w*_ratio_vs_d2d)=([0-9.]+)$", open(install).read(), re.M) if os.path.exists(install) else []
    lines += ["%s=%s" % kv for kv in named] or ["gpu_install_ratio_vs_d2d: not measured"]
    loops = os.path.join(d, "async_vs_sync_cuda0.md")  # (bench/async_vs_sync.sh cuda:0)
    found = re.findall(r"^async_over_sync=([0-9.]+)$", open(loops).read(), re.M) if os.path.exists(loops) else []
    lines.append("async_over_sync_gpu=%s" % found[-1] if found else "async_over_sync_gpu: not measured")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
