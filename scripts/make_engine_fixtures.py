#!/usr/bin/env python
"""Produce the engine's test fixtures with llama.cpp (the oracle; dev-only).

Run from the repository root with the project's venv::

    .venv/bin/python scripts/make_engine_fixtures.py [--oracle-py /root/oracle/py/bin/python]
        [--bin /root/oracle/.../build/bin] [--only tiny|smollm2] [--tiny-cases MXFP4,...]

Writes into ``tests/fixtures/engine/``:

* ``tiny_logits.npz``: for every weight format, logits of llama.cpp on a tiny random llama
  model (``llamacpy.models.tiny``, seed 1; the tests rebuild the same file) and its sha256,
  for the grid formats also at ubatch 1 (``<format>_logits_ub1``); each is computed with 1
  and 2 threads and a difference between the two is reported
  (``--tiny-cases``: only those cases, e.g. a new format, merged into the existing file);
* ``smollm2.npz`` + ``smollm2.json``: SmolLM2 on ``text.txt`` split as ``llama-perplexity
  -c 512 -b 512`` does: token ids, llama.cpp's top-1 token at every position, the
  log-probability of each next token in the scored halves, the perplexity (also from the
  ``llama-perplexity`` binary), and greedy 64-token continuations of 5 prompts (token ids
  in and out, checked against ``llama-completion --temp 0``) with a logits slice.

The oracle runs in a subprocess (``--oracle-py``, the llama-cpp-python interpreter); the
tests never need it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from llamacpy.gguf import GGMLType  # noqa: E402
from llamacpy.models.tiny import write_tiny_llama  # noqa: E402
from llamacpy.ops.traits import supported_types  # noqa: E402

FIX = ROOT / "tests" / "fixtures" / "engine"
SMOLLM2 = Path.home() / ".cache" / "llamacpy" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_BIN = "/root/oracle/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin"
TINY_TOKENS = [1, 50, 72, 101, 108, 108, 111, 33, 200, 3]
TINY_SEED = 1
N_CTX_PPL = 512
PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):",
    "The three primary colors are",
    "Water boils at a temperature of",
]
N_GREEDY = 64


def oracle(py: str, code: str) -> dict:
    """Run ``code`` with the oracle interpreter; it prints one JSON object last."""
    r = subprocess.run([py, "-c", code], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"oracle failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


TINY_ROPES = ("linear", "yarn", "llama3")  # rope variants, on Q8_0 models
# formats whose kernels differ by token count in llama.cpp (single-token vec_dot, batched
# tiled kernels from 8 tokens): their ubatch-1 logits are fixtures too (``<name>_logits_ub1``)
UB1_TYPES = (
    GGMLType.IQ2_XXS,
    GGMLType.IQ2_XS,
    GGMLType.IQ2_S,
    GGMLType.IQ3_XXS,
    GGMLType.IQ3_S,
    GGMLType.IQ1_S,
    GGMLType.IQ1_M,
    GGMLType.TQ1_0,
    GGMLType.TQ2_0,
    GGMLType.NVFP4,  # (vec_dot at every token count, as TQ: checked at ubatch 1 too)
    GGMLType.Q1_0,
    GGMLType.Q2_0,
)


def make_tiny(py: str, only: set[str] | None = None) -> None:
    """Every case, or the cases named in ``only`` added to (or replaced in) the current file."""
    out: dict[str, np.ndarray] = {"tokens": np.array(TINY_TOKENS, np.int32)}
    cases = [(t.name, t, "none") for t in supported_types()]
    cases += [(f"rope_{r}", GGMLType.Q8_0, r) for r in TINY_ROPES]
    if only:
        unknown = only - {name for name, _, _ in cases}
        if unknown:
            raise SystemExit(f"unknown tiny cases: {', '.join(sorted(unknown))}")
        with np.load(FIX / "tiny_logits.npz") as old:
            out = {k: old[k] for k in old.files} | out
        cases = [c for c in cases if c[0] in only]
    with tempfile.TemporaryDirectory() as tmp:
        for name, t, rope in cases:
            path = Path(tmp) / f"tiny_{name}.gguf"
            write_tiny_llama(path, t, seed=TINY_SEED, rope=rope)
            runs = {}
            ubatches = (64, 1) if t in UB1_TYPES and rope == "none" else (64,)
            for ub, nt in ((ub, nt) for ub in ubatches for nt in (2, 1)):
                runs[ub, nt] = oracle(
                    py,
                    f"""
import json, numpy as np
from llama_cpp import Llama
m = Llama({str(path)!r}, n_ctx=64, n_batch=64, n_ubatch={ub}, logits_all=True,
          verbose=False, flash_attn=True, n_threads={nt}, n_threads_batch={nt})
m.eval({TINY_TOKENS})
print(json.dumps(np.array(m.scores[:{len(TINY_TOKENS)}]).tolist()))
""",
                )
            res = runs[64, 2]
            if runs[64, 1] != res:
                print(f"tiny {name}: llama.cpp's logits differ between 1 and 2 threads")
            if 1 in ubatches:  # the single-token kernels too (ubatch 1)
                if runs[1, 1] != runs[1, 2]:
                    print(f"tiny {name}: llama.cpp's ubatch-1 logits differ between threads")
                out[f"{name}_logits_ub1"] = np.array(runs[1, 2], np.float32)
            out[f"{name}_logits"] = np.array(res, np.float32)
            out[f"{name}_sha256"] = np.array(hashlib.sha256(path.read_bytes()).hexdigest())
            print(f"tiny {name}: |logits| max {np.abs(out[f'{name}_logits']).max():.2f}")
    np.savez_compressed(FIX / "tiny_logits.npz", **out)


# The oracle's greedy loop (inserted into the oracle scripts below; needs MODEL, PROMPTS,
# N_GEN and add_bos): llama.cpp's argmax continuation of each prompt and its first logits.
GREEDY_CODE = """
g = Llama(MODEL, n_ctx=4096, n_batch=2048, n_ubatch=512, logits_all=False, verbose=False,
          flash_attn=True, n_threads=2)
greedy = []
for p in PROMPTS:
    ids = g.tokenize(p.encode(), add_bos=add_bos, special=False)
    g.reset()
    g.eval(ids)
    out, first_logits = [], None
    for k in range(N_GEN):
        ptr = llama_cpp.llama_get_logits_ith(g._ctx.ctx, -1)
        lg = np.ctypeslib.as_array(ptr, shape=(g.n_vocab(),)).astype(np.float32)
        if first_logits is None:
            first_logits = lg
        t = int(lg.argmax())
        out.append(t)
        if k + 1 < N_GEN:
            g.eval([t])
    greedy.append({{"prompt": p, "ids": ids, "out": out,
                   "text": g.detokenize(out).decode("utf-8", "replace"),
                   "logits_head": first_logits[:4096].tolist()}})
"""


_SMOL_CODE = (
    """
import ctypes, json, math, numpy as np
import llama_cpp
from llama_cpp import Llama
MODEL, TEXT, N_CTX, PROMPTS, N_GEN = {model!r}, {text!r}, {n_ctx}, {prompts!r}, {n_gen}
m = Llama(MODEL, n_ctx=N_CTX, n_batch=N_CTX, logits_all=True, verbose=False,
          flash_attn=True, n_threads=2)
add_bos = m._model.add_bos_token() if hasattr(m._model, "add_bos_token") else False
toks = m.tokenize(open(TEXT, "rb").read(), add_bos=add_bos, special=False)
n_chunk = len(toks) // N_CTX
first = N_CTX // 2
top1, logp = [], []
nll, cnt = 0.0, 0
for c in range(n_chunk):
    chunk = toks[c * N_CTX:(c + 1) * N_CTX]
    m.reset()  # the next eval drops the cached tokens from position 0 on
    m.eval(chunk)
    lg = np.array(m.scores[:N_CTX], dtype=np.float32)
    top1.append(lg.argmax(-1).tolist())
    row = []
    for i in range(first, N_CTX - 1):
        x = lg[i].astype(np.float64)
        mx = x.max()
        lp = x[chunk[i + 1]] - mx - math.log(np.exp(x - mx).sum())
        row.append(lp); nll -= lp; cnt += 1
    logp.append(row)
"""
    + GREEDY_CODE
    + """print(json.dumps({{"tokens": toks, "n_chunk": n_chunk, "top1": top1, "logp": logp,
                  "ppl": math.exp(nll / cnt), "add_bos": bool(add_bos), "greedy": greedy}}))
"""
)


def run_bin(bin_dir: str, tool: str, *args: str, stdout_only: bool = False) -> str:
    r = subprocess.run([str(Path(bin_dir) / tool), *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{tool} failed:\n{r.stderr[-3000:]}")
    return r.stdout if stdout_only else r.stdout + r.stderr


def make_smollm2(py: str, bin_dir: str) -> None:
    text = FIX / "text.txt"
    res = oracle(
        py,
        _SMOL_CODE.format(
            model=str(SMOLLM2), text=str(text), n_ctx=N_CTX_PPL, prompts=PROMPTS, n_gen=N_GREEDY
        ),
    )
    log = run_bin(
        bin_dir,
        "llama-perplexity",
        "-m",
        str(SMOLLM2),
        "-f",
        str(text),
        "-c",
        str(N_CTX_PPL),
        "-b",
        str(N_CTX_PPL),
        "-t",
        "2",
    )
    m = re.search(r"Final estimate: PPL = ([0-9.]+)", log)
    ppl_bin = float(m.group(1)) if m else float("nan")
    print(f"perplexity: binding {res['ppl']:.4f}, llama-perplexity {ppl_bin:.4f}")
    for g in res["greedy"]:
        out = run_bin(
            bin_dir,
            "llama-completion",
            "-m",
            str(SMOLLM2),
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
    n = res["n_chunk"] * N_CTX_PPL
    np.savez_compressed(
        FIX / "smollm2.npz",
        tokens=np.array(res["tokens"][:n], np.int32),
        top1=np.array(res["top1"], np.int32),
        logp=np.array(res["logp"], np.float64),
        logits_head=np.array([g["logits_head"] for g in res["greedy"]], np.float32),
    )
    meta = {
        "model": SMOLLM2.name,
        "n_ctx": N_CTX_PPL,
        "n_chunk": res["n_chunk"],
        "add_bos": res["add_bos"],
        "ppl_binding": res["ppl"],
        "ppl_llama_perplexity": ppl_bin,
        "greedy": [
            {k: g[k] for k in ("prompt", "ids", "out", "text", "completion_matches")}
            for g in res["greedy"]
        ],
    }
    (FIX / "smollm2.json").write_text(json.dumps(meta, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--oracle-py", default="/root/oracle/py/bin/python")
    ap.add_argument("--bin", default=DEFAULT_BIN, help="llama.cpp tools directory")
    ap.add_argument("--only", choices=("tiny", "smollm2"))
    ap.add_argument("--tiny-cases", help="comma-separated tiny cases (e.g. MXFP4) to regenerate")
    a = ap.parse_args()
    FIX.mkdir(parents=True, exist_ok=True)
    if a.only in (None, "tiny"):
        make_tiny(a.oracle_py, set(a.tiny_cases.split(",")) if a.tiny_cases else None)
    if a.only in (None, "smollm2"):
        make_smollm2(a.oracle_py, a.bin)


if __name__ == "__main__":
    main()
