"""Time to first token and streaming speed of the ``Llama`` facade, side by side with
llama-cpp-python (the oracle, run in its own interpreter) on the same model, prompt,
settings and thread count.

For each side: load once; then per repetition reset the cache, stream a completion of a
``--prompt-tokens``-token prompt and record the time to the first chunk (prompt processing
+ first sample + facade overhead) and the mean time per later token; then, with the cache
warm, a second request that extends the first (prefix reuse: only the new tokens are
decoded). Best of ``--repeat``. Ratios are llama-cpp-python's time over ours (above 1:
llamacpy is faster).

    .venv/bin/python benchmarks/bench_ttft.py [-m smollm2-135m] [-t 1] [-p 128] [-n 32]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from llamacpy.registry import resolve_model

ORACLE = "/root/oracle/py"

# runs in either interpreter: `Llama` comes from llama_cpp or llamacpy.api
SCRIPT = r"""
import json, sys, time
cfg = json.loads(sys.argv[1])
if cfg["side"] == "llama_cpp":
    from llama_cpp import Llama
    extra = {"flash_attn": True}
else:
    from llamacpy.api import Llama
    extra = {}
llm = Llama(cfg["model"], n_ctx=cfg["n_ctx"], n_threads=cfg["threads"],
            n_threads_batch=cfg["threads"], verbose=False, **extra)
words = "the quick brown fox jumps over the lazy dog and keeps running through the forest "
prompt = (words * 64)[: 4 * cfg["prompt_tokens"]]
ids = llm.tokenize(prompt.encode())[: cfg["prompt_tokens"]]
prompt = llm.detokenize(ids).decode()
out = {"ttft": [], "per_token": [], "reuse_ttft": []}
for _ in range(cfg["repeat"]):
    llm.reset()
    t0 = time.perf_counter()
    stamps = []
    for chunk in llm(prompt, max_tokens=cfg["n_gen"], temperature=0.0, stream=True):
        stamps.append(time.perf_counter())
    out["ttft"].append(stamps[0] - t0)
    out["per_token"].append((stamps[-2] - stamps[0]) / max(1, len(stamps) - 2))
    t0 = time.perf_counter()
    next(iter(llm(prompt + " and then", max_tokens=2, temperature=0.0, stream=True)))
    out["reuse_ttft"].append(time.perf_counter() - t0)
print(json.dumps(out))
"""


def run_side(side: str, cfg: dict) -> dict:
    exe = ORACLE if side == "llama_cpp" else sys.executable
    proc = subprocess.run([exe, "-c", SCRIPT, json.dumps({**cfg, "side": side})],
                          capture_output=True, text=True)  # fmt: skip
    if proc.returncode != 0:
        raise SystemExit(f"{side} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("-p", "--prompt-tokens", type=int, default=128)
    ap.add_argument("-n", "--n-gen", type=int, default=32)
    ap.add_argument("-r", "--repeat", type=int, default=3)
    args = ap.parse_args()
    cfg = {"model": str(resolve_model(args.model)), "n_ctx": 512, "threads": args.threads,
           "prompt_tokens": args.prompt_tokens, "n_gen": args.n_gen, "repeat": args.repeat}  # fmt: skip
    t0 = time.perf_counter()
    theirs = run_side("llama_cpp", cfg)
    ours = run_side("llamacpy", cfg)
    print(f"{args.model}, {args.prompt_tokens}-token prompt, {args.n_gen} tokens, "
          f"{args.threads} thread(s), best of {args.repeat} ({time.perf_counter() - t0:.0f} s)")  # fmt: skip
    print(f"{'metric':<26} {'llama-cpp-python':>17} {'llamacpy':>10} {'ratio':>7}")
    for key, label in (("ttft", "time to first token (ms)"), ("per_token", "ms per later token"),
                       ("reuse_ttft", "TTFT, reused prefix (ms)")):  # fmt: skip
        a, b = 1e3 * min(theirs[key]), 1e3 * min(ours[key])
        print(f"{label:<26} {a:>17.2f} {b:>10.2f} {a / b:>7.2f}")


if __name__ == "__main__":
    main()
