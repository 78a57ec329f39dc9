"""KV cache bookkeeping: sequence operations checked against a plain-Python model of cells
(hypothesis), the attention mask, slots and errors."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llamacpy.engine.batch import Batch, split_batch
from llamacpy.engine.kv_cache import KVCache, KVCacheFullError
from llamacpy.errors import UsageError

N_CTX, N_SEQ = 24, 3


class Model:
    """Cells as a list of (pos, set of seqs); free cells are None."""

    def __init__(self) -> None:
        self.cells: list[tuple[int, set[int]] | None] = [None] * N_CTX

    def used(self):
        return [c for c in self.cells if c is not None]

    def pos_max(self, s: int) -> int:
        return max((p for p, ss in self.used() if s in ss), default=-1)

    def place(self, s: int, n: int) -> None:
        p0 = self.pos_max(s) + 1
        free = [i for i, c in enumerate(self.cells) if c is None]
        for i, p in zip(free, range(p0, p0 + n)):
            self.cells[i] = (p, {s})

    def _sel(self, s: int, p0: int, p1: int):
        p0 = 0 if p0 < 0 else p0
        p1 = 2**31 if p1 < 0 else p1
        for i, c in enumerate(self.cells):
            if c is not None and p0 <= c[0] < p1 and (s < 0 or s in c[1]):
                yield i

    def seq_rm(self, s: int, p0: int, p1: int) -> None:
        for i in list(self._sel(s, p0, p1)):
            p, ss = self.cells[i]
            ss = set() if s < 0 else ss - {s}
            self.cells[i] = (p, ss) if ss else None

    def seq_cp(self, a: int, b: int, p0: int, p1: int) -> None:
        for i in list(self._sel(a, p0, p1)):
            self.cells[i][1].add(b)

    def seq_keep(self, s: int) -> None:
        for i, c in enumerate(self.cells):
            if c is not None:
                self.cells[i] = (c[0], {s}) if s in c[1] else None

    def seq_add(self, s: int, p0: int, p1: int, d: int) -> None:
        for i in list(self._sel(s, p0, p1)):
            p, ss = self.cells[i]
            self.cells[i] = (p + d, ss) if p + d >= 0 else None

    def seq_div(self, s: int, p0: int, p1: int, d: int) -> None:
        for i in list(self._sel(s, p0, p1)):
            p, ss = self.cells[i]
            self.cells[i] = (p // d, ss)


def _state(kv: KVCache) -> Counter:
    out = Counter()
    for c in np.nonzero(kv.pos >= 0)[0]:
        seqs = frozenset(s for s in range(N_SEQ) if kv._has(s)[c])
        out[(int(kv.pos[c]), seqs)] += 1
    return out


def _model_state(m: Model) -> Counter:
    return Counter((p, frozenset(ss)) for p, ss in m.used())


seq = st.integers(0, N_SEQ - 1)
bound = st.integers(-1, 12)
op = st.one_of(
    st.tuples(st.just("place"), seq, st.integers(1, 4)),
    st.tuples(st.just("rm"), st.integers(-1, N_SEQ - 1), bound, bound),
    st.tuples(st.just("cp"), seq, seq, bound, bound),
    st.tuples(st.just("keep"), seq),
    st.tuples(st.just("add"), seq, bound, bound, st.integers(-6, 6)),
    st.tuples(st.just("div"), seq, bound, bound, st.integers(1, 3)),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(op, max_size=25))
def test_sequence_ops_match_a_model_of_cells(ops) -> None:
    kv = KVCache(1, 1, 32, N_CTX, "f32", "f32", N_SEQ)
    m = Model()
    for o in ops:
        name, args = o[0], o[1:]
        if name == "place":
            s, n = args
            if sum(c is None for c in m.cells) < n:
                continue
            p0 = kv.seq_pos_max(s) + 1
            kv.place(split_batch(Batch.from_tokens([0] * n, pos0=p0, seq_id=s), 64)[0])
            m.place(s, n)
        else:
            getattr(kv, "seq_" + name)(*args)
            getattr(m, "seq_" + name)(*args)
        assert _state(kv) == _model_state(m), (name, args)
        for s in range(N_SEQ):
            assert kv.seq_pos_max(s) == m.pos_max(s)
        assert kv.n_used == len(m.used())


def test_mask_is_causal_and_per_sequence() -> None:
    kv = KVCache(1, 1, 32, 16, n_seq_max=2)
    kv.place(split_batch(Batch.from_tokens([1, 2, 3], seq_id=0), 16)[0])
    b = Batch()
    b.add(4, 0, 1).add(5, 3, 0).add(6, 1, 1)
    ub = split_batch(b, 16)[0]
    cells = kv.place(ub)
    mask = kv.mask(ub, 16)
    # token 0: seq 1 at pos 0 sees only itself; token 1: seq 0 pos 3 sees 0..3 of seq 0
    assert set(np.nonzero(mask[0])[0]) == {cells[0]}
    assert set(np.nonzero(mask[1])[0]) == {0, 1, 2, cells[1]}
    assert set(np.nonzero(mask[2])[0]) == {cells[0], cells[2]}


def test_shared_cells_after_seq_cp() -> None:
    kv = KVCache(1, 1, 32, 16, n_seq_max=2)
    kv.place(split_batch(Batch.from_tokens([1, 2, 3], seq_id=0), 16)[0])
    kv.seq_cp(0, 1, -1, -1)
    assert kv.n_used == 3 and kv.seq_pos_max(1) == 2
    kv.seq_rm(0, -1, -1)
    assert kv.n_used == 3 and kv.seq_pos_max(0) == -1
    kv.seq_rm(1, 1, -1)
    assert kv.n_used == 1


def test_n_kv_is_padded_like_ggml() -> None:
    kv = KVCache(1, 1, 32, 1024)
    assert kv.n_kv() == 256
    kv.place(split_batch(Batch.from_tokens(list(range(300))), 512)[0])
    assert kv.n_kv() == 512


def test_full_cache_and_bad_arguments_are_clear_errors() -> None:
    kv = KVCache(1, 1, 32, 4)
    kv.place(split_batch(Batch.from_tokens([1, 2, 3]), 8)[0])
    with pytest.raises(KVCacheFullError, match="KV cache is full: 2 tokens need cells but only 1"):
        kv.place(split_batch(Batch.from_tokens([1, 2], pos0=3), 8)[0])
    with pytest.raises(UsageError, match="seq_id 5 is out of range"):
        kv.seq_cp(0, 5)
    with pytest.raises(UsageError, match="unknown KV cache type 'q4'"):
        KVCache(1, 1, 32, 4, type_k="q4")
    with pytest.raises(UsageError, match="multiple of 32"):
        KVCache(1, 1, 48, 4, type_k="q8_0")


def test_state_round_trip_and_layout_check() -> None:
    kv = KVCache(2, 1, 32, N_CTX, "f16", "f16", N_SEQ)
    for ub in split_batch(Batch.from_tokens([5, 6, 7], seq_id=1), 8):
        cells = kv.place(ub)
        kv.k[:, :, cells] = 7
    kv.seq_rm(1, 0, 1)
    state = kv.get_state()
    assert state["pos"].tolist() == [1, 2]
    other = KVCache(2, 1, 32, N_CTX, "f16", "f16", N_SEQ)
    other.set_state(state)
    assert other.seq_pos_max(1) == 2 and other.seq_pos_min(1) == 1 and other.n_used == 2
    assert (other.k[:, :, :2] == 7).all()
    wrong = KVCache(2, 1, 32, N_CTX, "q8_0", "f16", N_SEQ)
    wrong.place(split_batch(Batch.from_tokens([1]), 8)[0])
    with pytest.raises(UsageError, match="different model or cache type"):
        wrong.set_state(state)
    assert wrong.n_used == 1  # untouched
    with pytest.raises(UsageError, match="missing field"):
        other.set_state({"pos": state["pos"]})


def test_cell_search_starts_where_llama_cpp_starts_it():
    """llama.cpp's head rules: seq_rm/seq_keep move the search start back to the first freed
    cell, seq_add restarts it (at a freed cell or 0), and a search starts over at 0 when more
    than ``used + 2 * n_tokens`` cells precede the head. Placement decides which cells the
    attention covers (n_kv, the decode split), hence the logits."""
    from llamacpy.engine.batch import split_batch
    from llamacpy.engine.kv_cache import KVCache

    def add(kv, n, p0, seq=0):
        b = Batch()
        for p in range(p0, p0 + n):
            b.add(7, p, seq)
        return kv.place(split_batch(b, 512)[0])

    kv = KVCache(1, 1, 64, 1024, n_seq_max=2)  # head_dim 64, 1024 cells
    assert add(kv, 80, 0).tolist() == list(range(80))
    kv.seq_rm(0, 1, -1)  # a new request keeps the common prefix (one token)
    assert kv.head == 1
    assert add(kv, 5, 1).tolist() == [1, 2, 3, 4, 5]
    add(kv, 300, 6)  # cells 6..305
    kv.seq_rm(0, 200, -1)  # frees 200..305: head (306) moves back
    assert kv.head == 200
    kv.head = 700  # far past the used cells: the search starts over
    assert add(kv, 10, 200).tolist() == list(range(200, 210))
    kv.seq_add(0, 0, -1, 3)  # nothing freed: search from 0
    assert kv.head == 0
    add(kv, 4, 500, seq=1)
    kv.seq_keep(0)  # frees seq 1's cells (210..213): head back to 210
    assert kv.head == 210
