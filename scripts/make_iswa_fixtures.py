#!/usr/bin/env python
"""Produce the sliding-window cache fixture with llama.cpp (the oracle; dev-only).

Run from the repository root with the project's venv::

    .venv/bin/python scripts/make_iswa_fixtures.py [--oracle-py /root/oracle/py/bin/python]

Gemma-3-270M at ``n_ctx`` 2048 with ubatches of 512 (``swa_full`` false: the window layers'
cache holds 512 + 512 = 1024 cells): :data:`N_PROMPT` tokens of the gemma3 fixture text in
batches of 512 (the logits of each batch's last token), then :data:`N_DECODE` more one at
a time. From the
third batch on the window cache takes cells again, so the rows depend on llama.cpp's cell
placement. Writes ``tests/fixtures/engine/gemma3_iswa.npz``: the tokens, and for the rows
:data:`ROWS` the sha256 of the whole float32 row and its first :data:`HEAD` values, with
the window cache (``iswa_*``) and with a full-size one (``full_*``, ``swa_full`` true).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from make_engine_fixtures import oracle  # noqa: E402

FIX = ROOT / "tests" / "fixtures" / "engine"
GEMMA3 = Path.home() / ".cache" / "llamacpy" / "models" / "gemma-3-270m-q4_k_m.gguf"
N_CTX, N_UBATCH, N_PROMPT, N_DECODE = 2048, 512, 1536, 8
# the last row of each batch (llama-cli's and llama-server's case: one output row) and
# every decoded token
ROWS = [511, 1023, 1535, *range(N_PROMPT, N_PROMPT + N_DECODE)]
HEAD = 1024

_CODE = """
import json, hashlib, numpy as np
from llama_cpp import Llama
tokens = {tokens}
out = {{}}
for full in (False, True):
    m = Llama({path!r}, n_ctx={n_ctx}, n_batch={n_ub}, n_ubatch={n_ub}, logits_all=False,
              swa_full=full, flash_attn=True, n_threads=2, n_threads_batch=2, verbose=False)
    chunks = [tokens[a : a + {n_ub}] for a in range(0, {n_prompt}, {n_ub})]
    chunks += [[t] for t in tokens[{n_prompt}:]]
    rows = []
    for c in chunks:
        m.eval(c)  # the logits of the chunk's last token
        rows.append(np.ctypeslib.as_array(m._ctx.get_logits(), shape=(m.n_vocab(),)).copy())
    rows = np.asarray(rows, np.float32)
    key = "full" if full else "iswa"
    out[key + "_sha"] = [hashlib.sha256(r.tobytes()).hexdigest() for r in rows]
    out[key + "_head"] = rows[:, :{head}].tolist()
    del m
print(json.dumps(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--oracle-py", default="/root/oracle/py/bin/python")
    a = ap.parse_args()
    g = np.load(FIX / "gemma3.npz")
    tokens = np.concatenate([g["tokens_1024"][0], g["tokens_1024"][1][1:]])
    tokens = tokens[: N_PROMPT + N_DECODE].astype(np.int32)
    code = _CODE.format(
        tokens=tokens.tolist(), path=str(GEMMA3), n_ctx=N_CTX, n_ub=N_UBATCH,
        n_prompt=N_PROMPT, head=HEAD,
    )  # fmt: skip
    res = oracle(a.oracle_py, code)
    out = {"tokens": tokens, "rows": np.array(ROWS, np.int32)}
    for key in ("iswa", "full"):
        out[f"{key}_sha"] = np.array(res[f"{key}_sha"])
        out[f"{key}_head"] = np.array(res[f"{key}_head"], np.float32)
    differ = sum(a != b for a, b in zip(res["iswa_sha"], res["full_sha"], strict=True))
    print(f"rows where the window cache changes llama.cpp's logits: {differ} of {len(ROWS)}")
    np.savez_compressed(FIX / "gemma3_iswa.npz", **out)
    print(hashlib.sha256((FIX / "gemma3_iswa.npz").read_bytes()).hexdigest()[:12])


if __name__ == "__main__":
    main()
