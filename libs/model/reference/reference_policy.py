#!/usr/bin/python3
"""Reference implementation of libs/model/policy.cc in PyTorch (Debian's python3-torch).

Reads the same safetensors file (parsed here with json + struct, no extra packages),
runs the same architecture on the token rows given as JSON on stdin
({"config": {...}, "tokens": [[...], ...]}), and prints the logits as JSON
([batch][position][vocab]) on stdout. Used by policy_reference_test.
"""
import json
import math
import struct
import sys

import torch


DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def read_safetensors(path, dtypes=("F32",)):
    """The tensors of a safetensors file, as float32; each must be of one of `dtypes`."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    tensors = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        assert meta["dtype"] in dtypes, meta
        start, end = meta["data_offsets"]
        buf = bytearray(data[base + start:base + end])
        dtype = DTYPES[meta["dtype"]]
        t = torch.frombuffer(buf, dtype=dtype) if buf else torch.zeros(0, dtype=dtype)
        tensors[name] = t.reshape(meta["shape"]).to(torch.float32).clone()
    return tensors


def logits(w, cfg, tokens, pad=0):
    tokens = torch.tensor(tokens, dtype=torch.long)
    B, T = tokens.shape
    d, H = cfg["d_model"], cfg["n_heads"]
    dh = d // H
    # Position embeddings count real tokens only (left padding does not shift them).
    pos_ids = ((tokens != pad).long().cumsum(1) - 1).clamp(min=0)
    x = w["tok_emb.weight"][tokens] + w["pos_emb.weight"][pos_ids]
    pos = torch.arange(T)
    allowed = pos.unsqueeze(0) <= pos.unsqueeze(1)                     # [T, T]
    allowed = allowed.unsqueeze(0) & (tokens != pad).unsqueeze(1)       # [B, T, T]
    allowed = allowed | torch.eye(T, dtype=torch.bool).unsqueeze(0)
    bias = torch.zeros(B, 1, T, T).masked_fill(~allowed.unsqueeze(1), -1e9)

    def ln(h, prefix):
        return torch.nn.functional.layer_norm(h, (d,), w[prefix + ".weight"], w[prefix + ".bias"], 1e-5)

    def lin(h, prefix, bias=True):
        return torch.nn.functional.linear(h, w[prefix + ".weight"], w.get(prefix + ".bias") if bias else None)

    for l in range(cfg["n_layers"]):
        p = "blocks.%d." % l
        qkv = lin(ln(x, p + "ln1"), p + "qkv").view(B, T, 3, H, dh).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        att = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(dh) + bias, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, d)
        x = x + lin(y, p + "proj")
        x = x + lin(torch.nn.functional.gelu(lin(ln(x, p + "ln2"), p + "fc1")), p + "fc2")
    return lin(ln(x, "ln_f"), "lm_head", bias=False)


def main():
    request = json.load(sys.stdin)
    torch.set_num_threads(1)
    w = read_safetensors(request["weights"])
    out = logits(w, request["config"], request["tokens"])
    json.dump(out.tolist(), sys.stdout)


if __name__ == "__main__":
    main()
