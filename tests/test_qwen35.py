"""qwen35 (Qwen3.5 dense: Gated DeltaNet + gated full attention) through the numpy
specification (``models/delta_net_ref.py``) and the engine's hybrid memory, against
llama.cpp's logits (``tests/fixtures/engine/qwen35_logits.npz``,
``scripts/make_qwen35_fixtures.py``)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from llamacpy.engine.batch import Batch, split_batch
from llamacpy.engine.recurrent import HybridMemory
from llamacpy.gguf import GGMLType
from llamacpy.models.delta_net_ref import Qwen35Reference
from llamacpy.models.tiny import write_tiny_qwen35

FIX = np.load(Path(__file__).parent / "fixtures" / "engine" / "qwen35_logits.npz")
SEED = 3
TOKENS, PROMPT = FIX["tokens"].tolist(), FIX["prompt"].tolist()
RTOL = {"F32": 5e-4, "Q8_0": 1e-5}  # of max |logit| (measured: 4.5e-5, 1.1e-7)


@pytest.fixture(scope="module", params=["F32", "Q8_0"])
def model(request, tmp_path_factory):
    t = GGMLType[request.param]
    path = tmp_path_factory.mktemp("qwen35") / f"qwen35_{t.name}.gguf"
    write_tiny_qwen35(path, t, seed=SEED)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == str(FIX[f"{t.name}.sha256"])
    return t.name, Qwen35Reference(path)


def _memory(ref: Qwen35Reference, n_ctx: int = 64) -> HybridMemory:
    s = ref.s
    layers = [s.recurrent(il) for il in range(s.n_layer)]
    return HybridMemory(layers, s.n_head_kv, s.head_dim, n_ctx, s.conv_size, s.ssm_size)


def _decode(ref, mem, tokens, p0, all_logits=False):
    b = Batch()
    for i, t in enumerate(tokens):
        b.add(t, p0 + i, 0, logits=all_logits or i == len(tokens) - 1)
    ub = split_batch(b, len(tokens))[0]
    sl = mem.prepare(ub)
    return ref.forward(ub.token, ub.pos, sl.rows, sl.cells, sl.mask, ub.out_idx,
                       mem.forward_arrays())  # fmt: skip


def _close(name, got, want):
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < RTOL[name], f"{name}: max |diff| / max |logit| = {err:.2e}"
    assert (got.argmax(-1) == want.argmax(-1)).all()


def test_prompt_logits_match_llama_cpp(model) -> None:
    name, ref = model
    _close(name, _decode(ref, _memory(ref), TOKENS, 0, all_logits=True), FIX[f"{name}.logits"])


def test_greedy_decode_matches_llama_cpp_step_by_step(model) -> None:
    name, ref = model
    mem = _memory(ref)
    steps, greedy = FIX[f"{name}.steps"], FIX[f"{name}.greedy"].tolist()
    logits = _decode(ref, mem, PROMPT, 0)[0]
    out = []
    for k in range(len(greedy)):
        _close(name, logits[None], steps[k][None])
        out.append(int(logits.argmax()))
        logits = _decode(ref, mem, [out[-1]], len(PROMPT) + k)[0]
    _close(name, logits[None], steps[-1][None])
    assert out == greedy
    # prefix reuse as llama.cpp: a tail cannot be removed from a recurrent state
    for (seq, p0, p1), want in zip(FIX["seq_rm_args"].tolist(), FIX[f"{name}.seq_rm"].tolist()):
        assert mem.seq_rm(seq, p0, p1) is bool(want)


def test_a_prompt_in_several_ubatches_continues_the_state(model) -> None:
    name, ref = model
    mem = _memory(ref)
    _decode(ref, mem, TOKENS[:7], 0)
    _decode(ref, mem, TOKENS[7:12], 7)
    last = _decode(ref, mem, TOKENS[12:], 12)
    _close(name, last, FIX[f"{name}.logits"][-1:])
