"""granitehybrid (IBM Granite 4.0 H: Mamba-2 layers and attention layers, Granite's embedding,
residual, attention and logit scales; a dense FFN, or routed experts with a shared expert;
Bamba's files: rope) through the numpy specification and the engine, against llama.cpp's
logits (``tests/fixtures/engine/granitehybrid*_logits.npz``,
``scripts/make_qwen35_fixtures.py --arch granitehybrid[_moe|_rope]``)."""

from __future__ import annotations

import hashlib
import re
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from hybrid_checks import assert_close, assert_engine_close, context, reference_context
from llamacpy.engine.batch import Batch
from llamacpy.errors import ModelError
from llamacpy.gguf import GGMLType, GGUFReader, GGUFWriter
from llamacpy.models.reference import Reference
from llamacpy.models.tiny import GRANITEHYBRID_CASES, write_tiny_granitehybrid

FIXES = {
    case: np.load(Path(__file__).parent / "fixtures" / "engine" / f"{case}_logits.npz")
    for case in GRANITEHYBRID_CASES
}
SEED = 3
TOKENS = FIXES["granitehybrid"]["tokens"].tolist()
PROMPT = FIXES["granitehybrid"]["prompt"].tolist()
RTOL = {"F32": 5e-4, "Q8_0": 1e-5}  # of max |logit|
_ctx, _reference = context, reference_context
_close, _engine_close = partial(assert_close, RTOL), partial(assert_engine_close, RTOL)


@pytest.fixture(
    scope="module",
    params=[(c, t) for c in GRANITEHYBRID_CASES for t in ("F32", "Q8_0")],
    ids=lambda p: f"{p[0]}-{p[1]}",
)
def gguf(request, tmp_path_factory):
    """(weight type, path of the tiny model, llama.cpp's fixtures of it)."""
    case, name = request.param
    path = tmp_path_factory.mktemp("granitehybrid") / f"{case}_{name}.gguf"
    write_tiny_granitehybrid(path, GGMLType[name], seed=SEED, **GRANITEHYBRID_CASES[case])
    fix = FIXES[case]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == str(fix[f"{name}.sha256"])
    return name, path, fix


def test_reference_prompt_logits_match_llama_cpp(gguf) -> None:
    name, path, fix = gguf
    got = _reference(path).decode(Batch.from_tokens(TOKENS, logits="all"))
    _close(name, got, fix[f"{name}.logits"])


@pytest.mark.parametrize(("n_ubatch", "n_threads"), [(512, 2), (7, 1), (1, 2), (3, 2)])
def test_engine_prompt_logits_match_llama_cpp(gguf, n_ubatch, n_threads) -> None:
    name, path, fix = gguf
    ctx = _ctx(path, n_ubatch=n_ubatch, n_threads=n_threads)
    got = ctx.decode(Batch.from_tokens(TOKENS, logits="all"))
    _engine_close(name, got, fix[f"{name}.logits"])


def test_engine_greedy_decode_matches_llama_cpp(gguf) -> None:
    name, path, fix = gguf
    ctx = _ctx(path)
    steps, greedy = fix[f"{name}.steps"], fix[f"{name}.greedy"].tolist()
    logits = ctx.decode(Batch.from_tokens(PROMPT))
    out = []
    for k in range(len(greedy)):
        _engine_close(name, logits, steps[k][None])
        out.append(int(logits[0].argmax()))
        logits = ctx.decode(Batch.from_tokens([out[-1]], pos0=len(PROMPT) + k))
    assert out == greedy
    for (seq, p0, p1), want in zip(fix["seq_rm_args"].tolist(), fix[f"{name}.seq_rm"].tolist()):
        assert ctx.seq_rm(seq, p0, p1) is bool(want)


def test_engine_sequences_interleaved_keep_their_own_state(gguf) -> None:
    """Two sequences decoded together give each one's logits alone (deterministic contexts:
    attention in order of position)."""
    _name, path, _fix = gguf
    a, b = TOKENS[:9], TOKENS[5:16]
    kw = dict(n_seq_max=2, deterministic=True)
    alone = [_ctx(path, **kw).decode(Batch.from_tokens(t, logits="all")) for t in (a, b)]
    ctx = _ctx(path, n_ubatch=8, **kw)
    batch = Batch()
    for i in range(max(len(a), len(b))):
        for s, toks in enumerate((a, b)):
            if i < len(toks):
                batch.add(toks[i], i, s, logits=True)
    got = ctx.decode(batch)
    seq = np.array([s for i in range(len(b)) for s in (0, 1) if i < (len(a), len(b))[s]])
    for s in (0, 1):
        np.testing.assert_array_equal(got[seq == s], alone[s])


def test_compiled_stages_match_the_reference(gguf, monkeypatch) -> None:
    name, path, _fix = gguf
    ctx = _ctx(path, n_ubatch=5)
    ref, compiled, rows = Reference(ctx.model), ctx.model.forward, []

    def both(ws, ub, kv, n_threads, deterministic=False):
        mine = tuple(a.copy() for a in kv[:4])
        want = ref.forward(ub, (*mine, kv[4]), n_threads)
        got = compiled(ws, ub, kv, n_threads, deterministic)
        rows.extend(np.abs(got - want).max(-1) / np.abs(want).max())
        return got

    monkeypatch.setattr(ctx.model, "forward", both)
    ctx.decode(Batch.from_tokens(TOKENS[:12], logits="all"))
    ctx.decode(Batch.from_tokens([3], pos0=12))
    rel = np.array(rows)
    # (Q8_0: a last-bit difference on a rounding boundary of an activation moves it a step)
    assert rel.max() < 5e-2 and (rel >= RTOL[name]).sum() <= len(rel) // 3, rel


def _edited(tmp_path, drop: str = "", **shape) -> Path:
    src = tmp_path / "tiny.gguf"
    write_tiny_granitehybrid(src, GGMLType.F32, seed=SEED, **shape)
    r = GGUFReader(src)
    w = GGUFWriter(tmp_path / "edited.gguf")
    for fld in r.fields.values():
        w.add_field(fld)
    for info in r.tensors:
        if info.name != drop:
            w.add_tensor_info(info)
    w.write()
    return tmp_path / "edited.gguf"


MISSING = [
    ("blk.1.ssm_in.weight", r"layer 1 is a Mamba-2 layer"),
    ("blk.2.attn_k.weight", r"layer 2 is an attention layer"),
    ("blk.0.ffn_up.weight", r"required by granitehybrid"),
]


@pytest.mark.parametrize(("tensor", "why"), MISSING, ids=[m[0] for m in MISSING])
def test_a_missing_tensor_is_named(tmp_path, tensor, why) -> None:
    with pytest.raises(ModelError, match=re.escape(repr(tensor)) + ".*" + why):
        _ctx(_edited(tmp_path, drop=tensor))


def test_a_missing_conv_bias_is_no_bias(tmp_path) -> None:
    """``ssm_conv1d.bias`` is optional in granitehybrid (llama.cpp: not required): a file
    without it loads and runs."""
    got = _ctx(_edited(tmp_path, drop="blk.0.ssm_conv1d.bias")).decode(
        Batch.from_tokens(TOKENS[:4], logits="all")
    )
    assert np.isfinite(got).all()
