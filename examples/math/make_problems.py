#!/usr/bin/env python3
"""Writes a JSONL of arithmetic word problems for `rlfleet run --dataset` (issue 21's
example): one object per line, {"question": ..., "answer": "... #### N"}, the answer in
GSM8K's form, which the reward service's `math_exact` reads.

  python3 examples/math/make_problems.py OUT.jsonl [--count 300] [--max_value 4] [--seed 1]
"""
import argparse
import json
import random

TEMPLATES = [
    ("{name} has {a} apples and buys {b} more. How many apples does {name} have now?", lambda a, b: a + b),
    ("{name} had {s} marbles and gave {b} away. How many marbles are left?", lambda s, b: s - b),
    ("A box holds {a} pens. How many pens are in {b} boxes?", lambda a, b: a * b),
    ("{name} reads {a} pages on Monday and {b} pages on Tuesday. How many pages in all?", lambda a, b: a + b),
]
NAMES = ["Tom", "Ana", "Li", "Sam", "Eva", "Raj"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--count", type=int, default=300)
    ap.add_argument("--max_value", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    with open(args.out, "w") as f:
        for _ in range(args.count):
            text, solve = rng.choice(TEMPLATES)
            a, b = rng.randint(1, args.max_value), rng.randint(1, args.max_value)
            s = a + b  # (a subtraction's start: never negative)
            question = text.format(name=rng.choice(NAMES), a=a, b=b, s=s)
            answer = solve(s, b) if "{s}" in text else solve(a, b)
            f.write(json.dumps({"question": question + " Answer with a number.",
                                "answer": "%d #### %d" % (answer, answer)}) + "\n")


if __name__ == "__main__":
    main()
