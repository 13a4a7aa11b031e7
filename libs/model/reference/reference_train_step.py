#!/usr/bin/env python3
"""PyTorch-eager reference of Policy::TrainStep, for bench/train_step and
policy_reference_test: the same model (weights read from the
safetensors file the C++ side wrote), the same batch shape and the same GRPO/PPO step
as Policy::TrainStep (clipped surrogate with per-sequence advantages, entropy bonus,
AdamW, global gradient-norm clipping at 1.0, and the step's statistics read back as a
trainer reports them), written the plain way in PyTorch. Prints tokens/s as JSON.

  reference_train_step.py WEIGHTS D_MODEL N_LAYERS N_HEADS VOCAB BATCH PROMPT RESPONSE STEPS DEVICE PRECISION
      [check=OUT.safetensors lr=LR eps=EPS clip=MAX_NORM]

With check=: one step (no timing) on the tokens 4 + (7 b + 3 i) % (VOCAB - 4) with AdamW's
learning rate LR and epsilon EPS and the gradient clipped to MAX_NORM, and the weights
after it written to OUT (policy_reference_test compares them with Policy::TrainStep's).
"""
import json
import math
import struct
import sys
import time

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from reference_policy import read_safetensors  # noqa: E402


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        data = tensors[name].detach().float().cpu().contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def main():
    (weights, d, L, H, vocab, batch, prompt, response, steps, device, precision) = sys.argv[1:12]
    d, L, H, vocab, B, P, R, steps = map(int, (d, L, H, vocab, batch, prompt, response, steps))
    extra = dict(a.split("=", 1) for a in sys.argv[12:])
    dh = d // H
    w = {k: v.to(device).requires_grad_() for k, v in read_safetensors(weights).items()}
    params = list(w.values())
    opt = torch.optim.AdamW(params, lr=float(extra.get("lr", 1e-5)), eps=float(extra.get("eps", 1e-8)),
                            weight_decay=0.0)
    grad_clip = float(extra.get("clip", 1.0))
    if "check" in extra:
        tokens = torch.tensor([[4 + (7 * b + 3 * i) % (vocab - 4) for i in range(P + R)] for b in range(B)],
                              device=device)
    else:
        gen = torch.Generator().manual_seed(0)
        tokens = torch.randint(4, vocab, (B, P + R), generator=gen).to(device)
    targets = tokens[:, P:]
    old_lp = torch.full((B, R), -3.0, device=device)
    adv = torch.tensor([1.0 if i % 2 else -0.5 for i in range(B)], device=device).unsqueeze(1).expand(B, R)
    mask = torch.ones(B, R, device=device)
    T = P + R
    pos = torch.arange(T, device=device)
    allowed = (pos.unsqueeze(0) <= pos.unsqueeze(1)).unsqueeze(0) & (tokens != 0).unsqueeze(1)
    allowed = allowed | torch.eye(T, dtype=torch.bool, device=device).unsqueeze(0)

    def ln(h, p):
        return torch.nn.functional.layer_norm(h, (d,), w[p + ".weight"], w[p + ".bias"], 1e-5)

    def lin(h, p, bias=True):
        return torch.nn.functional.linear(h, w[p + ".weight"], w.get(p + ".bias") if bias else None)

    def forward():
        pos_ids = ((tokens != 0).long().cumsum(1) - 1).clamp(min=0)
        x = w["tok_emb.weight"][tokens] + w["pos_emb.weight"][pos_ids]
        bias = torch.zeros(B, 1, T, T, device=device, dtype=x.dtype).masked_fill(~allowed.unsqueeze(1), -1e9)
        for l in range(L):
            p = "blocks.%d." % l
            qkv = lin(ln(x, p + "ln1"), p + "qkv").view(B, T, 3, H, dh).permute(2, 0, 3, 1, 4)
            att = torch.softmax(qkv[0] @ qkv[1].transpose(-2, -1) / math.sqrt(dh) + bias, dim=-1)
            y = (att @ qkv[2]).transpose(1, 2).reshape(B, T, d)
            x = x + lin(y, p + "proj")
            x = x + lin(torch.nn.functional.gelu(lin(ln(x, p + "ln2"), p + "fc1")), p + "fc2")
        return lin(ln(x, "ln_f"), "lm_head", bias=False)

    def masked_mean(x):
        return (x * mask).sum() / mask.sum()

    def step():
        opt.zero_grad()
        with torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16, enabled=precision == "bf16"):
            logits = forward()
        all_lp = torch.log_softmax(logits.float()[:, P - 1:P - 1 + R], -1)
        lp = all_lp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        entropy = -(all_lp.exp() * all_lp).sum(-1)
        ratio = torch.exp(lp - old_lp)
        unclipped, clipped = ratio * adv, torch.clamp(ratio, 0.8, 1.2) * adv
        policy = masked_mean(-torch.min(unclipped, clipped))
        loss = policy - 0.01 * masked_mean(entropy)
        stats = [loss.item()]
        loss.backward()
        stats += [policy.item(), masked_mean((unclipped > clipped).float()).item(),
                  masked_mean((old_lp - lp).detach()).item(), masked_mean(entropy).item()]
        stats.append(float(torch.nn.utils.clip_grad_norm_(params, grad_clip)))
        opt.step()
        return stats

    if "check" in extra:
        step()
        write_safetensors(extra["check"], w)
        print(json.dumps({"checked": extra["check"]}))
        return
    step()  # warm-up
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    best = 0.0
    for _ in range(steps):
        start = time.perf_counter()
        step()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        best = max(best, B * R / (time.perf_counter() - start))
    print(json.dumps({"tokens_per_s": best, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
