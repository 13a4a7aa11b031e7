#!/usr/bin/env python3
"""Issue 21's speed check on a GPU: a Qwen2.5-0.5B-shaped model (24 layers, d 896, 14
query / 2 KV heads, MLP 4864, vocab 151936, tied embeddings; random weights, bf16),
transformers' `generate` against ours (bench/hf_decode, the carried binary) on the same
directory and prompts: batch 64, 32-token prompts, exactly NEW greedy new tokens each
(no EOS in the config), best tokens/s of 3 after a warm-up, peak GPU memory; the share
of tokens where both sides chose the same (greedy bf16 paths part once two logits are
within rounding); then our GRPO step's time and peak memory. Prints the table and
`hf_decode_ratio_vs_transformers_b64=R`.

  python3 bench/gpu/hf_qwen_bench.py [--batch 64] [--new 128] [--ours .carry/bin/bench/hf_decode]
"""
import argparse
import json
import os
import subprocess
import tempfile
import time

import torch
import transformers


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "?"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ours", default=".carry/bin/bench/hf_decode")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    args = ap.parse_args()
    work = tempfile.mkdtemp()
    model_dir = os.path.join(work, "qwen2.5-0.5b-shape")
    config = transformers.Qwen2Config(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, hidden_act="silu",
        attn_implementation="sdpa")
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config).to("cuda", torch.bfloat16).eval()
    with torch.no_grad():  # (std 0.02 makes near-uniform logits: widen them so greedy picks are clear)
        model.model.embed_tokens.weight.normal_(0, 0.5)
    model.save_pretrained(model_dir)
    params = sum(p.numel() for p in model.parameters())
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(100, 150000, (args.batch, args.prompt), generator=g)
    prompts_file = os.path.join(work, "prompts.json")
    with open(prompts_file, "w") as f:
        json.dump(prompts.tolist(), f)
    ids = prompts.cuda()
    mask = torch.ones_like(ids)

    def run():
        with torch.no_grad():
            out = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=args.new,
                                 min_new_tokens=args.new, pad_token_id=0)
        torch.cuda.synchronize()
        return out
    torch.cuda.reset_peak_memory_stats()
    hf_out = run()  # warm-up
    hf = 0.0
    for _ in range(args.repeats):
        start = time.perf_counter()
        hf_out = run()
        hf = max(hf, args.batch * args.new / (time.perf_counter() - start))
    hf_peak = torch.cuda.max_memory_allocated()
    hf_tokens = hf_out[:, args.prompt:].tolist()
    del model
    torch.cuda.empty_cache()

    ours_file = os.path.join(work, "ours.json")
    line = subprocess.run([args.ours, "--model_dir=" + model_dir, "--prompts=" + prompts_file,
                           "--tokens_out=" + ours_file, "--new_tokens=%d" % args.new, "--device=cuda",
                           "--dtype=bf16", "--repeats=%d" % args.repeats, "--train_precision=bf16"],
                          check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
    ours = json.loads(line)
    with open(ours_file) as f:
        our_tokens = json.load(f)
    same = sum(a == b for x, y in zip(our_tokens, hf_tokens) for a, b in zip(x, y))
    first_part = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), args.new)
                  for x, y in zip(our_tokens, hf_tokens)]
    ratio = ours["tokens_per_s"] / hf
    gib = 1 << 30
    table = [
        "# Qwen2.5-0.5B-shaped model (%.0fM parameters, random, bf16) on %s" % (params / 1e6,
                                                                               torch.cuda.get_device_name()),
        "",
        "transformers %s, torch %s; batch %d, prompt %d, %d greedy new tokens; CPU %s" % (
            transformers.__version__, torch.__version__, args.batch, args.prompt, args.new, cpu_model()),
        "",
        "| side | tokens/s | peak GPU memory |",
        "|---|---:|---:|",
        "| transformers generate (sdpa) | %.0f | %.2f GiB |" % (hf, hf_peak / gib),
        "| rlfleet (%s) | %.0f | %.2f GiB |" % (ours["decode"], ours["tokens_per_s"], ours["decode_peak_bytes"] / gib),
        "",
        "same greedy token as transformers: %.3f of %d; first difference at token %s (median over rows)" % (
            same / (args.batch * args.new), args.batch * args.new, sorted(first_part)[len(first_part) // 2]),
        "GRPO step (bf16 autocast, fp32 weights and AdamW, micro-batch 16, %d tokens): %.3f s, peak %.2f GiB" % (
            ours["train_tokens"], ours["train_step_s"], ours["train_peak_bytes"] / gib),
        "",
        "hf_decode_ratio_vs_transformers_b%d=%.3f" % (args.batch, ratio),
    ]
    text = "\n".join(table) + "\n"
    print(text)
    with open(os.path.join(args.out, "hf_qwen_bench.md"), "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
