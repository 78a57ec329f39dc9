"""The compiled forward of every decoder architecture vs the numpy reference built from the
same block declaration (``llamacpy.models.reference``).

Each architecture's (and variant's: ``tiny.TINY_VARIANTS``, a llama file with experts) tiny
random model (``models.tiny``) runs prompts through the engine (rows and tiled attention,
inside and past gemma3's sliding window of 4, all / last / some logits wanted), each followed
by single-token decode steps. The model's ``forward`` is
wrapped: on every ubatch the reference first runs on a copy of the KV cache, with the arrays,
attention mode and thread count the engine built, then the compiled forward; their logits
must agree (see :data:`TIGHT`, :data:`FLIPPED`). Also: decode steps in the split attention,
a q8_0 cache, logit soft-capping, unknown stage names, a reference for every compiled stage.
"""

from __future__ import annotations

import inspect
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from llamacpy.engine import Batch, Context, ContextParams
from llamacpy.gguf import GGMLType
from llamacpy.models import stages
from llamacpy.models.decoder import LLAMA_BLOCK
from llamacpy.models.reference import STAGES, Reference, stage_functions
from llamacpy.models.tiny import TINY_ARCHS, TINY_VARIANTS, write_tiny_llama

SEED = 5
N_CTX = 128  # n_kv 128: two attention tiles
N_DECODE = 3
TOKENS = np.random.default_rng(SEED).integers(3, 259, 70).tolist()
# prompt length -> which of its tokens want logits (rows 3, 7; tiled 70)
PROMPTS = {3: "all", 7: "last", 70: (0, 5, 31, 64, 69)}
# model name -> (architecture, tiny-model options): every architecture and variant
MODELS = {arch: (arch, {}) for arch in TINY_ARCHS} | TINY_VARIANTS
CASES = [(name, t) for name in MODELS for t in (GGMLType.F32, GGMLType.Q8_0)]
# a K-quant (q8_K activations): Q3_K, as the tiny Q4_K / Q5_K weights share a large offset
# (random block mins) that leaves their logits nearly blind to attention
CASES += [("gemma3", GGMLType.Q3_K)]
TIGHT = 2e-3  # of max|want| per row: float order (numpy's float64 sums), f16 cache rounding
# Quantized weights see their activations rounded to integers (q8_0, q8_K). A one-ulp
# difference of a sum (numpy's float64 vs ggml's float32 order) that lands on a rounding
# boundary moves one activation by a whole step (or a q8_0 block's f16 scale by one ulp);
# the row it reaches then differs by up to ~1.5e-2 of max|logit| on these models, while the
# other rows agree to ~1e-7. Such rows are bounded by FLIPPED; at most a third may be.
FLIPPED = 5e-2
FLOAT_ACTS = (GGMLType.F32,)  # weight types whose matmuls take float32 activations as is
# F32 bounds of models more sensitive to the order of sums: gemma4 with E2B's layout (6
# layers, per-layer embeddings: each layer's gate through the f16-table GELU, its projection
# RMS-normed) moves a few rows by up to 9.3e-3 of max|logit| (not traced further: on the
# architecture tests' tokens the compiled forward and this reference agree with each other
# better than either agrees with llama.cpp's F32, and the Q8_0 file is bit-identical to
# llama.cpp at every ubatch size, tiled attention included)
TIGHT_MODEL = {"gemma4_e2b": 1.2e-2}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("reference")


def _context(model_dir: Path, name: str, t: GGMLType, **kw) -> Context:
    path = model_dir / f"{name}_{t.name}.gguf"
    if not path.exists():
        arch, opts = MODELS[name]
        write_tiny_llama(path, t, seed=SEED, arch=arch, **opts)
    params = {"n_ctx": N_CTX, "n_threads": 2, "type_k": "f16", "type_v": "f16", **kw}
    return Context(path, ContextParams(kernel_formats="all", **params))


class Recorder:
    """Stands in for ``model.forward``: runs the reference on a copy of the KV cache, then
    the compiled forward (both in ``decode_mode``, when set, on single-token ubatches), and
    keeps both logits of every ubatch."""

    def __init__(self, model, decode_mode: int | None = None) -> None:
        self.compiled = model.forward
        self.reference = Reference(model)
        self.decode_mode = decode_mode
        self.steps: list[tuple[int, int, np.ndarray, np.ndarray]] = []

    def __call__(self, ws, ub, kv, n_threads, deterministic=False):
        if len(ub.tokens) == 1 and self.decode_mode is not None:
            ub = replace(ub, mode=self.decode_mode, mode_swa=self.decode_mode)
        kc, vc, kcs, vcs, info = kv
        copies = {id(a): a.copy() for a in (kc, vc, kcs, vcs)}  # a cache shared: one copy
        mine = tuple(copies[id(a)] for a in (kc, vc, kcs, vcs))
        want = self.reference.forward(ub, (*mine, info), n_threads)
        got = self.compiled(ws, ub, kv, n_threads, deterministic)
        self.steps.append((len(ub.tokens), ub.mode, got.copy(), want))
        return got


def _batch(tokens: list[int], wanted) -> Batch:
    if isinstance(wanted, str):
        return Batch.from_tokens(tokens, logits=wanted)
    batch = Batch()
    for i, tok in enumerate(tokens):
        batch.add(tok, i, 0, i in wanted)
    return batch


def _run(ctx: Context, monkeypatch, prompts=PROMPTS, decode_mode=None) -> Recorder:
    """Each prompt on a fresh cache, then :data:`N_DECODE` single tokens."""
    rec = Recorder(ctx.model, decode_mode)
    monkeypatch.setattr(ctx.model, "forward", rec)
    for n, wanted in prompts.items():
        ctx.clear()
        ctx.decode(_batch(TOKENS[:n], wanted))
        for i in range(N_DECODE):
            ctx.decode(Batch.from_tokens([TOKENS[-1 - i]], pos0=n + i))
    return rec


def _check(rec: Recorder, t: GGMLType, tight: float = TIGHT) -> float:
    """Logits of every row within ``tight`` of max|want| (quantized weights: at most a
    third of the rows within :data:`FLIPPED` instead), argmax equal; returns the largest
    relative row difference."""
    rel, top, where = [], [], []
    for n, mode, got, want in rec.steps:
        assert got.shape == want.shape, f"ubatch of {n} tokens"
        rel += list(np.abs(got - want).max(-1) / np.abs(want).max())
        top += list(got.argmax(-1) == want.argmax(-1))
        where += [f"ubatch of {n} (mode {mode}) row {i}" for i in range(len(got))]
    rel = np.array(rel)
    report = ", ".join(f"{w}: {r:.1e}" for w, r in zip(where, rel, strict=True) if r > tight)
    if t in FLOAT_ACTS:
        assert rel.max() <= tight, report
    else:
        assert rel.max() <= FLIPPED, report
        assert (rel > tight).sum() <= len(rel) // 3, report
    assert all(top), [w for w, same in zip(where, top, strict=True) if not same]
    return float(rel.max())


@pytest.mark.parametrize(("arch", "t"), CASES, ids=lambda v: getattr(v, "name", v))
def test_compiled_forward_matches_reference(model_dir, monkeypatch, arch, t) -> None:
    rec = _run(_context(model_dir, arch, t), monkeypatch)
    modes = {(n > 1, mode) for n, mode, _, _ in rec.steps}
    assert modes == {(True, stages.MODE_ROWS), (True, stages.MODE_TILED),
                     (False, stages.MODE_ROWS)}  # fmt: skip
    worst = _check(rec, t, TIGHT_MODEL.get(arch, TIGHT))
    print(f"{arch} {t.name}: max row |compiled - reference| / max|logit| = {worst:.2e}")


@pytest.mark.parametrize("arch", list(MODELS))
def test_split_decode_matches_reference(model_dir, monkeypatch, arch) -> None:
    # the engine splits single-token attention over threads from 512 cells on; forced here
    ctx = _context(model_dir, arch, GGMLType.F32)
    rec = _run(ctx, monkeypatch, {7: "last"}, decode_mode=stages.MODE_SPLIT)
    assert [mode for n, mode, _, _ in rec.steps if n == 1] == [stages.MODE_SPLIT] * N_DECODE
    _check(rec, GGMLType.F32, TIGHT_MODEL.get(arch, TIGHT))


def test_q8_0_cache_matches_reference(model_dir, monkeypatch) -> None:
    ctx = _context(model_dir, "gemma3", GGMLType.F32, type_k="q8_0", type_v="q8_0")
    _check(_run(ctx, monkeypatch, {3: "all", 7: "last"}), GGMLType.F32)


def test_logit_softcap_matches_reference(model_dir, monkeypatch) -> None:
    # gemma3's final_logit_softcapping, set in the model row both forwards read
    ctx = _context(model_dir, "gemma3", GGMLType.F32)
    ctx.model.model_row["softcap"] = 1.0
    rec = _run(ctx, monkeypatch, {7: (2, 6)})
    assert max(np.abs(want).max() for *_, want in rec.steps) < 1.0
    _check(rec, GGMLType.F32)


def test_unknown_stage_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown stage 'ffn_moe_shexp'"):
        stage_functions((*LLAMA_BLOCK, "ffn_moe_shexp"))

    class Odd:
        block = (*LLAMA_BLOCK[:3], "rope_mrope", *LLAMA_BLOCK[3:])

    with pytest.raises(ValueError, match="unknown stage 'rope_mrope'"):
        Reference(Odd())


def test_every_compiled_stage_has_a_reference() -> None:
    def is_stage(fn) -> bool:
        py = getattr(fn, "py_func", None)
        return py is not None and list(inspect.signature(py).parameters) == ["c", "L", "clk"]

    compiled = {n for n in dir(stages) if not n.startswith("_") and is_stage(getattr(stages, n))}
    assert compiled == set(STAGES)
