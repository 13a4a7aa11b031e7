#!/usr/bin/env python3
"""Hugging Face transformers' generate for bench/rollout_tokens' configs on a GPU: a
GPT-2 of the same size (vocab 32, d_model / layers / heads as config a and b, random
weights), the same batch sizes, prompt 16 tokens and exactly NEW new tokens each
(min_new_tokens = max_new_tokens), multinomial sampling, KV cache on. Prints one JSON
line per (config, batch) with tokens/s (best of REPEATS after a warm-up) and the peak
GPU memory torch's allocator held (weights, KV cache and activations).

  hf_generate.py [--device cuda] [--repeats 3] [--dtype fp32|bf16|fp16] [--batches 1,8,32]
"""
import argparse
import json
import time

import torch
import transformers

CONFIGS = {"a": dict(d=128, layers=4, heads=4, prompt=16, new=48, max_len=64),
           "b": dict(d=256, layers=6, heads=8, prompt=16, new=96, max_len=112)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--batches", default="1,8,32")
    args = ap.parse_args()
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}.get(args.dtype) or getattr(
        torch, args.dtype)
    cuda = args.device.startswith("cuda")
    for name, c in CONFIGS.items():
        cfg = transformers.GPT2Config(vocab_size=32, n_positions=c["max_len"], n_embd=c["d"],
                                      n_layer=c["layers"], n_head=c["heads"], bos_token_id=1,
                                      eos_token_id=2, pad_token_id=0)
        torch.manual_seed(0)
        model = transformers.GPT2LMHeadModel(cfg).to(args.device, dtype).eval()
        for batch in [int(b) for b in args.batches.split(",")]:
            if cuda:
                torch.cuda.reset_peak_memory_stats(args.device)
            prompts = torch.randint(4, 32, (batch, c["prompt"]), device=args.device)
            mask = torch.ones_like(prompts)

            def run():
                with torch.no_grad():
                    out = model.generate(prompts, attention_mask=mask, do_sample=True,
                                         max_new_tokens=c["new"], min_new_tokens=c["new"],
                                         top_k=0, pad_token_id=0)
                if cuda:
                    torch.cuda.synchronize()
                assert out.shape[1] == c["prompt"] + c["new"], out.shape
            run()  # warm-up
            best = 0.0
            for _ in range(args.repeats):
                start = time.perf_counter()
                run()
                best = max(best, batch * c["new"] / (time.perf_counter() - start))
            print(json.dumps({"side": "hf", "config": name, "batch": batch, "tokens_per_s": best,
                              "peak_bytes": torch.cuda.max_memory_allocated(args.device) if cuda else -1,
                              "transformers": transformers.__version__, "torch": torch.__version__,
                              "dtype": args.dtype}), flush=True)


if __name__ == "__main__":
    main()
