#!/usr/bin/env python3
"""Makes the Hugging Face fixtures libs/model's tests compare against (issue 21).

Run where transformers and tokenizers are installed (the GPU machine has transformers
5.17); CI only reads what this wrote, so it checks our code against transformers on a
machine without it:

  python3 libs/model/reference/make_hf_fixtures.py OUT_DIR

OUT_DIR/<arch>/ for each architecture (llama with llama3 rope scaling and GQA; qwen2
with q/k/v biases and tied embeddings; qwen3 with q/k RMSNorm and an explicit
head_dim):
  config.json, model.safetensors (or shards + model.safetensors.index.json for llama:
      the sharded layout), written by save_pretrained from a tiny random model whose
      every parameter (norms and biases too) is drawn so that a misplaced one shows;
  expected.safetensors: `input_ids` [2, 12] (I64), `logits` [2, 12, vocab] (F32, eager
      attention, CPU, fp32), `greedy` [2, 12 + 16] (I64): the inputs and 16 greedy
      tokens each (argmax of transformers' logits, one token at a time);
  config.v4.json: the same config in the older spelling (`rope_theta`, `rope_scaling`,
      `torch_dtype` at the top) that checkpoints made before transformers 5 carry.
OUT_DIR/tokenizer_<style>/ for two byte-level BPE tokenizers trained here with the
pre-tokenizers of Qwen2 (NFC, digits one by one) and Llama 3 (digits in threes,
ignore_merges): tokenizer.json and expected.json ({"cases": [{"text", "ids",
"decoded"}], "decode_cases": [{"ids", "decoded"}]}).
"""
import json
import os
import sys

import torch

OUT = sys.argv[1] if len(sys.argv) > 1 else "hf_fixtures"
VOCAB = 96


def perturb(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=g))


def model_fixture(arch, config, old_spelling, shard):
    import transformers
    from safetensors.torch import save_file

    cls = {
        "llama": transformers.LlamaForCausalLM,
        "qwen2": transformers.Qwen2ForCausalLM,
        "qwen3": transformers.Qwen3ForCausalLM,
    }[arch]
    torch.manual_seed(0)
    model = cls(config).eval()
    perturb(model, {"llama": 1, "qwen2": 2, "qwen3": 3}[arch])
    if config.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    d = os.path.join(OUT, arch)
    os.makedirs(d, exist_ok=True)
    if shard:
        model.save_pretrained(d, max_shard_size="60KB")
    else:
        model.save_pretrained(d)
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(3, VOCAB, (2, 12), generator=g)
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
        seq = ids.clone()
        for _ in range(16):
            nxt = model(input_ids=seq).logits[:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], 1)
    save_file({"input_ids": ids.contiguous(), "logits": logits.contiguous(), "greedy": seq.contiguous()},
              os.path.join(d, "expected.safetensors"))
    with open(os.path.join(d, "config.v4.json"), "w") as f:
        json.dump(old_spelling, f, indent=2, sort_keys=True)
    print(arch, "config.json:", open(os.path.join(d, "config.json")).read())
    print(arch, "files:", sorted(os.listdir(d)))
    print(arch, "logits[0,0,:4]:", logits[0, 0, :4].tolist(), "greedy[0]:", seq[0, 12:].tolist())


def models():
    import transformers

    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  hidden_act="silu", attn_implementation="eager")
    llama_rope = {"rope_type": "llama3", "rope_theta": 50000.0, "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
    llama = transformers.LlamaConfig(rms_norm_eps=1e-5, tie_word_embeddings=False, rope_parameters=llama_rope,
                                     **common)
    qwen2 = transformers.Qwen2Config(rms_norm_eps=1e-6, tie_word_embeddings=True,
                                     rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, **common)
    qwen3 = transformers.Qwen3Config(rms_norm_eps=1e-6, tie_word_embeddings=False, head_dim=24,
                                     rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, **common)
    base_v4 = {"vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 112, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
               "hidden_act": "silu", "torch_dtype": "float32", "transformers_version": "4.51.0"}
    model_fixture("llama", llama, dict(base_v4, model_type="llama", architectures=["LlamaForCausalLM"],
                                       rms_norm_eps=1e-5, tie_word_embeddings=False, rope_theta=50000.0,
                                       rope_scaling={k: v for k, v in llama_rope.items() if k != "rope_theta"}),
                  shard=True)
    model_fixture("qwen2", qwen2, dict(base_v4, model_type="qwen2", architectures=["Qwen2ForCausalLM"],
                                       rms_norm_eps=1e-6, tie_word_embeddings=True, rope_theta=1000000.0,
                                       use_sliding_window=False),
                  shard=False)
    model_fixture("qwen3", qwen3, dict(base_v4, model_type="qwen3", architectures=["Qwen3ForCausalLM"],
                                       rms_norm_eps=1e-6, tie_word_embeddings=False, rope_theta=1000000.0,
                                       head_dim=24, attention_bias=False),
                  shard=False)


CORPUS_EXTRA = [
    "The quick brown fox jumps over the lazy dog. I'LL say it's 12345 o'clock, don't you think?",
    "Qu'est-ce que c'est ? Déjà vu, naïve café, Zürich, São Paulo, smörgåsbord.",
    "中文分词测试，人工智能与强化学习。日本語のテキストも少し。한국어 문장도 있습니다.",
    "Emoji 🙂🚀👩‍💻 and symbols ∑ ∫ √ ≈ ≠ → ← and math: 3.14159 * 2 = 6.28318; 1,000,000.",
    "def f(x):\n    return x ** 2  # comment\n\n\n\tif x:\n\t\tpass\n",
    "<|im_start|>user\nWhat is 7 * 8?<|im_end|>\n<|im_start|>assistant\n56<|im_end|>",
]

TEXTS = [
    "",
    "Hello, world!",
    "   leading spaces and trailing   ",
    "runs\n\n\nof\n \n  newlines\r\n\r\nand\ttabs\t\t",
    "I'LL can't won't they're we've she'd He'S",
    "numbers 1 12 123 1234 12345678901234567890 3.14 -42 1e10",
    "Déjà vu: naïve café in Zürich — “quotes” ‘single’ … «guillemets»",
    "中文测试：强化学习，语言模型。日本語テキスト。한국어.",
    "emoji 🙂🚀👩‍💻🇫🇷 and ∑∫√≈≠→",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more text<|im_end|><|im_start|>",
    "unnormalized e\u0301 (e + combining acute) vs \u00e9",
    "a" * 40 + " " + "ab" * 20,
    "def f(x):\n    return x ** 2  # square\n",
    "    \n\n    ",
    "!!!???...,,,;;;",
]

QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")


def corpus():
    import glob
    texts = list(CORPUS_EXTRA) * 20
    for path in sorted(glob.glob(os.path.join(os.path.dirname(json.__file__), "*.py")))[:8]:
        with open(path, encoding="utf-8") as f:
            texts.append(f.read())
    return texts


def tokenizer_fixture(style):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE(ignore_merges=(style == "llama3")))
    if style == "qwen2":
        tok.normalizer = normalizers.NFC()
    split = QWEN2_SPLIT if style == "qwen2" else LLAMA3_SPLIT
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=900, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(), trainer=trainer)
    d = os.path.join(OUT, "tokenizer_" + style)
    os.makedirs(d, exist_ok=True)
    tok.save(os.path.join(d, "tokenizer.json"))
    cases = []
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False).ids
        cases.append({"text": text, "ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False)})
    # Decoding ids that do not form valid UTF-8 (one byte of a multi-byte character).
    vocab = tok.get_vocab()
    byte_tokens = [vocab[c] for c in pre_tokenizers.ByteLevel.alphabet() if c in vocab][:3]
    first_e4 = vocab.get("ä", None)  # byte 0xE4 in the byte-level alphabet
    decode_cases = []
    for ids in ([first_e4] if first_e4 is not None else [], byte_tokens, cases[7]["ids"][:3],
                cases[8]["ids"][1:4]):
        decode_cases.append({"ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False)})
    with open(os.path.join(d, "expected.json"), "w", encoding="utf-8") as f:
        json.dump({"cases": cases, "decode_cases": decode_cases}, f, ensure_ascii=False, indent=1)
    print("tokenizer", style, "vocab", tok.get_vocab_size(), "case 9 ids:", cases[9]["ids"][:12])


if __name__ == "__main__":
    import transformers
    import tokenizers
    print("transformers", transformers.__version__, "tokenizers", tokenizers.__version__, "torch", torch.__version__)
    models()
    tokenizer_fixture("qwen2")
    tokenizer_fixture("llama3")
