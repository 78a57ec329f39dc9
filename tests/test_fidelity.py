"""Logits bit-identical to llama.cpp's on both real models over a reduced matrix of prompt
lengths (1-520: past Gemma-3's 512-token sliding window), ubatch sizes (1-512: the
single-token, row, tiled-attention and llama.cpp's 8+-token tiled K-quant paths), thread
counts and greedy continuations. Fixture: ``scripts/check_fidelity.py --write-fixture``
(llama.cpp through llama-cpp-python, flash attention on); the full matrix is that script
without flags."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from llamacpy.engine import Batch, Context, ContextParams

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "engine" / "fidelity.json").read_text())

pytestmark = [pytest.mark.real_model, pytest.mark.slow]


def _hash(lg: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(lg, np.float32).tobytes()).hexdigest()[:16]


@pytest.mark.parametrize("name", sorted(FIXTURE["models"]))
def test_logits_and_greedy_tokens_match_llama_cpp(name, request):
    path = request.getfixturevalue(
        {"smollm2-135m": "smollm2_path", "gemma3-270m": "gemma3_path"}[name]
    )
    cases = FIXTURE["models"][name]
    assert len(cases) >= 30
    ctx, key0, failures = None, None, []
    for c in cases:
        key = (c["n_ctx"], c["ub"], c["t"], c["tk"], c["tv"])
        if key != key0:
            params = ContextParams(n_ctx=c["n_ctx"], n_batch=c["n_ctx"], n_ubatch=c["ub"],
                                   n_threads=c["t"], n_threads_batch=c["t"], type_k=c["tk"],
                                   type_v=c["tv"])  # fmt: skip
            ctx = Context(path, params, model=None if ctx is None else ctx.model)
            key0 = key
        ctx.clear()
        ids = c["ids"]
        b = Batch()
        for p, t in enumerate(ids):
            b.add(int(t), p, 0, p == len(ids) - 1)
        lg = ctx.decode(b)[-1]
        hashes, tokens = [_hash(lg)], []
        for i in range(c["n_gen"]):
            t = int(np.argmax(lg))
            tokens.append(t)
            lg = ctx.decode(Batch().add(t, len(ids) + i, 0, True))[-1]
            hashes.append(_hash(lg))
        if hashes != c["hashes"] or tokens != c["tokens"]:
            first = next(i for i, (x, y) in enumerate(zip(hashes, c["hashes"])) if x != y)
            failures.append(f"n={len(ids)} ub={c['ub']} t={c['t']}: step {first}")
    assert not failures, failures
