"""The sliding-window cache (engine/iswa.py, llama.cpp's iSWA): its size, llama.cpp's rule
for taking window cells again and purging what a sequence can no longer use, the two parts
behind one memory, a tiny gemma3 model whose window cache wraps many times against the
numpy reference and against a full-size cache, prefix reuse that respects the window, and
Gemma-3-270M's logits bit for bit against llama.cpp's where its window cache wraps
(``scripts/make_iswa_fixtures.py``)."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from llamacpy.api.generation import Session
from llamacpy.engine import Batch, Context, ContextParams
from llamacpy.engine.batch import split_batch
from llamacpy.engine.iswa import ISWACache, swa_cache_size
from llamacpy.engine.kv_cache import KVCache
from llamacpy.errors import UsageError
from llamacpy.gguf import GGMLType
from llamacpy.models.reference import Reference
from llamacpy.models.tiny import write_tiny_llama

FIX = Path(__file__).parent / "fixtures" / "engine"
TOKENS = np.random.default_rng(11).integers(3, 259, 400).tolist()


def _ub(pos: list[int], seq: int = 0):
    b = Batch()
    for p in pos:
        b.add(100 + p, p, seq)
    return split_batch(b, len(pos))[0]


def _run(kv, start: int, n: int, seq: int = 0):
    return kv.place(_ub(list(range(start, start + n)), seq)).tolist()


def test_window_part_size_is_llama_cpps() -> None:
    # pad256(min(n_ctx, n_swa * n_seq_max + n_ubatch)); full: n_ctx
    assert swa_cache_size(2048, 512, 1, 512, False) == 1024
    assert swa_cache_size(4096, 512, 1, 256, False) == 768
    assert swa_cache_size(4096, 512, 2, 512, False) == 1536
    assert swa_cache_size(512, 512, 1, 512, False) == 512
    assert swa_cache_size(128, 4, 1, 512, False) == 256  # padded past n_ctx, as llama.cpp
    assert swa_cache_size(4096, 512, 1, 512, True) == 4096


def test_window_cells_are_taken_again_as_a_ring() -> None:
    kv = KVCache(1, 1, 32, 8, n_swa=4)
    assert _run(kv, 0, 4) == [0, 1, 2, 3]
    assert _run(kv, 4, 4) == [4, 5, 6, 7]
    # positions 0..4 are 4 or more behind the next position (8): cells 0..3 from the head (0)
    assert _run(kv, 8, 4) == [0, 1, 2, 3]
    assert _run(kv, 12, 4) == [4, 5, 6, 7]
    assert sorted(kv.pos.tolist()) == list(range(8, 16))
    ub = _ub([16])
    assert _run(kv, 16, 1) == [0]  # position 8 (cell 0) left the window of 16
    m = kv.mask(ub, 8, 4)[0]
    assert [int(kv.pos[c]) for c in np.flatnonzero(m)] == [16, 13, 14, 15]


def test_a_cell_of_two_sequences_or_inside_the_window_is_not_taken() -> None:
    kv = KVCache(1, 1, 32, 8, n_seq_max=2, n_swa=2)
    _run(kv, 0, 6)
    kv.seq_cp(0, 1, 0, 1)  # position 0 is shared: its cell stays
    assert _run(kv, 6, 3) == [6, 7, 1]
    assert kv.pos.tolist() == [0, 8, 2, 3, 4, 5, 6, 7]


def test_taking_a_newer_cell_purges_the_older_positions() -> None:
    """llama.cpp keeps an unbroken run of positions per sequence: when the search takes a
    cell of position p, every older position of that sequence goes too."""
    kv = KVCache(1, 1, 32, 8, n_swa=2)
    pos = np.array([5, 2, 3, 4, 6, 7, -1, -1], np.int32)
    used = pos >= 0
    state = kv.get_state()
    state.update(
        k=np.zeros((1, 1, 6, kv.row_bytes), np.uint8), v=np.zeros((1, 1, 6, kv.row_bytes), np.uint8),
        pos=pos[used], seq=np.ones((6, 1), np.uint64), shift=np.zeros(6, np.int32),
    )  # fmt: skip
    kv.set_state(state)  # cells 0..5 hold positions 5, 2, 3, 4, 6, 7; the head is at 6
    kv.head = 0
    assert _run(kv, 8, 1) == [0]  # position 5 (<= 7 + 1 - 2) is the first usable cell
    assert kv.pos.tolist() == [8, -1, -1, -1, 6, 7, -1, -1]  # 2, 3, 4 were purged
    assert kv.seq_pos_min(0) == 6 and kv.seq_pos_max(0) == 8 and kv.head == 1


def test_a_single_sequence_always_keeps_its_window() -> None:
    kv = KVCache(1, 1, 32, 24, n_swa=5)
    rng = np.random.default_rng(0)
    p = 0
    while p < 400:
        n = int(rng.integers(1, 20))
        _run(kv, p, n)
        p += n
        held = np.sort(kv.pos[kv.pos >= 0])
        assert held[-1] == p - 1
        np.testing.assert_array_equal(held, np.arange(held[0], p))  # unbroken
        assert held[0] <= max(0, p - 4)  # the window of the next token is there


def _iswa(**kw) -> ISWACache:
    layers = (True, True, False, True)
    return ISWACache(layers, 2, 32, 512, 4, n_ubatch=8, n_seq_max=2, **kw)


def test_iswa_parts_have_their_own_heads_and_rows() -> None:
    """gemma4: the global and the window part each with its KV heads and head size (row
    bytes: the global part's in ``info[2]``, the window part's in ``info[5]``)."""
    kv = ISWACache((True, True, False, True), (1, 2), (64, 32), 512, 4, n_ubatch=8)
    assert kv.base.k.shape[:2] == (1, 1) and kv.swa.k.shape[:2] == (3, 2)
    assert (kv.base.head_dim, kv.swa.head_dim) == (64, 32)
    info = kv.forward_arrays()[-1].tolist()
    assert info[2] == kv.base.row_bytes == 128 and info[5] == kv.swa.row_bytes == 64


def test_iswa_cache_has_a_global_and_a_window_part() -> None:
    kv = _iswa()
    assert kv.base.k.shape[:3] == (1, 2, 512) and kv.swa.k.shape[:3] == (3, 2, 256)
    assert kv.swa.n_swa == 4 and kv.base.n_swa == 0
    assert _iswa(swa_full=True).swa.n_ctx == 512
    k, v, ks, vs, info = kv.forward_arrays()
    assert np.shares_memory(k, kv.base.k) and np.shares_memory(ks, kv.swa.k)
    assert np.shares_memory(v, kv.base.v) and np.shares_memory(vs, kv.swa.v)
    assert info.tolist()[3:] == [512, 256, kv.swa.row_bytes]
    p = 0
    for n in (100, 100, 100, 1, 1):
        sl = kv.prepare(_ub(list(range(p, p + n))))
        p += n
        assert sl.cells.tolist() == list(range(p - n, p))  # the global part never wraps
        assert sl.mask.shape == (n, sl.n_kv) and sl.mask_swa.shape == (n, sl.n_kv_swa)
    assert sl.n_kv == 512 and sl.n_kv_swa == 256
    assert kv.base.n_used == 302 and kv.swa.n_used <= 256 and kv.n_used == 302
    assert kv.seq_pos_max(0) == 301
    # a continuation can go back only as far as the window part still holds
    assert kv.swa.seq_pos_min(0) == 46  # 0..43 went with the third ubatch, 44, 45 after
    assert kv.n_keep(0, 301) == 301 and kv.n_keep(0, 50) == 50 and kv.n_keep(0, 49) == 0
    kv.seq_cp(0, 1)
    assert kv.base.seq_pos_max(1) == kv.swa.seq_pos_max(1) == 301
    assert kv.seq_rm(0, 200, -1)
    assert kv.base.seq_pos_max(0) == kv.seq_pos_max(0) == 199


def test_iswa_state_round_trips_and_refuses_a_plain_cache_state() -> None:
    kv = _iswa()
    for p in range(0, 300, 50):
        kv.prepare(_ub(list(range(p, p + 50))))
    kv.swa.k[:] = 3
    state = kv.get_state()
    other = _iswa()
    other.set_state(state)
    for a, b in ((kv.base, other.base), (kv.swa, other.swa)):
        sel = a.pos >= 0
        assert sorted(a.pos[sel].tolist()) == sorted(b.pos[b.pos >= 0].tolist())
    assert other.seq_pos_max(0) == 299 and int(other.swa.k[0, 0, 0, 0]) == 3
    plain = KVCache(4, 2, 32, 512).get_state()
    with pytest.raises(UsageError, match="'base' part"):
        other.set_state(plain)
    bad = {**state, "swa.layout": np.zeros(5, np.int64)}
    with pytest.raises(UsageError, match="different model"):
        other.set_state(bad)
    assert other.seq_pos_max(0) == 299  # a refused state changes nothing


# ---------------------------------------------------------------------- a tiny gemma3
@pytest.fixture(scope="module")
def gemma(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("iswa") / "gemma3.gguf"
    write_tiny_llama(path, GGMLType.F32, seed=7, arch="gemma3")  # window of 4
    return path


def _ctx(path: Path, **kw) -> Context:
    p = {"n_ctx": 1024, "n_batch": 8, "n_ubatch": 8, "n_threads": 2, "kernel_formats": "all"}
    return Context(path, ContextParams(**{**p, **kw}))


def _prompt(ctx: Context, tokens) -> np.ndarray:
    """Logits of every token: ubatches of 8, then single tokens from 384 on."""
    rows = []
    for a in range(0, 384, 8):
        rows.append(ctx.decode(Batch.from_tokens(tokens[a : a + 8], pos0=a, logits="all")))
    for p in range(384, len(tokens)):
        rows.append(ctx.decode(Batch.from_tokens([tokens[p]], pos0=p)))
    return np.concatenate(rows)


def test_tiny_gemma3_window_cache_matches_reference_and_full_cache(gemma, monkeypatch) -> None:
    ctx = _ctx(gemma)
    assert isinstance(ctx.kv, ISWACache) and ctx.kv.swa.n_ctx == 256  # wraps past 256
    model, ref = ctx.model, Reference(ctx.model)
    compiled, worst = model.forward, []

    def both(ws, ub, kv, n_threads, deterministic=False):
        copies = {id(a): a.copy() for a in kv[:4]}
        want = ref.forward(ub, (*(copies[id(a)] for a in kv[:4]), kv[4]), n_threads)
        got = compiled(ws, ub, kv, n_threads, deterministic)
        worst.append(float(np.abs(got - want).max() / np.abs(want).max()))
        return got

    monkeypatch.setattr(model, "forward", both)
    got = _prompt(ctx, TOKENS)
    monkeypatch.undo()
    assert max(worst) < 2e-3, max(worst)
    full = _prompt(_ctx(gemma, swa_full=True), TOKENS)
    assert full.shape == got.shape == (len(TOKENS), model.hparams.n_vocab)
    # the same attention over the same cells in another order (from position 256 on, where
    # the window part wraps): ggml's f16 cache sums V rows in f16, so the order shows at
    # f16 precision (the numpy reference moves as much: 8.7e-4 of max|logit|)
    rel = np.abs(got - full).max(-1) / np.abs(full).max(-1)
    assert rel[:256].max() == 0.0 and rel.max() < 5e-3
    assert (got.argmax(-1) == full.argmax(-1)).all()
    assert ctx.kv.swa.n_used <= 256 and ctx.kv.base.n_used == len(TOKENS)


def test_prefix_reuse_goes_back_only_within_the_window(gemma) -> None:
    ctx = _ctx(gemma, n_batch=64)
    s = Session(ctx, None)
    s.ingest(TOKENS[:380])
    fresh = _ctx(gemma, n_batch=64)
    # a prompt that leaves the cached sequence at 100: the window part no longer holds
    # positions 96..99, so everything is decoded again, exactly as on a fresh context
    s.ingest(TOKENS[:100] + TOKENS[200:260])
    assert s.n_decoded == 380 + 160 and s.tokens == TOKENS[:100] + TOKENS[200:260]
    want = Session(fresh, None)
    want.ingest(TOKENS[:100] + TOKENS[200:260])
    np.testing.assert_array_equal(s.last_logits, want.last_logits)
    # going back a little (inside the window) keeps the prefix
    s.ingest(TOKENS[:100] + TOKENS[200:258] + [5, 6])
    assert s.n_decoded == 380 + 160 + 2
    want.ingest(TOKENS[:100] + TOKENS[200:258] + [5, 6])
    rel = np.abs(s.last_logits - want.last_logits).max() / np.abs(want.last_logits).max()
    assert rel < 1e-4


# ---------------------------------------------------------------------- Gemma-3 vs llama.cpp
@pytest.mark.real_model
@pytest.mark.slow
def test_gemma3_window_cache_logits_are_llama_cpps_bit_for_bit(gemma3_path: Path) -> None:
    fx = np.load(FIX / "gemma3_iswa.npz")
    tokens, rows = fx["tokens"].tolist(), fx["rows"]
    n_prompt = int(rows[-1]) + 1 - 8
    differ = [a != b for a, b in zip(fx["iswa_sha"], fx["full_sha"], strict=True)]
    assert sum(differ) >= 4  # the fixture tells the two caches apart
    for full in (False, True):
        p = ContextParams(n_ctx=2048, n_batch=512, n_ubatch=512, n_threads=2, swa_full=full)
        ctx = Context(gemma3_path, p)
        assert ctx.kv.swa.n_ctx == (2048 if full else 1024)
        out = []
        for a in range(0, n_prompt, 512):
            out.append(ctx.decode(Batch.from_tokens(tokens[a : a + 512], pos0=a)))
        for p_ in range(n_prompt, len(tokens)):
            out.append(ctx.decode(Batch.from_tokens([tokens[p_]], pos0=p_)))
        got = np.concatenate(out)  # the last row of each batch, then each decoded token
        key = "full" if full else "iswa"
        np.testing.assert_array_equal(got[:, : fx[f"{key}_head"].shape[1]], fx[f"{key}_head"])
        sha = [hashlib.sha256(np.ascontiguousarray(r).tobytes()).hexdigest() for r in got]
        assert sha == fx[f"{key}_sha"].tolist()
        del ctx


def test_replace_keeps_ubatch_arrays_a_dataclass() -> None:
    # the recorder of test_reference swaps a ubatch's attention modes this way
    from llamacpy.models.common import UBatchArrays

    ub = UBatchArrays(np.zeros(1, np.int32), np.zeros(1, np.int32), np.zeros(1, np.int32),
                      np.ones((1, 1), np.uint8), 1, np.zeros(1, np.int32))  # fmt: skip
    assert replace(ub, mode=2).mode == 2 and replace(ub, mode=2).cells_swa is None
