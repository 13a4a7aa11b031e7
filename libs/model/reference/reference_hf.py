#!/usr/bin/python3
"""Reference forward pass of the Llama family (llama, qwen2, qwen3) in plain PyTorch.

Written from the architectures' definitions, not from libs/model/policy.cc, and runs on
Debian's python3-torch (1.13) with no other package (the safetensors reader is
reference_policy.py's): it reads a Hugging Face model directory (config.json in
transformers 4's or 5's spelling; model.safetensors or the shards of
model.safetensors.index.json; F32 / BF16 / F16), computes the logits of the token rows
given on stdin, and continues each row greedily without a KV cache.

stdin:  {"dir": DIR, "tokens": [[...], ...], "pad": 0 or null, "greedy": N}
        Rows have equal length; with "pad", that id in them is padding (left padding:
        masked as a key, and positions count real tokens only, as transformers does when
        given attention_mask and position_ids = cumsum(mask) - 1); generated tokens are
        real whatever their id.
stdout: {"logits": [batch][position][vocab], "greedy": [batch][N]}
Used by libs/model/tests:hf_reference_test.
"""
import json
import math
import os
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from reference_policy import read_safetensors  # noqa: E402

WEIGHT_DTYPES = ("F32", "BF16", "F16")


def read_weights(directory):
    index = os.path.join(directory, "model.safetensors.index.json")
    if not os.path.exists(index):
        return read_safetensors(os.path.join(directory, "model.safetensors"), WEIGHT_DTYPES)
    with open(index) as f:
        shards = sorted(set(json.load(f)["weight_map"].values()))
    tensors = {}
    for shard in shards:
        tensors.update(read_safetensors(os.path.join(directory, shard), WEIGHT_DTYPES))
    return tensors


class Config:
    def __init__(self, directory):
        with open(os.path.join(directory, "config.json")) as f:
            c = json.load(f)
        self.arch = c["model_type"]
        assert self.arch in ("llama", "qwen2", "qwen3"), self.arch
        self.d = c["hidden_size"]
        self.layers = c["num_hidden_layers"]
        self.heads = c["num_attention_heads"]
        self.kv_heads = c.get("num_key_value_heads") or self.heads
        default_head_dim = 128 if self.arch == "qwen3" else self.d // self.heads
        self.head_dim = c.get("head_dim") or default_head_dim
        self.eps = c.get("rms_norm_eps", 1e-6)
        self.tied = c.get("tie_word_embeddings", False)
        self.qk_norm = self.arch == "qwen3"
        # rope: transformers 5's rope_parameters, else 4's rope_theta + rope_scaling.
        rope = c.get("rope_parameters")
        if rope is None:
            rope = dict(c.get("rope_scaling") or {})
            rope["rope_theta"] = c.get("rope_theta", 10000.0)
        self.theta = rope.get("rope_theta", 10000.0)
        self.rope_type = rope.get("rope_type", rope.get("type", "default"))
        assert self.rope_type in ("default", "llama3"), self.rope_type
        self.rope = rope


def inverse_frequencies(cfg):
    dim = cfg.head_dim
    inv = 1.0 / (cfg.theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if cfg.rope_type != "llama3":
        return inv
    # Llama 3.1's scaling: long wavelengths divided by `factor`, short ones kept, a
    # smooth interpolation between the two bands.
    factor = cfg.rope["factor"]
    low, high = cfg.rope["low_freq_factor"], cfg.rope["high_freq_factor"]
    old = cfg.rope["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / low, old / high
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rms_norm(x, weight, eps):
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def logits(w, cfg, tokens, real):
    """`real`: [B, T] bool, False where a row is padded."""
    B, T = tokens.shape
    H, KV, hd = cfg.heads, cfg.kv_heads, cfg.head_dim
    positions = (real.long().cumsum(1) - 1).clamp(min=0)
    angles = positions.unsqueeze(-1).float() * inverse_frequencies(cfg)  # [B, T, hd/2]
    angles = torch.cat((angles, angles), dim=-1)
    cos, sin = angles.cos().unsqueeze(1), angles.sin().unsqueeze(1)  # [B, 1, T, hd]
    causal = torch.arange(T).unsqueeze(0) <= torch.arange(T).unsqueeze(1)  # [T(query), T(key)]
    allowed = (causal.unsqueeze(0) & real.unsqueeze(1)) | torch.eye(T, dtype=torch.bool).unsqueeze(0)
    bias = torch.zeros(B, 1, T, T).masked_fill(~allowed.unsqueeze(1), float("-inf"))

    def lin(h, name):
        return torch.nn.functional.linear(h, w[name + ".weight"], w.get(name + ".bias"))

    x = w["model.embed_tokens.weight"][tokens]
    for l in range(cfg.layers):
        p = "model.layers.%d." % l
        h = rms_norm(x, w[p + "input_layernorm.weight"], cfg.eps)
        q = lin(h, p + "self_attn.q_proj").view(B, T, H, hd)
        k = lin(h, p + "self_attn.k_proj").view(B, T, KV, hd)
        v = lin(h, p + "self_attn.v_proj").view(B, T, KV, hd).transpose(1, 2)
        if cfg.qk_norm:
            q = rms_norm(q, w[p + "self_attn.q_norm.weight"], cfg.eps)
            k = rms_norm(k, w[p + "self_attn.k_norm.weight"], cfg.eps)
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # [B, heads, T, hd]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(H // KV, dim=1)
        v = v.repeat_interleave(H // KV, dim=1)
        att = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(hd) + bias, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, H * hd)
        x = x + lin(y, p + "self_attn.o_proj")
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], cfg.eps)
        gate, up = lin(h, p + "mlp.gate_proj"), lin(h, p + "mlp.up_proj")
        x = x + lin(torch.nn.functional.silu(gate) * up, p + "mlp.down_proj")
    x = rms_norm(x, w["model.norm.weight"], cfg.eps)
    head = w["model.embed_tokens.weight"] if cfg.tied else w["lm_head.weight"]
    return x @ head.t()


def main():
    request = json.load(sys.stdin)
    torch.set_num_threads(1)
    cfg = Config(request["dir"])
    w = read_weights(request["dir"])
    pad = request.get("pad")
    tokens = torch.tensor(request["tokens"], dtype=torch.long)
    real = tokens != pad if pad is not None else torch.ones_like(tokens, dtype=torch.bool)
    with torch.no_grad():
        out = logits(w, cfg, tokens, real)
        rows = tokens
        greedy = []
        for _ in range(request.get("greedy", 0)):  # (a generated token is real, whatever its id)
            nxt = logits(w, cfg, rows, real)[:, -1].argmax(-1)
            greedy.append(nxt)
            rows = torch.cat((rows, nxt.unsqueeze(1)), dim=1)
            real = torch.cat((real, torch.ones_like(nxt, dtype=torch.bool).unsqueeze(1)), dim=1)
    greedy = torch.stack(greedy, 1).tolist() if greedy else [[] for _ in range(tokens.shape[0])]
    json.dump({"logits": out.tolist(), "greedy": greedy}, sys.stdout)


if __name__ == "__main__":
    main()
