"""Sampling speed: µs per sample for llama.cpp's default chain, llamacpy vs llama.cpp.

    .venv/bin/python benchmarks/bench_sampling.py [--rows 32] [--no-models]

Default chain (penalties, dry, top-n-sigma, typical and xtc are disabled no-ops by
default): top-k 40 -> top-p 0.95 -> min-p 0.05 -> temperature 0.8 -> dist.

* synthetic: random logits (N(0, 2.5²)) at vocab 49152 and 262144. "ours" is
  ``SamplerChain.sample(row)`` (fill the candidates from the row + apply + accept);
  "ours chain" leaves the fill out, like llama.cpp's own sampler timer
  (``llama_perf_sampler``: apply + accept), which is the llama.cpp column.
* real: the last-position logits of SmolLM2-135M (49152) and Gemma-3-270M (262144) for
  a short prompt; llama.cpp runs ``llama_sampler_sample`` on its context (fill + apply +
  accept, plus one ctypes call) and we sample the same row.

llama.cpp runs in the llama-cpp-python oracle (``LLAMACPY_ORACLE_PY``, default
/root/oracle/py) in a subprocess; without it only our numbers are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from llamacpy.sampling import SamplingParams, TokenDataArray, build_sampler_chain
from llamacpy.sampling.candidates import Workspace

ORACLE_PY = os.environ.get("LLAMACPY_ORACLE_PY", "/root/oracle/py")
VOCABS = (49152, 262144)
MODELS = {49152: "smollm2-135m", 262144: "gemma3-270m"}
PROMPT = "The history of the city of Paris"

ORACLE_SCRIPT = r"""
import ctypes, json, sys, time
import numpy as np
import llama_cpp as L

cfg = json.loads(sys.argv[1])

def default_chain(n_vocab, seed):
    p = L.llama_sampler_chain_default_params()
    p.no_perf = False
    ch = L.llama_sampler_chain_init(p)
    for s in (
        L.llama_sampler_init_penalties(n_vocab, 64, 1.0, 0.0, 0.0),
        L.llama_sampler_init_dry(None, 0.0, 1.75, 2, 64, None, 0),
        L.llama_sampler_init_top_n_sigma(-1.0),
        L.llama_sampler_init_top_k(40),
        L.llama_sampler_init_typical(1.0, 0),
        L.llama_sampler_init_top_p(0.95, 0),
        L.llama_sampler_init_min_p(0.05, 0),
        L.llama_sampler_init_xtc(0.0, 0.1, 0, seed),
        L.llama_sampler_init_temp_ext(0.8, 0.0, 1.0),
        L.llama_sampler_init_dist(seed),
    ):
        L.llama_sampler_chain_add(ch, s)
    return ch

def best_per_sample(ch, fn, n_calls, reps):
    best_c, best_wall = 1e9, 1e9
    for _ in range(reps):
        L.llama_perf_sampler_reset(ch)
        t0 = time.perf_counter()
        fn()
        wall = (time.perf_counter() - t0) / n_calls * 1e6
        perf = L.llama_perf_sampler(ch)
        best_c = min(best_c, perf.t_sample_ms * 1e3 / max(perf.n_sample, 1))
        best_wall = min(best_wall, wall)
    return best_c, best_wall

out = {"synthetic": {}, "real": {}}
dt = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
for n in cfg["vocabs"]:
    rng = np.random.default_rng(0)
    rows = [(rng.standard_normal(n) * 2.5).astype(np.float32) for _ in range(cfg["rows"])]
    ch = default_chain(n, 1)
    bufs = []
    for r in rows:
        b = np.zeros(n, dt); b["id"] = np.arange(n); b["logit"] = r; bufs.append(b)
    work = np.zeros(n, dt)
    ptr = ctypes.cast(work.ctypes.data, ctypes.POINTER(L.llama_token_data))
    def run():
        for b in bufs:
            work[...] = b  # the refill is outside llama.cpp's timer
            cp = L.llama_token_data_array(ptr, n, -1, False)
            L.llama_sampler_apply(ch, ctypes.byref(cp))
            L.llama_sampler_accept(ch, int(work["id"][cp.selected]))
    out["synthetic"][str(n)] = best_per_sample(ch, run, len(bufs), cfg["reps"])[0]

for n, path in cfg["models"].items():
    mp = L.llama_model_default_params()
    model = L.llama_model_load_from_file(path.encode(), mp)
    vocab = L.llama_model_get_vocab(model)
    cp = L.llama_context_default_params(); cp.n_ctx = 256; cp.n_threads = 2; cp.n_threads_batch = 2
    ctx = L.llama_init_from_model(model, cp)
    text = cfg["prompt"].encode()
    toks = (L.llama_token * 64)(); k = L.llama_tokenize(vocab, text, len(text), toks, 64, True, True)
    L.llama_decode(ctx, L.llama_batch_get_one(toks, k))
    row = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), shape=(int(n),)).copy()
    np.save(cfg["rows_out"] + f"_{n}.npy", row)
    ch = default_chain(int(n), 1)
    calls = cfg["rows"]
    def run():
        for _ in range(calls):
            L.llama_sampler_sample(ch, ctx, -1)
    c, wall = best_per_sample(ch, run, calls, cfg["reps"])
    out["real"][n] = {"chain": c, "sample_wall": wall}
    L.llama_free(ctx); L.llama_model_free(model)
print(json.dumps(out))
"""


def best_us(fn, items, reps: int) -> float:
    for x in items[:3]:
        fn(x)
    best = 1e9
    for _ in range(reps):
        t0 = time.perf_counter()
        for x in items:
            fn(x)
        best = min(best, (time.perf_counter() - t0) / len(items) * 1e6)
    return best


def ours(rows: list[np.ndarray], n: int, reps: int) -> tuple[float, float]:
    """(µs per chain.sample, µs for apply + accept only)."""
    chain = build_sampler_chain(SamplingParams(seed=1), n)
    total = best_us(chain.sample, rows, reps)
    ws = Workspace()
    prepared = []

    def chain_only(row: np.ndarray) -> None:
        cur = TokenDataArray.from_logits(row, ws)  # refill outside the timed part
        t0 = time.perf_counter()
        chain.apply(cur)
        chain.accept(int(cur.id[cur.selected]))
        prepared.append(time.perf_counter() - t0)

    best = 1e9
    for _ in range(reps):
        prepared.clear()
        for r in rows:
            chain_only(r)
        best = min(best, sum(prepared) / len(prepared) * 1e6)
    return total, best


def model_paths() -> dict[int, str]:
    try:
        from llamacpy.registry import ModelRegistry

        reg = ModelRegistry.from_environment()
        return {n: str(reg.pull(name, quiet=True)) for n, name in MODELS.items()}
    except Exception as e:  # benchmarks degrade gracefully without models
        print(f"(no real-model rows: {e})", file=sys.stderr)
        return {}


def oracle(rows: int, reps: int, models: dict[int, str], rows_out: str) -> dict | None:
    if not Path(ORACLE_PY).exists():
        return None
    cfg = {"vocabs": list(VOCABS), "rows": rows, "reps": reps, "prompt": PROMPT,
           "models": {str(n): p for n, p in models.items()}, "rows_out": rows_out}  # fmt: skip
    res = subprocess.run(
        [ORACLE_PY, "-c", ORACLE_SCRIPT, json.dumps(cfg)], capture_output=True, text=True
    )
    if res.returncode != 0:
        print(res.stderr[-2000:], file=sys.stderr)
        return None
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--no-models", action="store_true")
    args = ap.parse_args()
    models = {} if args.no_models else model_paths()
    with tempfile.TemporaryDirectory() as tmp:
        ref = oracle(args.rows, args.reps, models, os.path.join(tmp, "row"))
        print(
            f"{'logits':10s} {'n_vocab':>8s} {'ours':>10s} {'ours chain':>11s} {'llama.cpp':>10s}  ratio"
        )
        for n in VOCABS:
            rng = np.random.default_rng(0)
            rows = [(rng.standard_normal(n) * 2.5).astype(np.float32) for _ in range(args.rows)]
            total, chain = ours(rows, n, args.reps)
            lc = ref["synthetic"][str(n)] if ref else None
            ratio = f"{chain / lc:5.2f}x (chain/chain)" if lc else ""
            lcs = f"{lc:8.1f}us" if lc else "       n/a"
            print(f"{'synthetic':10s} {n:8d} {total:8.1f}us {chain:9.1f}us {lcs}  {ratio}")
        for n in models:
            path = os.path.join(tmp, f"row_{n}.npy")
            if not ref or not os.path.exists(path):
                continue
            row = np.load(path)
            total, chain = ours([row] * args.rows, n, args.reps)
            r = ref["real"][str(n)]
            print(
                f"{'real':10s} {n:8d} {total:8.1f}us {chain:9.1f}us {r['sample_wall']:8.1f}us  "
                f"{total / r['sample_wall']:5.2f}x (sample/llama_sampler_sample; llama.cpp "
                f"chain alone {r['chain']:.1f}us)"
            )


if __name__ == "__main__":
    main()
