"""Recurrent and hybrid memories (engine/recurrent.py): llama.cpp's sequence semantics for a
state that cannot be rewound, state save / restore, the hybrid's two parts."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from llamacpy.engine.batch import Batch, split_batch
from llamacpy.engine.memory import Memory
from llamacpy.engine.recurrent import HybridMemory, RecurrentMemory
from llamacpy.errors import UsageError


def _ub(pos, seq=0):
    b = Batch()
    for p in pos:
        b.add(100 + p, p, seq)
    return split_batch(b, len(pos))[0]


def _fill(mem, seq, n, start=0):
    """Decode positions [start, start + n) of ``seq`` and write a recognisable state."""
    sl = mem.prepare(_ub(range(start, start + n), seq))
    rec = mem.recr if isinstance(mem, HybridMemory) else mem
    rec.conv[:, seq] = seq + 1
    rec.ssm[:, seq] = 10 * (seq + 1) + start + n
    return sl


def test_both_kinds_implement_every_operation_of_the_interface() -> None:
    for cls in (RecurrentMemory, HybridMemory):
        assert issubclass(cls, Memory) and not cls.__abstractmethods__
        assert set(inspect.signature(cls.seq_rm).parameters) == {"self", "seq_id", "p0", "p1"}


def test_a_ubatch_gets_its_sequences_rows_and_fresh_sequences_start_zeroed() -> None:
    m = RecurrentMemory(2, 6, 8, n_seq_max=3)
    m.conv[:] = 7
    m.ssm[:] = 7
    b = Batch()
    for p in range(3):
        b.add(1, p, 2)
        b.add(1, p, 0)
    sl = m.prepare(split_batch(b, 6)[0])
    assert sl.rows.tolist() == [2, 0] * 3 and sl.rows.dtype == np.int32
    assert (m.conv[:, [0, 2]] == 0).all() and (m.ssm[:, [0, 2]] == 0).all()
    assert (m.conv[:, 1] == 7).all()  # untouched
    assert m.seq_pos_max_all() == {0: 2, 2: 2} and m.n_used == 2
    assert m.seq_pos_min(0) == m.seq_pos_max(0) == 2  # one state, one position
    m.conv[:, 0] = 5
    m.prepare(_ub([3], 0))  # a continuation keeps the state
    assert (m.conv[:, 0] == 5).all() and m.seq_pos_max(0) == 3


def test_a_token_of_several_sequences_is_refused() -> None:
    m = RecurrentMemory(1, 4, 4, n_seq_max=2)
    b = Batch()
    b.add(1, 0, [0, 1])
    with pytest.raises(UsageError, match="several sequences"):
        m.prepare(split_batch(b, 1)[0])


def test_seq_rm_as_llama_cpp_a_tail_is_refused_and_nothing_changes() -> None:
    m = RecurrentMemory(1, 4, 4, n_seq_max=2)
    _fill(m, 0, 10)
    before = m.get_state()
    assert m.seq_rm(0, 5, -1) is False  # a tail after position 0
    assert m.seq_rm(0, 9, 10) is False
    assert m.seq_rm(-1, 3, -1) is False  # part of every sequence
    after = m.get_state()
    assert all(np.array_equal(before[k], after[k]) for k in before)
    assert m.seq_rm(0, 10, -1) is True and m.seq_pos_max(0) == 9  # past the end: nothing
    assert m.seq_rm(0, 0, 5) is True and m.seq_pos_max(0) == 9  # last position not in range
    assert m.seq_rm(1, 3, -1) is True  # an empty sequence
    assert m.seq_rm(0, 0, -1) is True and m.seq_pos_max(0) == -1  # the whole sequence
    _fill(m, 0, 4)
    _fill(m, 1, 4)
    assert m.seq_rm(0) is True and m.seq_pos_max_all() == {1: 3}
    assert m.seq_rm(-1, -1, -1) is True and m.n_used == 0
    with pytest.raises(UsageError, match="seq_id 2"):
        m.seq_rm(2)


def test_seq_cp_copies_the_state_and_seq_keep_forgets_the_others() -> None:
    m = RecurrentMemory(2, 4, 6, n_seq_max=3)
    _fill(m, 0, 5)
    m.seq_cp(0, 2, 3, 4)  # the range is ignored, as in llama.cpp
    assert m.seq_pos_max(2) == 4
    assert np.array_equal(m.conv[:, 2], m.conv[:, 0]) and np.array_equal(m.ssm[:, 2], m.ssm[:, 0])
    m.conv[:, 0] = 99  # a copy, not a share
    assert (m.conv[:, 2] == 1).all()
    m.seq_cp(1, 2)  # an empty source empties the destination
    assert m.seq_pos_max(2) == -1
    _fill(m, 1, 2)
    m.seq_keep(1)
    assert m.seq_pos_max_all() == {1: 1}


def test_seq_add_and_seq_div_move_the_last_position_only() -> None:
    m = RecurrentMemory(1, 4, 4)
    _fill(m, 0, 8)
    ssm = m.ssm.copy()
    m.seq_add(0, 0, 5, 3)  # last position 7 not in [0, 5)
    assert m.seq_pos_max(0) == 7
    m.seq_add(0, 5, -1, -2)
    assert m.seq_pos_max(0) == 5
    m.seq_div(0, 0, -1, 2)
    assert m.seq_pos_max(0) == 2 and np.array_equal(m.ssm, ssm)


def test_n_keep_only_where_the_state_ends() -> None:
    m = RecurrentMemory(1, 4, 4)
    _fill(m, 0, 6)
    assert m.n_keep(0, 6) == 6
    assert m.n_keep(0, 5) == 0 and m.n_keep(0, 0) == 0


def test_state_round_trip_and_mismatches_are_named() -> None:
    m = RecurrentMemory(2, 4, 6, n_seq_max=3)
    _fill(m, 0, 3)
    _fill(m, 2, 5)
    st = {k: np.array(a) for k, a in m.get_state().items()}
    assert st["seq"].tolist() == [0, 2] and st["conv"].shape == (2, 2, 4)
    m2 = RecurrentMemory(2, 4, 6, n_seq_max=3)
    _fill(m2, 1, 2)
    m2.set_state(st)
    assert m2.seq_pos_max_all() == {0: 2, 2: 4}
    assert np.array_equal(m2.conv[:, [0, 2]], m.conv[:, [0, 2]])
    assert np.array_equal(m2.ssm[:, [0, 2]], m.ssm[:, [0, 2]])
    with pytest.raises(UsageError, match="different model"):
        RecurrentMemory(2, 4, 7, n_seq_max=3).set_state(st)
    with pytest.raises(UsageError, match="n_seq_max"):
        RecurrentMemory(2, 4, 6, n_seq_max=2).set_state(st)
    with pytest.raises(UsageError, match="missing field"):
        m2.set_state({"layout": st["layout"]})


def _hybrid(n_seq_max=2):
    return HybridMemory([True, True, True, False] * 2, 2, 32, 256, 12, 16, n_seq_max=n_seq_max)


def test_hybrid_layers_split_between_its_parts() -> None:
    h = _hybrid()
    assert h.attn.k.shape[0] == 2 and h.recr.conv.shape == (6, 2, 12)
    sl = _fill(h, 1, 5)
    assert sl.cells.tolist() == [0, 1, 2, 3, 4] and sl.rows.tolist() == [1] * 5
    assert sl.mask.shape == (5, 256)
    k, _, conv, _, info = h.forward_arrays()
    assert np.shares_memory(k, h.attn.k) and np.shares_memory(conv, h.recr.conv)
    assert conv.dtype == np.uint8 and conv.nbytes == h.recr.conv.nbytes
    assert info.tolist()[6:] == [6, 2, 12, 16]
    assert h.nbytes == h.attn.nbytes + h.recr.nbytes


def test_hybrid_seq_rm_asks_the_recurrent_part_first() -> None:
    h = _hybrid()
    _fill(h, 0, 10)
    assert h.seq_rm(0, 4, -1) is False
    assert h.attn.seq_pos_max(0) == 9 and h.recr.seq_pos_max(0) == 9  # neither changed
    assert h.n_keep(0, 4) == 0 and h.n_keep(0, 10) == 10
    assert h.seq_rm(0, 10, -1) is True and h.attn.n_used == 10
    assert h.seq_rm(0) is True and h.attn.n_used == 0 and h.recr.n_used == 0


def test_hybrid_positions_copy_keep_and_state() -> None:
    h = _hybrid(3)
    _fill(h, 0, 6)
    h.seq_cp(0, 2)
    assert h.seq_pos_max_all() == {0: 5, 2: 5} and h.seq_pos_min(2) == 5
    assert h.attn.seq_pos_min(2) == 0  # the attention part holds every position
    h.seq_keep(2)
    assert h.seq_pos_max_all() == {2: 5}
    st = {k: np.array(a) for k, a in h.get_state().items()}
    assert {k.split(".")[0] for k in st} == {"attn", "recr"}
    h2 = _hybrid(3)
    h2.set_state(st)
    assert h2.seq_pos_max_all() == {2: 5}
    assert np.array_equal(h2.recr.ssm[:, 2], h.recr.ssm[:, 2])
    with pytest.raises(UsageError, match="'recr' part"):
        h2.set_state({k: a for k, a in st.items() if k.startswith("attn.")})
    bad = dict(st, **{"recr.layout": np.array([6, 12, 17])})
    with pytest.raises(UsageError, match="different model"):
        h2.set_state(bad)
    assert h2.seq_pos_max_all() == {2: 5}  # unchanged after a refused state
