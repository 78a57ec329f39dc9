#!/usr/bin/env python
"""Produce the gemma3 test fixtures with llama.cpp (the oracle; dev-only).

Run from the repository root with the project's venv::

    .venv/bin/python scripts/make_gemma3_fixtures.py [--oracle-py /root/oracle/py]
        [--bin /root/oracle/.../build/bin]

Writes into ``tests/fixtures/engine/``:

* ``gemma3_text.txt``: ``text.txt`` followed by the GPL-3 text (enough tokens for
  ``N_CHUNK_512`` chunks of 512 tokens);
* ``gemma3.npz`` + ``gemma3.json``: Gemma-3-270M on that text split as ``llama-perplexity``
  does (each chunk starts with BOS, the second half is scored) at a context of 512
  (``N_CHUNK_512`` chunks, >= 2,000 scored tokens) and of 1024 (``N_CHUNK_1024`` chunks: every
  scored token lies past the 512-token sliding window), with llama.cpp's top-1 token at
  every position, the log-probability of each scored next token and the perplexity (binding
  and ``llama-perplexity --chunks``); and greedy 64-token continuations of the 5 prompts of
  ``make_engine_fixtures.py`` (checked against ``llama-completion --temp 0``) with a slice
  of the first logits;
* under ``"self"`` in ``gemma3.json``: how far llama.cpp moves from those results when only
  the summation order of its Q4_K matmuls changes (weights not repacked, ``use_extra_bufts =
  False``): top-1 agreement, perplexities, identical greedy continuations. This model is
  sensitive enough to rounding that these bound what an implementation that does not
  reproduce ggml's K-quant summation order bit for bit can reach.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from make_engine_fixtures import (  # noqa: E402
    DEFAULT_BIN,
    GREEDY_CODE,
    N_GREEDY,
    PROMPTS,
    oracle,
    run_bin,
)

FIX = ROOT / "tests" / "fixtures" / "engine"
GEMMA3 = Path.home() / ".cache" / "llamacpy" / "models" / "gemma-3-270m-q4_k_m.gguf"
GPL3 = Path("/usr/share/common-licenses/GPL-3")
N_CHUNK_512 = 8
N_CHUNK_1024 = 2

_CODE = (
    """
import json, math, numpy as np
import llama_cpp
from llama_cpp import Llama
MODEL, TEXT, RUNS, PROMPTS, N_GEN = {model!r}, {text!r}, {runs!r}, {prompts!r}, {n_gen}
if not {repack!r}:  # weights in their file layout: the plain vec_dot kernels for Q4_K too
    _defaults = llama_cpp.llama_model_default_params
    def _no_repack():
        p = _defaults()
        p.use_extra_bufts = False
        return p
    llama_cpp.llama_model_default_params = _no_repack
    llama_cpp.llama_cpp.llama_model_default_params = _no_repack  # what Llama() calls
res = {{}}
for n_ctx, n_chunk in RUNS:
    m = Llama(MODEL, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=512, logits_all=True,
              verbose=False, flash_attn=True, n_threads=2)
    bos = m.token_bos()
    toks = m.tokenize(open(TEXT, "rb").read(), add_bos=True, special=False)
    assert len(toks) >= n_chunk * n_ctx, (len(toks), n_chunk * n_ctx)
    first = n_ctx // 2
    chunks, top1, logp = [], [], []
    nll, cnt = 0.0, 0
    for c in range(n_chunk):
        chunk = list(toks[c * n_ctx:(c + 1) * n_ctx])
        chunk[0] = bos  # llama-perplexity starts every chunk with BOS
        m.reset()
        m.eval(chunk)
        lg = np.array(m.scores[:n_ctx], dtype=np.float32)
        chunks.append(chunk)
        top1.append(lg.argmax(-1).tolist())
        row = []
        for i in range(first, n_ctx - 1):
            x = lg[i].astype(np.float64)
            mx = x.max()
            lp = x[chunk[i + 1]] - mx - math.log(np.exp(x - mx).sum())
            row.append(lp); nll -= lp; cnt += 1
        logp.append(row)
    res[str(n_ctx)] = {{"tokens": chunks, "top1": top1, "logp": logp,
                       "ppl": math.exp(nll / cnt)}}
    del m
add_bos = True
"""
    + GREEDY_CODE
    + """res["greedy"] = greedy
res["bos"] = g.token_bos()
print(json.dumps(res))
"""
)


def write_text() -> Path:
    path = FIX / "gemma3_text.txt"
    text = (FIX / "text.txt").read_text() + "\n\n" + GPL3.read_text()
    path.write_text(text[:24000])
    return path


def perplexity_bin(bin_dir: str, text: Path, n_ctx: int, n_chunk: int) -> float:
    log = run_bin(
        bin_dir,
        "llama-perplexity",
        "-m",
        str(GEMMA3),
        "-f",
        str(text),
        "-c",
        str(n_ctx),
        "-b",
        str(n_ctx),
        "--chunks",
        str(n_chunk),
        "-t",
        "2",
    )
    m = re.search(r"Final estimate: PPL = ([0-9.]+)", log)
    return float(m.group(1)) if m else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--oracle-py", default="/root/oracle/py")
    ap.add_argument("--bin", default=DEFAULT_BIN, help="llama.cpp tools directory")
    a = ap.parse_args()
    text = write_text()
    runs = [(512, N_CHUNK_512), (1024, N_CHUNK_1024)]

    def run(repack: bool) -> dict:
        code = _CODE.format(
            model=str(GEMMA3),
            text=str(text),
            runs=runs,
            prompts=PROMPTS,
            n_gen=N_GREEDY,
            repack=repack,
        )
        return oracle(a.oracle_py, code)

    res, other = run(True), run(False)
    meta: dict = {"model": GEMMA3.name, "bos": res["bos"], "perplexity": {}}
    arrays: dict[str, np.ndarray] = {}
    for n_ctx, n_chunk in runs:
        r = res[str(n_ctx)]
        ppl_bin = perplexity_bin(a.bin, text, n_ctx, n_chunk)
        print(f"n_ctx {n_ctx}: perplexity binding {r['ppl']:.4f}, llama-perplexity {ppl_bin:.4f}")
        meta["perplexity"][str(n_ctx)] = {
            "n_chunk": n_chunk,
            "ppl_binding": r["ppl"],
            "ppl_llama_perplexity": ppl_bin,
        }
        arrays[f"tokens_{n_ctx}"] = np.array(r["tokens"], np.int32)
        arrays[f"top1_{n_ctx}"] = np.array(r["top1"], np.int32)
        arrays[f"logp_{n_ctx}"] = np.array(r["logp"], np.float64)
    for g in res["greedy"]:
        out = run_bin(
            a.bin,
            "llama-completion",
            "-m",
            str(GEMMA3),
            "-p",
            g["prompt"],
            "-n",
            str(N_GREEDY),
            "--temp",
            "0",
            "-t",
            "2",
            "-no-cnv",
            "--ignore-eos",
            "--no-display-prompt",
            "--no-warmup",
            stdout_only=True,
        )
        g["completion_matches"] = bool(g["text"]) and out.startswith(g["text"])
        print(f"greedy {g['prompt']!r}: completion matches binding: {g['completion_matches']}")
    arrays["logits_head"] = np.array([g["logits_head"] for g in res["greedy"]], np.float32)
    meta["greedy"] = [
        {k: g[k] for k in ("prompt", "ids", "out", "text", "completion_matches")}
        for g in res["greedy"]
    ]
    meta["self"] = {
        "what": "llama.cpp without weight repacking vs with (the reference)",
        **{
            f"top1_agreement_{n}": float(
                np.mean(np.array(other[str(n)]["top1"]) == np.array(res[str(n)]["top1"]))
            )
            for n, _ in runs
        },
        **{f"ppl_binding_{n}": other[str(n)]["ppl"] for n, _ in runs},
        "greedy_identical": sum(
            x["out"] == y["out"] for x, y in zip(other["greedy"], res["greedy"])
        ),
    }
    print(f"self: {meta['self']}")
    for n, _ in runs:
        arrays[f"top1_self_{n}"] = np.array(other[str(n)]["top1"], np.int32)
    np.savez_compressed(FIX / "gemma3.npz", **arrays)
    (FIX / "gemma3.json").write_text(json.dumps(meta, indent=1) + "\n")


if __name__ == "__main__":
    main()
