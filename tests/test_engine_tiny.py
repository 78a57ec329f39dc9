"""The engine on tiny random llama models (rebuilt from a seed): logits vs llama.cpp for every
weight format and rope variant, the compiled forward vs its numpy twin, and the engine's
contracts (cached decode, multi-sequence batches, sequence ops, threads, cache types,
bad input)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from llamacpy.engine import Batch, BatchError, Context, ContextParams, KVCacheFullError
from llamacpy.engine.batch import split_batch
from llamacpy.gguf import GGMLType
from llamacpy.models.common import UBatchArrays
from llamacpy.models.reference import Reference
from llamacpy.models.tiny import write_tiny_llama
from llamacpy.ops import traits

FIX = np.load(Path(__file__).parent / "fixtures" / "engine" / "tiny_logits.npz")
TOKENS = FIX["tokens"].tolist()
SEED = 1
# exact where ggml's order is reproduced (see qdot_legacy); float order elsewhere
TOL = {GGMLType.Q2_K: 5e-3, GGMLType.F32: 2e-3, GGMLType.F16: 2e-3, GGMLType.BF16: 3e-3}
TOL[GGMLType.MXFP4] = 0.0  # bit-identical to llama.cpp's


def _params(**kw) -> ContextParams:
    kw = {"n_ctx": 64, "n_threads": 2, "kernel_formats": "all", **kw}
    return ContextParams(**kw)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tiny")


def tiny(tiny_dir: Path, t: GGMLType, rope: str = "none") -> Path:
    name = t.name if rope == "none" else f"rope_{rope}"
    path = tiny_dir / f"{name}.gguf"
    if not path.exists():
        write_tiny_llama(path, t, seed=SEED, rope=rope)
    return path


@pytest.mark.parametrize("t", list(traits.supported_types()), ids=lambda t: t.name)
def test_every_format_matches_llama_cpp(tiny_dir: Path, t: GGMLType) -> None:
    path = tiny(tiny_dir, t)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == str(FIX[f"{t.name}_sha256"])
    ctx = Context(path, _params())
    got = ctx.decode(Batch.from_tokens(TOKENS, logits="all"))
    want = FIX[f"{t.name}_logits"]
    tol = TOL.get(t, 2e-6) * np.abs(want).max()
    np.testing.assert_allclose(got, want, rtol=0, atol=tol)
    assert (got.argmax(-1) == want.argmax(-1)).all()


# formats whose llama.cpp kernels change with the token count (vec_dot under 8 tokens, the
# tiled kernels from 8): fixtures at the default ubatch and at ubatch 1
UB1_TYPES = [t for t in traits.supported_types() if f"{t.name}_logits_ub1" in FIX.files]


@pytest.mark.parametrize("t", UB1_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n_ubatch", [512, 1])
@pytest.mark.parametrize("n_threads", [1, 2])
def test_grid_formats_are_bit_identical_at_every_ubatch(
    tiny_dir: Path, t: GGMLType, n_ubatch: int, n_threads: int
) -> None:
    ctx = Context(tiny(tiny_dir, t), _params(n_ubatch=n_ubatch, n_threads=n_threads))
    got = ctx.decode(Batch.from_tokens(TOKENS, logits="all"))
    want = FIX[f"{t.name}_logits" if n_ubatch > 1 else f"{t.name}_logits_ub1"]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("rope", ["linear", "yarn", "llama3"])
def test_rope_scaling_matches_llama_cpp(tiny_dir: Path, rope: str) -> None:
    path = tiny(tiny_dir, GGMLType.Q8_0, rope)
    ctx = Context(path, _params())
    got = ctx.decode(Batch.from_tokens(TOKENS, logits="all"))
    np.testing.assert_array_equal(got, FIX[f"rope_{rope}_logits"])


def _reference_logits(ctx: Context, tokens, kv_types=None):
    """The numpy twin on a fresh cache of the same layout."""
    ctx.clear()
    ub = split_batch(Batch.from_tokens(tokens, logits="all"), 512)[0]
    sl = ctx.kv.prepare(ub)
    arrays = UBatchArrays(ub.token, ub.pos, sl.cells, sl.mask, sl.n_kv, ub.out_idx)
    out = Reference(ctx.model).forward(arrays, ctx.kv.forward_arrays(), ctx.n_threads)
    ctx.clear()
    return out


@pytest.mark.parametrize("cache", ["f16", "f32", "q8_0"])
def test_compiled_forward_matches_numpy_twin(tiny_dir: Path, cache: str) -> None:
    ctx = Context(tiny(tiny_dir, GGMLType.Q4_K), _params(type_k=cache, type_v=cache))
    want = _reference_logits(ctx, TOKENS)
    got = ctx.decode(Batch.from_tokens(TOKENS, logits="all"))
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-3 * np.abs(want).max())


def test_cached_decode_equals_one_full_forward(tiny_dir: Path) -> None:
    ctx = Context(tiny(tiny_dir, GGMLType.Q4_1), _params())
    full = ctx.decode(Batch.from_tokens(TOKENS, logits="all"))
    ctx.clear()
    steps = [ctx.decode(Batch.from_tokens([t], pos0=i))[0] for i, t in enumerate(TOKENS)]
    np.testing.assert_array_equal(np.stack(steps), full)


def test_two_sequences_in_one_batch_equal_each_alone(tiny_dir: Path) -> None:
    a, b = TOKENS[:6], [7, 80, 90, 100]
    ctx = Context(tiny(tiny_dir, GGMLType.Q8_0), _params(n_seq_max=2))
    alone = []
    for toks in (a, b):
        ctx.clear()
        first = ctx.decode(Batch.from_tokens(toks))[0]
        nxt = ctx.decode(Batch.from_tokens([5], pos0=len(toks)))[0]
        alone.append((first, nxt))
    ctx.clear()
    batch = Batch()
    for i in range(max(len(a), len(b))):  # interleaved
        if i < len(a):
            batch.add(a[i], i, 0, i == len(a) - 1)
        if i < len(b):
            batch.add(b[i], i, 1, i == len(b) - 1)
    first = ctx.decode(batch)  # rows in batch order: b's last token comes before a's
    step = ctx.decode(Batch().add(5, len(a), 0, True).add(5, len(b), 1, True))
    np.testing.assert_array_equal(first[1], alone[0][0])
    np.testing.assert_array_equal(first[0], alone[1][0])
    for s in range(2):
        np.testing.assert_array_equal(step[s], alone[s][1])


def test_seq_rm_then_redecode_and_seq_cp(tiny_dir: Path) -> None:
    ctx = Context(tiny(tiny_dir, GGMLType.Q4_0), _params(n_seq_max=2))
    full = ctx.decode(Batch.from_tokens(TOKENS, logits="all"))
    ctx.seq_rm(0, 5, -1)
    again = ctx.decode(Batch.from_tokens(TOKENS[5:], pos0=5, logits="all"))
    np.testing.assert_array_equal(again, full[5:])
    ctx.seq_rm(0, 8, -1)
    ctx.seq_cp(0, 1)  # sequence 1 shares the first 8 cells
    one = ctx.decode(Batch.from_tokens(TOKENS[8:], pos0=8, seq_id=1, logits="all"))
    np.testing.assert_array_equal(one, full[8:])


@pytest.mark.parametrize("cache", ["f32", "f16", "q8_0"])
def test_seq_add_shift_keeps_attention_relative(tiny_dir: Path, cache: str) -> None:
    # rope makes attention depend on relative positions only: moving a whole sequence by
    # +5 (the keys are re-roped) must not change what comes next, up to rounding (q8_0: the
    # keys are stored rotated, so the shift rotates them back, ropes and rotates again)
    ctx = Context(tiny(tiny_dir, GGMLType.Q8_0), _params(type_k=cache, type_v=cache))
    fresh = ctx.decode(Batch.from_tokens(TOKENS[:9]))[0]
    ctx.clear()
    ctx.decode(Batch.from_tokens(TOKENS[:8]))
    ctx.seq_add(0, 0, -1, 5)
    assert ctx.kv.seq_pos_max(0) == 12
    shifted = ctx.decode(Batch.from_tokens([TOKENS[8]], pos0=13))[0]
    # f16 and q8_0 keys are re-rounded; f32 ones are read rounded to f16 by attention (as
    # llama.cpp casts them before flash attention)
    tol = 5e-2 * np.abs(fresh).max()
    np.testing.assert_allclose(shifted, fresh, rtol=0, atol=tol)
    ctx.seq_add(0, 0, 13, -20)  # positions moved below 0 free their cells
    assert ctx.kv.n_used == 1 and ctx.kv.seq_pos_max(0) == 13


@pytest.mark.parametrize("n", [1, 20, 70])  # rows, rows, tiled attention
def test_thread_count_does_not_change_results(tiny_dir: Path, n: int) -> None:
    path = tiny(tiny_dir, GGMLType.Q5_0)
    toks = (TOKENS * 8)[:n]
    out = []
    for nth in (1, 2):
        ctx = Context(path, _params(n_threads=nth, n_threads_batch=nth, n_ctx=128))
        out.append(ctx.decode(Batch.from_tokens(toks, logits="all")))
    np.testing.assert_array_equal(out[0], out[1])


def test_ubatch_split_matches_one_ubatch(tiny_dir: Path) -> None:
    path = tiny(tiny_dir, GGMLType.IQ4_NL)
    toks = (TOKENS * 3)[:25]
    one = Context(path, _params()).decode(Batch.from_tokens(toks, logits="all"))
    many = Context(path, _params(n_ubatch=8)).decode(Batch.from_tokens(toks, logits="all"))
    np.testing.assert_array_equal(one, many)


def test_no_mmap_and_mlock_give_the_same_model(tiny_dir: Path) -> None:
    path = tiny(tiny_dir, GGMLType.Q6_K)
    a = Context(path, _params()).decode(Batch.from_tokens(TOKENS))
    b = Context(path, _params(use_mmap=False, use_mlock=True)).decode(Batch.from_tokens(TOKENS))
    np.testing.assert_array_equal(a, b)


def test_bad_input_is_a_clear_error(tiny_dir: Path) -> None:
    ctx = Context(tiny(tiny_dir, GGMLType.Q8_0), _params(n_ctx=16, n_batch=8, n_seq_max=2))
    cases = [
        (Batch.from_tokens([1, 259]), "token\\[1\\] = 259 is not in the vocabulary"),
        (Batch.from_tokens([1, -2]), "token\\[1\\] = -2 is not in the vocabulary"),
        (Batch.from_tokens([1], pos0=16), "pos\\[0\\] = 16 is outside the context"),
        (Batch.from_tokens(list(range(9))), "9 tokens, more than n_batch = 8"),
        (Batch.from_tokens([1], seq_id=2), "seq_id 2 of token 0 is out of range"),
        (Batch().add(1, 0).add(2, 2), "not consecutive"),
        (Batch(), "empty"),
    ]
    for batch, msg in cases:
        with pytest.raises(BatchError, match=msg):
            ctx.decode(batch)
    ctx.decode(Batch.from_tokens([1, 2, 3]))
    with pytest.raises(BatchError, match="continues at pos 5.*next pos 3"):
        ctx.decode(Batch.from_tokens([4], pos0=5))
    for i in range(3, 16, 4):
        ctx.decode(Batch.from_tokens([1] * min(4, 16 - i), pos0=i))
    with pytest.raises(KVCacheFullError):
        ctx.decode(Batch.from_tokens([1], pos0=0, seq_id=1))


def test_background_weight_copy_equals_the_synchronous_one(tiny_dir: Path) -> None:
    from llamacpy.models import load_model

    path = tiny(tiny_dir, GGMLType.Q4_K)
    sync = load_model(path, background=False).store
    bg = load_model(path, background=True).store
    assert not sync.pending
    for a, b in zip(sync.arrays_unchecked(), (bg.buf, bg.desc, bg.fbuf), strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert not bg.pending


def test_a_failed_background_weight_copy_is_a_model_error(tiny_dir: Path, monkeypatch) -> None:
    from llamacpy.errors import ModelError
    from llamacpy.models.weights import TensorSource

    def broken(self, shard, offset, nbytes):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(TensorSource, "span", broken)
    ctx = Context(tiny(tiny_dir, GGMLType.Q8_0), _params())  # checks pass, the copy fails
    with pytest.raises(ModelError, match="loading the weights failed: .*Input/output error"):
        ctx.decode(Batch.from_tokens(TOKENS[:2]))
    with pytest.raises(ModelError):  # and keeps failing, no half-copied weights used
        ctx.decode(Batch.from_tokens(TOKENS[:2]))
