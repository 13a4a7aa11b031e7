#!/usr/bin/env python3
"""Loads what rlfleet wrote (export_trained, or a trainer's checkpoint with an
rlfleet_expected.json beside it) with transformers' AutoModelForCausalLM.from_pretrained
and checks that transformers computes rlfleet's logits (within 1e-4) and greedy tokens.

    python3 check_from_pretrained.py DIR [DIR ...]     (on a machine with transformers)

Prints one line per directory and `from_pretrained: N passed, M failed`; exits 1 on a
failure.
"""
import json
import sys

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def check(directory):
    with open(directory + "/rlfleet_expected.json") as f:
        expected = json.load(f)
    config = AutoConfig.from_pretrained(directory)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    ids = torch.tensor(expected["input_ids"], dtype=torch.long)
    with torch.no_grad():
        logits = model(input_ids=ids).logits
        greedy = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=16,
                                min_new_tokens=16, eos_token_id=None, pad_token_id=0)[:, ids.shape[1]:]
    ours = torch.tensor(expected["logits"], dtype=torch.float32).reshape(logits.shape)
    diff = (logits - ours).abs().max().item()
    same = greedy.tolist() == expected["greedy"]
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    ok = diff < 1e-4 and same
    print("%s %s: %s, max |logit diff| %.2e, greedy tokens %s, rope %s, max_position_embeddings %s" %
          ("PASS" if ok else "FAIL", directory, type(model).__name__, diff, "same" if same else "DIFFER", rope,
           config.max_position_embeddings))
    return ok


def main():
    results = []
    for directory in sys.argv[1:]:
        try:
            results.append(check(directory))
        except Exception as e:  # a directory transformers cannot load is a failure, named
            print("FAIL %s: %s: %s" % (directory, type(e).__name__, e))
            results.append(False)
    print("from_pretrained: %d passed, %d failed" % (results.count(True), results.count(False)))
    sys.exit(0 if results and all(results) else 1)


if __name__ == "__main__":
    main()
