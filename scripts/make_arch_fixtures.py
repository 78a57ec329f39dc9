#!/usr/bin/env python
"""Produce the fixtures of the architecture tests with llama.cpp (the oracle; dev-only).

Run from the repository root with the project's venv::

    .venv/bin/python scripts/make_arch_fixtures.py [--oracle-py /root/oracle/py/bin/python]

Writes ``tests/fixtures/engine/arch_logits.npz``: for every case (tiny random model of
``llamacpy.models.tiny``, seed 3, F32 and Q8_0 weights, rebuilt by the tests) the file's
sha256, llama.cpp's logits on ``tokens`` (teacher-forced, every position) and a greedy
continuation of ``prompt``. Cases: ``qwen2``, ``qwen3``, ``phi3`` (context 256: short rope
factors; ``phi3_long``: the same file in a context of 512, above the original context of
256, so the long factors; llama.cpp rounds contexts up to multiples of 256 before it
chooses), ``llama_swa`` (a llama file with ``llama.attention.sliding_window`` = 4),
``smollm3``, ``qwen3moe`` (4 experts, 2 used), ``mixtral`` (a llama file with 4 experts),
``gpt-oss``, ``gemma2`` (attention and final logit soft-caps, even layers sliding-window)
``olmo2`` and ``olmo2_swa`` (OLMo 3's sliding-window layers, YaRN on the global one),
``deepseek2`` (latent attention; V3's router: sigmoid, selection bias, grouped experts),
``deepseek2_v2`` (V2's softmax router), ``deepseek2_yarn`` (DeepSeek's YaRN K.Q scale) and
``deepseek2_lite`` (26 layers, q without low rank, as V2-Lite), ``gemma4`` (local, local,
global layers; value norms, proportional rope factors, layer output scales; a greedy
continuation of 32 tokens) ``gemma4_moe`` (a dense FFN beside 4 experts) and ``gemma4_moe_fused`` (the experts' gate and
up in one tensor, as converted); ``LONG_CASES`` add logits of
80 tokens at given ubatch sizes (deepseek2: 80, tiled attention, and 7). ``--cases A,B`` recomputes those cases only and keeps the others' fixtures.

The oracle runs in a subprocess (``--oracle-py``, the llama-cpp-python interpreter); the
tests never need it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from llamacpy.gguf import GGMLType  # noqa: E402
from llamacpy.models.tiny import LLAMA_CPP_CASES, write_tiny_llama  # noqa: E402

FIX = ROOT / "tests" / "fixtures" / "engine"
SEED = 3
TOKENS = [1, 50, 72, 101, 108, 108, 111, 33, 200, 3, 77, 140, 9, 250, 31, 66, 100, 12]
PROMPT = [1, 84, 104, 101, 32, 99]
N_GREEDY = 16
# longer continuations of these cases
N_GREEDY_CASE = dict.fromkeys(
    ("gemma4", "gemma4_moe", "gemma4_moe_fused", "gemma4_31b", "gemma4_e2b"), 32
)
CASES = LLAMA_CPP_CASES  # case -> (arch, tiny-model options, n_ctx)
# Q8_0 cases also run on a longer prompt at these ubatch sizes (64+: tiled attention):
# ``{case}.Q8_0.long{ubatch}`` logits of LONG_TOKENS in a context of 256
LONG_CASES = {"deepseek2": (80, 7), "gemma4_31b": (80, 7), "gemma4_e2b": (80, 7)}
LONG_TOKENS = np.random.default_rng(7).integers(3, 259, 80).tolist()
ORACLE_LONG = """
import json, numpy as np
from llama_cpp import Llama
m = Llama({path!r}, n_ctx=256, n_batch=128, n_ubatch={ub}, logits_all=True, verbose=False,
          flash_attn=True, n_threads=2)
m.eval({tokens})
print(json.dumps(np.array(m.scores[:{n}], dtype=np.float32).tolist()))
"""
TYPES = (GGMLType.F32, GGMLType.Q8_0)

ORACLE_PY = "/root/oracle/py/bin/python"  # the llama-cpp-python interpreter
# the start of an oracle script: the model loaded, ``logits`` of ``tokens`` in one batch
ORACLE_LOGITS = """
import json, numpy as np, llama_cpp
from llama_cpp import Llama
m = Llama({path!r}, n_ctx={n_ctx}, n_batch=64, logits_all=True, verbose=False,
          flash_attn=True, n_threads=2)
m.eval({tokens})
logits = np.array(m.scores[:{n}], dtype=np.float32).tolist()
m.reset()
"""
_GREEDY = """m.eval({prompt})
out = []
for k in range({n_gen}):
    t = int(np.argmax(m.scores[m.n_tokens - 1]))
    out.append(t)
    m.eval([t])
print(json.dumps({{"logits": logits, "greedy": out}}))
"""
_CODE = ORACLE_LOGITS + _GREEDY


def oracle(py: str, code: str) -> dict:
    """Run ``code`` with the oracle interpreter; it prints one JSON object last."""
    r = subprocess.run([py, "-c", code], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"oracle failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--oracle-py", default=ORACLE_PY)
    ap.add_argument("--cases", help="comma-separated cases to recompute (default: all)")
    args = ap.parse_args()
    out: dict[str, np.ndarray] = {
        "tokens": np.array(TOKENS, np.int32),
        "prompt": np.array(PROMPT, np.int32),
    }
    cases = list(CASES)
    if args.cases:
        cases = args.cases.split(",")
        unknown = [c for c in cases if c not in CASES]
        if unknown:
            ap.error(f"unknown cases {unknown}; known: {', '.join(CASES)}")
        with np.load(FIX / "arch_logits.npz") as old:
            out.update({k: old[k] for k in old.files if k.split(".")[0] not in cases})
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            arch, opts, n_ctx = CASES[case]
            for t in TYPES:
                key = f"{case}.{t.name}"
                path = Path(tmp) / f"{arch}_{t.name}.gguf"
                write_tiny_llama(path, t, seed=SEED, arch=arch, **opts)
                code = _CODE.format(
                    path=str(path), n_ctx=n_ctx, tokens=TOKENS, n=len(TOKENS),
                    prompt=PROMPT, n_gen=N_GREEDY_CASE.get(case, N_GREEDY),
                )  # fmt: skip
                res = oracle(args.oracle_py, code)
                out[f"{key}.logits"] = np.array(res["logits"], np.float32)
                out[f"{key}.greedy"] = np.array(res["greedy"], np.int32)
                out[f"{key}.sha256"] = np.array(hashlib.sha256(path.read_bytes()).hexdigest())
                mx = np.abs(out[f"{key}.logits"]).max()
                print(f"{key}: |logits| max {mx:.3f}, greedy {res['greedy']}")
                for ub in LONG_CASES.get(case, ()) if t == GGMLType.Q8_0 else ():
                    code = ORACLE_LONG.format(path=str(path), ub=ub, tokens=LONG_TOKENS,
                                              n=len(LONG_TOKENS))  # fmt: skip
                    r = subprocess.run([args.oracle_py, "-c", code], capture_output=True, text=True)
                    if r.returncode != 0:
                        raise RuntimeError(f"oracle failed:\n{r.stderr[-3000:]}")
                    rows = json.loads(r.stdout.strip().splitlines()[-1])
                    out[f"{key}.long{ub}"] = np.array(rows, np.float32)
    np.savez_compressed(FIX / "arch_logits.npz", **out)


if __name__ == "__main__":
    main()
