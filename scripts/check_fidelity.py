#!/usr/bin/env python
"""Logits of llamacpy against llama.cpp's, bit for bit, over a matrix of prompt lengths,
ubatch sizes, thread counts and KV cache types, with greedy decoding after the prompt.

Each case decodes a prompt of seeded random token ids (the first one BOS) with llama.cpp's
batching (``n_batch`` = the context, ``n_ubatch`` = the case's), keeps the last token's
logits, then decodes ``n_gen`` greedy tokens one at a time; both sides' logits after the
prompt and after every generated token are compared with ``np.array_equal`` (through their
sha256). llama.cpp runs through llama-cpp-python (the oracle interpreter, dev-only) with
flash attention on, as ``llama-completion`` runs by default.

    .venv/bin/python scripts/check_fidelity.py [--oracle-py /root/oracle/py/bin/python]
        [--models smollm2-135m,gemma3-270m] [--reduced] [--write-fixture]

``--reduced`` runs the matrix the test suite keeps (``tests/test_fidelity.py``);
``--write-fixture`` writes llama.cpp's results for it to ``tests/fixtures/engine/fidelity.json``.
The default is the full matrix: prompt lengths 1-600, ``-ub`` 1, 2, 3, 4, 7, 8, 64, 256, 512,
``-t`` 1 and 2, an f16 cache, 64 generated tokens on a subset; ``--caches q8_0/q8_0,f32/f16``
adds cells with other cache types.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from llamacpy.fileio import atomic_write

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "engine" / "fidelity.json"
GGML_TYPES = {"f32": 0, "f16": 1, "q8_0": 8}

_ORACLE = r"""
import hashlib, json, sys
import numpy as np
from llama_cpp import Llama
spec = json.load(open(sys.argv[1]))
TYPES = {"f32": 0, "f16": 1, "q8_0": 8}
out, llm, key0 = [], None, None
for c in spec["cases"]:
    key = (c["n_ctx"], c["ub"], c["t"], c["tk"], c["tv"])
    if key != key0:
        llm = None
        llm = Llama(spec["model"], n_ctx=c["n_ctx"], n_batch=c["n_ctx"], n_ubatch=c["ub"],
                    n_threads=c["t"], n_threads_batch=c["t"], type_k=TYPES[c["tk"]],
                    type_v=TYPES[c["tv"]], logits_all=False, flash_attn=True, verbose=False)
        key0 = key
    llm.reset()
    llm.eval(c["ids"])
    hashes, toks = [], []
    for step in range(c["n_gen"] + 1):
        lg = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm._n_vocab,)).copy()
        hashes.append(hashlib.sha256(lg.astype(np.float32).tobytes()).hexdigest()[:16])
        if step == c["n_gen"]:
            break
        t = int(np.argmax(lg))
        toks.append(t)
        llm.eval([t])
    out.append({"hashes": hashes, "tokens": toks})
json.dump(out, open(sys.argv[2], "w"))
"""


def cases_for(model: str, reduced: bool, caches_extra=()) -> list[dict]:
    """The matrix, with seeded random prompts (token ids in the model's ordinary range)."""
    rng = np.random.default_rng(20261201)
    bos, hi = (2, 200000) if model.startswith("gemma3") else (1, 49000)
    if reduced:
        lengths = [1, 7, 8, 9, 64, 70, 300]
        grid = [(1, 1), (3, 2), (8, 2), (64, 1), (512, 2)]
        caches = [("f16", "f16")]
        extra = [(520, 512, 2, "f16", "f16", 16), (40, 8, 1, "f16", "f16", 8),
                 (70, 8, 2, "q8_0", "q8_0", 8), (9, 1, 1, "f16", "q8_0", 8),
                 (300, 512, 2, "q8_0", "q8_0", 0), (70, 512, 2, "f32", "f32", 4),
                 (300, 8, 2, "f32", "f16", 8)]  # fmt: skip
        gen_lengths = {9: 16, 300: 16}
    else:
        lengths = [1, 2, 5, 7, 8, 9, 15, 16, 17, 33, 63, 64, 65, 100, 130, 255, 256, 300, 511,
                   512, 513, 600]  # fmt: skip
        grid = [(ub, t) for ub in (1, 2, 3, 4, 7, 8, 64, 256, 512) for t in (1, 2)]
        caches = [("f16", "f16")]
        # other cache types with --caches (q8_0 caches are rotated as llama.cpp's; f32
        # ones are cast to f16 before attention)
        extra = [(n, ub, t, tk, tv, 16) for n in (9, 70, 300) for ub in (1, 8, 512)
                 for t in (1, 2) for tk, tv in caches_extra]  # fmt: skip
        gen_lengths = {9: 64, 100: 64, 513: 64}
    out = []
    for tk, tv in caches:
        for ub, t in grid:
            for n in lengths:
                out.append((n, ub, t, tk, tv, gen_lengths.get(n, 0)))
    out += extra
    cases = []
    for n, ub, t, tk, tv, n_gen in out:
        ids = [bos, *rng.integers(100, hi, n - 1).tolist()]
        n_ctx = 1024 if n + n_gen <= 1024 else 2048
        cases.append(dict(ids=ids, ub=ub, t=t, tk=tk, tv=tv, n_gen=n_gen, n_ctx=n_ctx))
    return cases


def logits_hash(lg: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(lg, np.float32).tobytes()).hexdigest()[:16]


def run_ours(model_path: str, cases: list[dict]) -> list[dict]:
    from llamacpy.engine import Batch, Context, ContextParams

    out, ctx, key0 = [], None, None
    for c in cases:
        key = (c["n_ctx"], c["ub"], c["t"], c["tk"], c["tv"])
        if key != key0:
            params = ContextParams(n_ctx=c["n_ctx"], n_batch=c["n_ctx"], n_ubatch=c["ub"],
                                   n_threads=c["t"], n_threads_batch=c["t"], type_k=c["tk"],
                                   type_v=c["tv"])  # fmt: skip
            ctx = Context(model_path, params, model=ctx.model if ctx is not None else None)
            key0 = key
        ctx.clear()
        ids = c["ids"]
        b = Batch()
        for p, t in enumerate(ids):
            b.add(int(t), p, 0, p == len(ids) - 1)
        lg = ctx.decode(b)[-1]
        hashes, toks = [logits_hash(lg)], []
        for i in range(c["n_gen"]):
            t = int(np.argmax(lg))
            toks.append(t)
            lg = ctx.decode(Batch().add(t, len(ids) + i, 0, True))[-1]
            hashes.append(logits_hash(lg))
        out.append({"hashes": hashes, "tokens": toks})
    return out


def run_oracle(py: str, model_path: str, cases: list[dict]) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        spec, res = Path(tmp) / "spec.json", Path(tmp) / "res.json"
        spec.write_text(json.dumps({"model": model_path, "cases": cases}))
        r = subprocess.run([py, "-c", _ORACLE, str(spec), str(res)], capture_output=True,
                           text=True)  # fmt: skip
        if r.returncode != 0:
            raise RuntimeError(f"oracle failed:\n{r.stderr[-3000:]}")
        return json.loads(res.read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--oracle-py", default="/root/oracle/py/bin/python")
    ap.add_argument("--models", default="smollm2-135m,gemma3-270m")
    ap.add_argument("--reduced", action="store_true", help="the test suite's matrix")
    ap.add_argument("--write-fixture", action="store_true", help="(implies --reduced)")
    ap.add_argument("--caches", default="", help="extra K/V cache types, e.g. q8_0/q8_0")
    ap.add_argument("--caches-only", action="store_true", help="only the --caches cells")
    args = ap.parse_args()
    from llamacpy.registry import resolve_model

    reduced = args.reduced or args.write_fixture
    fixture: dict = {"models": {}}
    failed = 0
    for name in args.models.split(","):
        path = str(resolve_model(name))
        extra = [tuple(c.split("/")) for c in args.caches.split(",") if c]
        cases = cases_for(name, reduced, extra)
        if args.caches_only:
            cases = [c for c in cases if (c["tk"], c["tv"]) in extra]
        t0 = time.perf_counter()
        theirs = run_oracle(args.oracle_py, path, cases)
        t1 = time.perf_counter()
        ours = run_ours(path, cases)
        t2 = time.perf_counter()
        bad = [(c, a, b) for c, a, b in zip(cases, ours, theirs) if a != b]
        n_logits = sum(len(x["hashes"]) for x in theirs)
        print(f"{name}: {len(cases)} cases, {n_logits} logit vectors, {len(bad)} cases differ "
              f"(llama.cpp {t1 - t0:.0f} s, llamacpy {t2 - t1:.0f} s)")  # fmt: skip
        for c, a, b in bad[:20]:
            first = next(i for i, (x, y) in enumerate(zip(a["hashes"], b["hashes"])) if x != y)
            print(f"  n={len(c['ids'])} ub={c['ub']} t={c['t']} cache={c['tk']}/{c['tv']}: "
                  f"first difference at step {first}")  # fmt: skip
        failed += len(bad)
        fixture["models"][name] = [dict(c, **r) for c, r in zip(cases, theirs)]
    if args.write_fixture:
        with atomic_write(FIXTURE) as f:
            f.write((json.dumps(fixture, separators=(",", ":")) + "\n").encode())
        print(f"wrote {FIXTURE}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
