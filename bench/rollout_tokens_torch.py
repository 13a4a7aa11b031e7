#!/usr/bin/python3
"""PyTorch-eager reference for bench/rollout_tokens: the same model (weights read from
the safetensors file the C++ side wrote) and the same decode algorithm (KV cache
preallocated and written in place, fused QKV projection, one token per step for the
whole batch). Prints generated tokens per second as JSON.

  rollout_tokens_torch.py WEIGHTS D_MODEL N_LAYERS N_HEADS VOCAB BATCH PROMPT NEW THREADS REPEATS
"""
import json
import math
import sys
import time

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0] + "/../libs/model/reference")
from reference_policy import read_safetensors  # noqa: E402


def main():
    (weights, d, L, H, vocab, batch, prompt, new, threads, repeats) = sys.argv[1:11]
    d, L, H, vocab, batch, prompt, new, threads, repeats = map(int, (d, L, H, vocab, batch, prompt, new, threads, repeats))
    torch.set_num_threads(threads)
    w = read_safetensors(weights)
    dh = d // H
    T = prompt + new
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(4, vocab, (batch, prompt), generator=gen)

    def ln(h, p):
        return torch.nn.functional.layer_norm(h, (d,), w[p + ".weight"], w[p + ".bias"], 1e-5)

    def lin(h, p, bias=True):
        return torch.nn.functional.linear(h, w[p + ".weight"], w.get(p + ".bias") if bias else None)

    def forward(tok, p0, K, V):
        t = tok.shape[1]
        pos = torch.arange(p0, p0 + t)
        x = w["tok_emb.weight"][tok] + w["pos_emb.weight"][pos].unsqueeze(0)
        kpos = torch.arange(p0 + t)
        mask = (kpos.unsqueeze(0) <= pos.unsqueeze(1))
        bias = torch.zeros(1, 1, t, p0 + t).masked_fill(~mask, -1e9)
        for l in range(L):
            p = "blocks.%d." % l
            qkv = lin(ln(x, p + "ln1"), p + "qkv").view(batch, t, 3, H, dh).permute(2, 0, 3, 1, 4)
            K[l][:, :, p0:p0 + t].copy_(qkv[1])
            V[l][:, :, p0:p0 + t].copy_(qkv[2])
            att = torch.softmax(qkv[0] @ K[l][:, :, :p0 + t].transpose(-2, -1) / math.sqrt(dh) + bias, -1)
            y = (att @ V[l][:, :, :p0 + t]).transpose(1, 2).reshape(batch, t, d)
            x = x + lin(y, p + "proj")
            x = x + lin(torch.nn.functional.gelu(lin(ln(x, p + "ln2"), p + "fc1")), p + "fc2")
        return lin(ln(x, "ln_f"), "lm_head", bias=False)[:, -1]

    best = 0.0
    with torch.no_grad():
        for _ in range(repeats):
            K = [torch.zeros(batch, H, T, dh) for _ in range(L)]
            V = [torch.zeros(batch, H, T, dh) for _ in range(L)]
            start = time.perf_counter()
            logits = forward(tokens, 0, K, V)
            for step in range(new):
                probs = torch.softmax(logits, -1)
                nxt = torch.multinomial(probs, 1, generator=gen)
                if step + 1 == new:
                    break
                logits = forward(nxt, prompt + step, K, V)
            elapsed = time.perf_counter() - start
            best = max(best, batch * new / elapsed)
    blas = [c for c in torch.__config__.show().splitlines() if "BLAS" in c]
    print(json.dumps({"tokens_per_s": best, "blas": blas[0].strip() if blas else "?"}))


if __name__ == "__main__":
    main()
