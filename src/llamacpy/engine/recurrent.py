"""Recurrent-state memory (llama.cpp's ``llama_memory_recurrent``) and the hybrid memory of
models mixing recurrent and attention layers (``llama_memory_hybrid``).

:class:`RecurrentMemory` keeps, per sequence and per recurrent layer, one row of
convolution state (the last ``d_conv - 1`` inputs of the short causal convolution) and one
row of SSM / delta-rule state, both float32, plus the sequence's last position. A state
summarises every position up to that one, so it cannot be rewound:

* ``seq_rm`` of the whole sequence (or of a range holding its last position and starting
  at 0) forgets it; removing a tail that starts after position 0 and reaches its last
  position returns False and changes nothing (llama.cpp without rollback states); a range
  past its last position removes nothing and returns True;
* ``seq_cp`` copies the source's state and position to the destination (the range is
  ignored, as in llama.cpp); an empty source empties the destination;
* ``seq_add`` / ``seq_div`` move the last position when it is in the range (the state does
  not depend on positions);
* a sequence's first and last positions are both its last one (one state, one position).

A sequence is zeroed when a ubatch starts it (its first token placed while it holds no
state). Every token of a ubatch belongs to one sequence: a token shared by several
sequences would need one state for all of them (refused with a ``UsageError``).

:class:`HybridMemory` pairs a :class:`~.kv_cache.KVCache` for the attention layers with a
:class:`RecurrentMemory` for the recurrent ones; a ``seq_rm`` is tried on the recurrent part
first and the attention part is changed only when it succeeded. Its ``forward_arrays`` are
``(k, v, conv, ssm, info)``: the second pair of the tuple, which an iSWA cache fills with
its sliding-window part, holds the recurrent part (float32 rows as bytes), and its
:class:`~.memory.Slots` carry each token's state row in ``rows``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import UsageError
from ..models.common import lazy_zeros
from .batch import UBatch, distinct
from .kv_cache import KVCache
from .memory import Memory, PairedMemory, Slots, state_fields

_POS_END = np.iinfo(np.int32).max


def _range(p0: int, p1: int) -> tuple[int, int]:
    """llama.cpp's open bounds: a negative start is 0, a negative end is the end."""
    return (0 if p0 < 0 else p0), (_POS_END if p1 < 0 else p1)


class RecurrentMemory(Memory):
    """Per-sequence convolution and SSM states of every recurrent layer (see the module
    docstring). ``conv_size`` / ``ssm_size``: floats of one layer's row of each."""

    def __init__(
        self,
        n_layer: int,
        conv_size: int,
        ssm_size: int,
        n_seq_max: int = 1,
        zeros=lazy_zeros,
    ) -> None:
        if n_layer < 1 or conv_size < 1 or ssm_size < 0 or n_seq_max < 1:
            raise UsageError(
                "a recurrent memory needs at least one layer, sequence and convolution "
                f"element (layers {n_layer}, conv {conv_size}, ssm {ssm_size}, sequences "
                f"{n_seq_max}; ssm 0: convolution states only, as LFM2's)"
            )
        self.n_layer, self.n_seq_max = n_layer, n_seq_max
        self.conv_size, self.ssm_size = conv_size, ssm_size
        self.conv = zeros((n_layer, n_seq_max, conv_size), np.float32)
        self.ssm = zeros((n_layer, n_seq_max, ssm_size), np.float32)
        self.pos = np.full(n_seq_max, -1, np.int32)  # last position of each sequence
        self._arrays: tuple | None = None

    def _check_seq(self, seq_id: int) -> None:
        if not 0 <= seq_id < self.n_seq_max:
            raise UsageError(f"seq_id {seq_id} is out of range (0..{self.n_seq_max - 1})")

    # ------------------------------------------------------------------ sequences
    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        p0, p1 = _range(p0, p1)
        if seq_id < 0:
            if p0 == p1:
                return True
            if (p0, p1) != (0, _POS_END):
                return False  # part of every sequence: not possible with one state each
            self.pos[:] = -1
            return True
        self._check_seq(seq_id)
        last = int(self.pos[seq_id])
        if last < 0 or not p0 <= last < p1:
            return True  # nothing of the sequence in the range
        if p0 > 0:
            return False  # a tail: the state before p0 is gone
        self.pos[seq_id] = -1
        return True

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        self._check_seq(src)
        self._check_seq(dst)
        if src == dst:
            return
        self.pos[dst] = self.pos[src]
        if self.pos[src] >= 0:
            self.conv[:, dst] = self.conv[:, src]
            self.ssm[:, dst] = self.ssm[:, src]

    def seq_keep(self, seq_id: int) -> None:
        self._check_seq(seq_id)
        keep = self.pos[seq_id]
        self.pos[:] = -1
        self.pos[seq_id] = keep

    def _move(self, seq_id: int, p0: int, p1: int, fn) -> None:
        if not 0 <= seq_id < self.n_seq_max:
            return  # llama.cpp: other ids are ignored
        p0, p1 = _range(p0, p1)
        last = int(self.pos[seq_id])
        if last >= 0 and p0 <= last < p1:
            self.pos[seq_id] = fn(last)

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        if delta:
            self._move(seq_id, p0, p1, lambda p: p + delta)

    def seq_div(self, seq_id: int, p0: int, p1: int, d: int) -> None:
        if d < 1:
            raise UsageError(f"seq_div: divisor must be >= 1, not {d}")
        if d != 1:
            self._move(seq_id, p0, p1, lambda p: p // d)

    def seq_pos_min(self, seq_id: int) -> int:
        return int(self.pos[seq_id]) if 0 <= seq_id < self.n_seq_max else -1

    def seq_pos_max(self, seq_id: int) -> int:
        return self.seq_pos_min(seq_id)

    def seq_pos_max_all(self) -> dict[int, int]:
        return {int(s): int(self.pos[s]) for s in np.flatnonzero(self.pos >= 0)}

    def clear(self) -> None:
        self.pos[:] = -1

    def n_keep(self, seq_id: int, n: int) -> int:
        """``n`` when the state is exactly the first ``n`` positions (the continuation
        starts right after it), else 0: a state cannot be rewound."""
        return n if n > 0 and self.seq_pos_max(seq_id) + 1 == n else 0

    # ------------------------------------------------------------------ checkpoints
    def snapshot(self, seq_id: int) -> tuple[int, np.ndarray, np.ndarray] | None:
        """A copy of a sequence's state (its last position, both rows), to go back to it
        later with :meth:`restore`; None when the sequence has no state."""
        self._check_seq(seq_id)
        last = int(self.pos[seq_id])
        if last < 0:
            return None
        return last, self.conv[:, seq_id].copy(), self.ssm[:, seq_id].copy()

    def restore(self, seq_id: int, snap: tuple[int, np.ndarray, np.ndarray]) -> int:
        """Put a :meth:`snapshot` back: the sequence continues after its last position;
        returns the positions the sequence now holds."""
        self._check_seq(seq_id)
        last, conv, ssm = snap
        self.conv[:, seq_id] = conv
        self.ssm[:, seq_id] = ssm
        self.pos[seq_id] = last
        return last + 1

    # ------------------------------------------------------------------ one ubatch
    def place(self, ub: UBatch) -> np.ndarray:
        """Each token's state row (its sequence); a sequence without state starts zeroed."""
        sid = ub.seq_id
        if sid.shape[1] > 1 and (sid[:, 1:] >= 0).any():
            raise UsageError(
                "a recurrent memory keeps one state per sequence: a token cannot belong to "
                "several sequences (decode it for one and seq_cp the state)"
            )
        rows = np.ascontiguousarray(sid[:, 0], np.int32)
        for s in distinct(rows).tolist():
            self._check_seq(s)
            if self.pos[s] < 0:
                self.conv[:, s] = 0
                self.ssm[:, s] = 0
            self.pos[s] = max(int(self.pos[s]), int(ub.pos[rows == s].max()))
        return rows

    def prepare(self, ub: UBatch, ordered: bool = False) -> Slots:
        """No cells: each token's state row in ``rows``."""
        rows = self.place(ub)
        none, mask = np.zeros(0, np.int32), np.zeros((len(ub), 0), np.uint8)
        order = none if ordered else None
        return Slots(none, 0, mask, none, 0, mask, order, order, rows=rows)

    def apply_shift(self, rope, freqs: np.ndarray) -> None:
        """Nothing: a state holds no rotated keys."""

    def forward_arrays(self) -> tuple:
        """``(conv, ssm, info)``: the states flat (views), ``info`` = layers, sequences,
        floats of a conv row, floats of an SSM row."""
        if self._arrays is None:
            info = np.array([self.n_layer, self.n_seq_max, self.conv_size, self.ssm_size])
            self._arrays = (self.conv.reshape(-1), self.ssm.reshape(-1), info.astype(np.int64))
        return self._arrays

    # ------------------------------------------------------------------ state
    def layout(self) -> np.ndarray:
        return np.array([self.n_layer, self.conv_size, self.ssm_size], np.int64)

    def get_state(self) -> dict[str, np.ndarray]:
        """The sequences holding a state: ids, last positions and both state rows."""
        used = np.flatnonzero(self.pos >= 0)
        return {
            "seq": used.astype(np.int32),
            "pos": self.pos[used].copy(),
            "conv": self.conv[:, used],
            "ssm": self.ssm[:, used],
            "layout": self.layout(),
        }

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        self._load(self.check_state(state))

    def check_state(self, state: dict[str, np.ndarray]) -> tuple:
        """The arrays of a :meth:`get_state` snapshot, checked against this memory (a
        ``UsageError`` naming the mismatch; nothing is changed)."""
        seq, pos, conv, ssm = state_fields(
            state,
            "recurrent",
            {"seq": np.int32, "pos": np.int32, "conv": None, "ssm": None},
            self.layout(),
            "the state was saved from a different model (recurrent layout {}, this memory {})",
        )
        n = len(seq)
        if n and (seq.min() < 0 or seq.max() >= self.n_seq_max or len(set(seq.tolist())) < n):
            raise UsageError(
                f"the state's sequence ids {seq.tolist()} do not fit n_seq_max = "
                f"{self.n_seq_max} (or repeat)"
            )
        if (
            pos.shape != (n,)
            or conv.shape != (self.n_layer, n, self.conv_size)
            or ssm.shape != (self.n_layer, n, self.ssm_size)
        ):
            raise UsageError(f"recurrent state: arrays do not match {n} sequences")
        return seq, pos, conv, ssm

    def _load(self, arrays: tuple) -> None:
        seq, pos, conv, ssm = arrays
        self.clear()
        self.pos[seq] = pos
        self.conv[:, seq] = conv
        self.ssm[:, seq] = ssm

    @property
    def nbytes(self) -> int:
        return self.conv.nbytes + self.ssm.nbytes

    @property
    def n_used(self) -> int:
        return int((self.pos >= 0).sum())


class HybridMemory(PairedMemory):
    """A KV cache for the attention layers and a recurrent memory for the others (see the
    module docstring); ``layer_recurrent[il]`` says which part layer ``il`` uses."""

    PARTS = ("attn", "recr")
    KIND = "recurrent and attention layers"

    def __init__(
        self,
        layer_recurrent: Sequence[bool],
        n_head_kv: int,
        head_dim: int,
        n_ctx: int,
        conv_size: int,
        ssm_size: int,
        type_k: str = "f16",
        type_v: str = "f16",
        n_seq_max: int = 1,
        zeros=lazy_zeros,
    ) -> None:
        self.layer_recurrent = tuple(bool(r) for r in layer_recurrent)
        n_rec = sum(self.layer_recurrent)
        n_attn = len(self.layer_recurrent) - n_rec
        kw = dict(type_k=type_k, type_v=type_v, n_seq_max=n_seq_max, zeros=zeros)
        self.attn = KVCache(max(n_attn, 1), n_head_kv, head_dim, n_ctx, **kw)
        self.recr = RecurrentMemory(n_rec, conv_size, ssm_size, n_seq_max, zeros)
        self.n_ctx = n_ctx
        self.type_k, self.type_v = self.attn.type_k, self.attn.type_v
        self._arrays: tuple | None = None

    # ------------------------------------------------------------------ sequences
    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        if not self.recr.seq_rm(seq_id, p0, p1):
            return False  # nothing changed
        return self.attn.seq_rm(seq_id, p0, p1)

    def seq_pos_min(self, seq_id: int) -> int:
        """The later of the two parts' first positions (llama.cpp)."""
        return max(self.attn.seq_pos_min(seq_id), self.recr.seq_pos_min(seq_id))

    def seq_pos_max(self, seq_id: int) -> int:
        """The earlier of the two parts' last positions (llama.cpp)."""
        return min(self.attn.seq_pos_max(seq_id), self.recr.seq_pos_max(seq_id))

    def seq_pos_max_all(self) -> dict[int, int]:
        a, r = self.attn.seq_pos_max_all(), self.recr.seq_pos_max_all()
        return {s: min(p, a[s]) for s, p in r.items() if s in a}

    def n_keep(self, seq_id: int, n: int) -> int:
        return min(self.attn.n_keep(seq_id, n), self.recr.n_keep(seq_id, n))

    def snapshot(self, seq_id: int) -> Any:
        """The recurrent part's state of a sequence (the KV cells stay where they are)."""
        return self.recr.snapshot(seq_id)

    def restore(self, seq_id: int, snap: Any) -> int:
        """Back to a :meth:`snapshot`: the recurrent rows restored and the KV cells past its
        position dropped; returns the positions the sequence now holds."""
        last = snap[0]
        if not self.attn.seq_rm(seq_id, last + 1, -1):
            raise UsageError(f"cannot drop the cache cells of sequence {seq_id} past {last}")
        self.recr.restore(seq_id, snap)
        return last + 1

    # ------------------------------------------------------------------ one ubatch
    def prepare(self, ub: UBatch, ordered: bool = False) -> Slots:
        rows = self.recr.place(ub)  # refuses shared tokens before any cell is taken
        sl = self.attn.prepare(ub, ordered)
        sl.rows = rows
        return sl

    def apply_shift(self, rope, freqs: np.ndarray) -> None:
        attn, _ = self._split_ropes(rope, self.layer_recurrent)
        self.attn.apply_shift(attn or [None], freqs)

    def forward_arrays(self) -> tuple:
        """``(k, v, conv, ssm, info)``: the attention part's cells flat, the recurrent
        part's states flat as bytes; ``info`` = k type, v type, row bytes, cells, cells,
        row bytes, recurrent layers, sequences, floats of a conv row, floats of an SSM row."""
        if self._arrays is None:
            k, v, _, _, kvi = self.attn.forward_arrays()
            conv, ssm, ri = self.recr.forward_arrays()
            info = np.concatenate([kvi, ri]).astype(np.int64)
            self._arrays = (k, v, conv.view(np.uint8), ssm.view(np.uint8), info)
        return self._arrays
