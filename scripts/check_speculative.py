#!/usr/bin/env python
"""Speculative decoding gives plain decoding's tokens: a wider check than the test suite's.

For each model, prompt and proposer, a greedy continuation of ``-n`` tokens with
speculation (every proposal verified: ``adaptive=False``, so the verification path runs as
often as the proposer allows) is compared token for token with plain decoding, and a
sampled one (temperature 0.8, three seeds) likewise.

    .venv/bin/python scripts/check_speculative.py [-m smollm2-135m,gemma3-270m] [-n 256]
        [--types ngram-simple,prompt-lookup,ngram-map-k,ngram-mod]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROMPTS = [
    "The following is a list of the largest cities in Europe by population:",
    "def quicksort(arr):\n",
    "Once upon a time, in a small village by the sea,",
    "Write the numbers from one to thirty in words: one, two, three,",
    "Le petit prince demanda au renard:",
    "SELECT name, age FROM users WHERE",
    "Q: What is the capital of France?\nA:",
    "Repeat after me three times: the quick brown fox jumps over the lazy dog.",
    "1. Preheat the oven.\n2.",
    "<html>\n<head>\n<title>",
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--models", default="smollm2-135m,gemma3-270m")
    ap.add_argument("-n", type=int, default=256)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--types", default="ngram-simple,prompt-lookup,ngram-map-k,ngram-mod")
    ap.add_argument("--prompts", default="", help="indices of the prompts to run (default: all)")
    args = ap.parse_args()
    from llamacpy.api import Llama
    from llamacpy.api.speculative import NgramMod, NgramSimple, Speculator, make_proposer

    def proposer(kind: str):
        # shorter look-ups than llama.cpp's defaults, so that short prompts get proposals
        if kind == "ngram-simple":
            return NgramSimple(size_n=3, size_m=16)
        if kind == "ngram-mod":
            return NgramMod(n_match=4, n_max=16, n_min=1)
        return make_proposer(kind)

    code = (ROOT / "src/llamacpy/api/generation.py").read_text()[:2500]
    prompts = [*PROMPTS, f"Copy this code:\n{code}\nCopy:\n{code[:200]}"]
    bad = total = 0
    for model in args.models.split(","):
        llm = Llama(model, n_ctx=2048, n_threads=args.threads, verbose=False)
        t0 = time.time()
        for i, prompt in enumerate(prompts):
            if args.prompts and str(i) not in args.prompts.split(","):
                continue
            runs = [(0.0, 0), (0.8, 1)]
            plain = {}
            for temp, seed in runs:
                llm._speculator = None
                llm.reset()  # (a cached prefix would re-decode the last prompt token alone)
                r = llm.create_completion(prompt, max_tokens=args.n, temperature=temp, seed=seed)
                plain[temp, seed] = r["choices"][0]["text"]
            for kind in args.types.split(","):
                for temp, seed in runs:
                    llm._speculator = sp = Speculator(proposer(kind), adaptive=False)
                    llm.reset()
                    r = llm.create_completion(prompt, max_tokens=args.n, temperature=temp,
                                              seed=seed)  # fmt: skip
                    same = r["choices"][0]["text"] == plain[temp, seed]
                    total += 1
                    bad += not same
                    st = sp.stats
                    if not same:
                        print(f"  DIFFERENT: {model} prompt {i} {kind} temp {temp} seed {seed}")
                    elif temp == 0:
                        print(f"  {model} prompt {i} {kind}: same ({st.n_accepted}/"
                              f"{st.n_drafted} proposals accepted)", flush=True)  # fmt: skip
        print(f"{model}: {time.time() - t0:.0f} s")
    print(f"{total - bad} of {total} generations identical to plain decoding")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
