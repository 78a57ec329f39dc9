"""The KV cache: ``n_ctx`` cells, each holding one token's keys and values for every layer and
KV head, a position, and the set of sequences it belongs to (llama.cpp's unified cache).

Sequence operations change only cell metadata (``seq_cp`` shares cells instead of copying
data), except ``seq_add``/``seq_div``, whose position changes are applied to the stored keys
by re-roping them before the next decode (llama.cpp's K-shift). Storage is
``[n_layer, n_head_kv, n_ctx, row_bytes]`` per K and V in the cache type (F16 by default,
F32 or Q8_0), allocated zeroed (pages are only backed once used).

With ``n_swa > 0`` the cache holds sliding-window layers (the window part of
:class:`~.iswa.ISWACache`): a cell whose one sequence has moved ``n_swa`` or more positions
past it is as good as free when cells are searched, and taking it drops that sequence's
older positions (llama.cpp's ``find_slot`` / ``apply_ubatch`` with an SWA mask), so the
cache needs only the window plus a ubatch of cells.
"""

from __future__ import annotations

import numpy as np

from ..errors import LlamacpyError, UsageError
from ..models.common import lazy_zeros
from ..ops import kv_rows
from ..ops.attention import KV_F16, KV_F32, KV_Q8_0, kv_row_bytes, rope_shift_rows
from .batch import UBatch, distinct
from .memory import Memory, Slots, state_fields

# llama.cpp's cache types (common/arg.cpp ``kv_cache_types``)
CACHE_TYPES = {"f32": KV_F32, "f16": KV_F16, "bf16": kv_rows.KV_BF16, "q8_0": KV_Q8_0}
CACHE_TYPES |= {k: v for k, v in kv_rows.TYPES.items() if k not in CACHE_TYPES}
N_KV_PAD = 256  # ggml pads the attended range to a multiple of 256 cells


class KVCacheFullError(LlamacpyError):
    """No free cells are left for the tokens of a ubatch."""


def cache_type(name: str) -> int:
    try:
        return CACHE_TYPES[name.lower()]
    except KeyError:
        raise UsageError(
            f"unknown KV cache type {name!r}; supported: {', '.join(CACHE_TYPES)}"
        ) from None


class KVCache(Memory):
    """Cells with positions and sequence sets, plus the K/V storage of every layer."""

    def __init__(
        self,
        n_layer: int,
        n_head_kv: int,
        head_dim: int,
        n_ctx: int,
        type_k: str = "f16",
        type_v: str = "f16",
        n_seq_max: int = 1,
        zeros=lazy_zeros,
        n_swa: int = 0,
        v_is_k: bool = False,
        rope_offset: int = 0,
    ) -> None:
        """``zeros(shape, dtype)``: the storage of the K and V cells (the model's backend's
        memory; numpy arrays on the CPU); ``n_swa``: the layers' sliding window (0: none);
        ``v_is_k``: the values are read from the key rows (deepseek2's latent rows: no V is
        stored, ``type_v`` is ``type_k``); ``rope_offset``: where the roped part of a key row
        starts (what a K-shift rotates)."""
        self.type_k, self.type_v = cache_type(type_k), cache_type(type_v)
        if v_is_k:
            if self.type_k not in (KV_F16, KV_F32):
                raise UsageError(
                    "this model's cache rows are latent vectors read as keys and values; "
                    f"a {type_k} K cache is not supported for them (use f16 or f32)"
                )
            self.type_v = self.type_k
        self.v_is_k, self.rope_offset = v_is_k, rope_offset
        for t in (self.type_k, self.type_v):
            if t not in (KV_F16, KV_F32, kv_rows.KV_BF16) and head_dim % 32:
                name = next(k for k, v in CACHE_TYPES.items() if v == t)
                raise UsageError(
                    f"a {name} KV cache needs a head size multiple of 32, not {head_dim}"
                )
        self.n_ctx, self.n_seq_max, self.head_dim = n_ctx, n_seq_max, head_dim
        self.n_swa = n_swa
        rb = max(kv_row_bytes(self.type_k, head_dim), kv_row_bytes(self.type_v, head_dim))
        self.row_bytes = rb
        self.k = zeros((n_layer, n_head_kv, n_ctx, rb), np.uint8)
        self.v = self.k if v_is_k else zeros((n_layer, n_head_kv, n_ctx, rb), np.uint8)
        self.pos = np.full(n_ctx, -1, np.int32)
        self.seq = np.zeros((n_ctx, (n_seq_max + 63) // 64), np.uint64)
        self.shift = np.zeros(n_ctx, np.int32)
        self.has_shift = False
        self.head = 0
        self._top = 0  # 1 + highest used cell
        self._pmax: dict[int, int] = {}  # seq -> last position (memo, reset by seq ops)
        self._arrays: tuple | None = None

    def forward_arrays(self) -> tuple:
        """``(k, v, k_swa, v_swa, info)``: the cells flat (views, no copies; the window
        part is the same cache: a model with sliding-window layers gets an
        :class:`~.iswa.ISWACache`) and ``info`` = k type, v type, row bytes, cells, cells,
        row bytes."""
        if self._arrays is None:
            rb = self.row_bytes
            info = np.array([self.type_k, self.type_v, rb, self.n_ctx, self.n_ctx, rb], np.int64)
            k, v = self.k.reshape(-1), self.v.reshape(-1)
            self._arrays = (k, v, k, v, info)
        return self._arrays

    def prepare(self, ub: UBatch, ordered: bool = False) -> Slots:
        """Place the ubatch; its cells, attended range and mask (for every layer) and,
        ``ordered``, the attended cells sorted by position (a sequence's cells in the order
        of its tokens wherever they were placed: empty cells first, ties kept in cell
        order)."""
        cells = self.place(ub)
        n_kv = self.n_kv()
        mask = self.mask(ub, n_kv, self.n_swa)
        order = np.argsort(self.pos[:n_kv], kind="stable").astype(np.int32) if ordered else None
        return Slots(cells, n_kv, mask, cells, n_kv, mask, order, order)

    # ------------------------------------------------------------------ queries
    @property
    def nbytes(self) -> int:
        return self.k.nbytes + (0 if self.v_is_k else self.v.nbytes)

    def describe(self) -> list[str]:
        """llama.cpp's ``llama_kv_cache`` line: the size of K and V and their types."""
        names = {v: k for k, v in CACHE_TYPES.items()}
        mib = 1024.0 * 1024.0
        k, v = self.k.nbytes, (0 if self.v_is_k else self.v.nbytes)
        return [
            f"llama_kv_cache: size = {(k + v) / mib:7.2f} MiB ({self.n_ctx:6d} cells, "
            f"{self.k.shape[0]:3d} layers, {1:2d}/{self.n_seq_max} seqs), "
            f"K ({names[self.type_k]}): {k / mib:7.2f} MiB, "
            f"V ({names[self.type_v]}): {v / mib:7.2f} MiB"
        ]

    def _has(self, seq_id: int) -> np.ndarray:
        w, b = divmod(seq_id, 64)
        return ((self.seq[:, w] >> np.uint64(b)) & np.uint64(1)).astype(bool)

    def _cells(self, seq_id: int, p0: int, p1: int) -> np.ndarray:
        p0 = 0 if p0 < 0 else p0
        p1 = np.iinfo(np.int32).max if p1 < 0 else p1
        sel = (self.pos >= 0) & (self.pos >= p0) & (self.pos < p1)
        if seq_id >= 0:
            self._check_seq(seq_id)
            sel &= self._has(seq_id)
        return sel

    def _check_seq(self, seq_id: int) -> None:
        if not 0 <= seq_id < self.n_seq_max:
            raise UsageError(f"seq_id {seq_id} is out of range (0..{self.n_seq_max - 1})")

    def seq_pos_max(self, seq_id: int) -> int:
        """Largest position of the sequence in the cache, -1 when it has none."""
        p = self._pmax.get(seq_id)
        if p is None:
            top = self._top
            sel = (self.pos[:top] >= 0) & self._has(seq_id)[:top]
            p = self._pmax[seq_id] = int(self.pos[:top][sel].max()) if sel.any() else -1
        return p

    def seq_pos_min(self, seq_id: int) -> int:
        sel = (self.pos >= 0) & self._has(seq_id)
        return int(self.pos[sel].min()) if sel.any() else -1

    def seq_pos_max_all(self) -> dict[int, int]:
        """seq_id -> last position, for every sequence present."""
        out = {}
        used = self.pos >= 0
        for s in range(self.n_seq_max):
            sel = used & self._has(s)
            if sel.any():
                out[s] = int(self.pos[sel].max())
        return out

    @property
    def n_used(self) -> int:
        return int((self.pos >= 0).sum())

    def n_kv(self) -> int:
        """Cells the attention looks at: the used range padded to 256, as ggml."""
        return self.n_kv_for(self._top)

    def n_kv_for(self, top: int) -> int:
        """:meth:`n_kv` when the used range ends at cell ``top``."""
        return min(self.n_ctx, max(N_KV_PAD, -(-top // N_KV_PAD) * N_KV_PAD))

    @property
    def n_kv_top(self) -> int:
        """The end of the used range of cells."""
        return self._top

    def _changed(self) -> None:
        """Cell metadata changed outside :meth:`place`: drop memos."""
        self._pmax.clear()
        used = np.nonzero(self.pos >= 0)[0]
        self._top = int(used[-1]) + 1 if used.size else 0

    # ------------------------------------------------------------------ sequence ops
    def clear(self) -> None:
        self.pos[:] = -1
        self.seq[:] = 0
        self.shift[:] = 0
        self.has_shift = False
        self.head = 0
        self._changed()

    def _free(self, sel: np.ndarray) -> None:
        self.pos[sel] = -1
        self.seq[sel] = 0
        self.shift[sel] = 0

    def _head_back(self, freed: np.ndarray) -> None:
        """llama.cpp: when cells were freed, the next search starts at the first of them if
        that is before the head."""
        idx = np.flatnonzero(freed)
        if idx.size and idx[0] < self.head:
            self.head = int(idx[0])

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        """Remove ``seq_id`` (all sequences when < 0) from the cells with ``p0 <= pos < p1``
        (negative bounds: open); cells left without a sequence become free."""
        sel = self._cells(seq_id, p0, p1)
        if seq_id < 0:
            freed = sel & (self.pos >= 0)
            self._free(sel)
        else:
            w, b = divmod(seq_id, 64)
            self.seq[sel, w] &= ~np.uint64(1 << b)
            freed = sel & ~self.seq.any(axis=1) & (self.pos >= 0)
            self._free(freed)
        self._head_back(freed)
        self._changed()
        return True

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """Make ``dst`` share the cells of ``src`` in ``[p0, p1)`` (no data is copied)."""
        self._check_seq(dst)
        if src == dst:
            return
        sel = self._cells(src, p0, p1)
        w, b = divmod(dst, 64)
        self.seq[sel, w] |= np.uint64(1 << b)
        self._changed()

    def seq_keep(self, seq_id: int) -> None:
        """Drop every other sequence; cells not in ``seq_id`` become free."""
        self._check_seq(seq_id)
        keep = self._has(seq_id) & (self.pos >= 0)
        freed = ~keep & (self.pos >= 0)
        self._free(~keep)
        self._head_back(freed)
        w, b = divmod(seq_id, 64)
        self.seq[keep] = 0
        self.seq[keep, w] = np.uint64(1 << b)
        self._changed()

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        """Shift the positions of ``seq_id`` in ``[p0, p1)`` by ``delta``; cells moved below
        0 are freed. Keys are re-roped before the next decode."""
        if delta == 0:
            return
        sel = self._cells(seq_id, p0, p1)
        self.pos[sel] += delta
        self.shift[sel] += delta
        self.has_shift = bool(sel.any()) or self.has_shift
        freed = sel & (self.pos < 0)
        self._free(freed)
        # llama.cpp: the next search starts at the first freed cell, else at the start
        idx = np.flatnonzero(freed)
        self.head = int(idx[0]) if idx.size else 0
        self._changed()

    def seq_div(self, seq_id: int, p0: int, p1: int, d: int) -> None:
        """Integer-divide the positions of ``seq_id`` in ``[p0, p1)`` by ``d``."""
        if d == 1:
            return
        if d < 1:
            raise UsageError(f"seq_div: divisor must be >= 1, not {d}")
        sel = self._cells(seq_id, p0, p1)
        new = self.pos[sel] // d
        self.shift[sel] += new - self.pos[sel]
        self.pos[sel] = new
        self.has_shift = bool(sel.any()) or self.has_shift
        self._changed()

    def apply_shift(self, rope, freqs: np.ndarray) -> None:
        """Re-rope the keys of shifted cells by their accumulated shift (K-shift); ``rope``
        is one :class:`~llamacpy.ops.rope.RopeParams` or a list of one per layer (None: a
        layer without rope, whose keys do not move)."""
        if not self.has_shift:
            return
        cells = np.nonzero(self.shift)[0].astype(np.int32)
        n_layer, n_head_kv = self.k.shape[:2]
        ropes = list(rope) if isinstance(rope, list | tuple) else [rope] * n_layer
        if all(r == ropes[0] for r in ropes):
            groups = [(self.k, ropes[0])]
        else:  # per layer (gemma3: sliding-window layers have their own rope base)
            groups = [(self.k[il : il + 1], ropes[il]) for il in range(n_layer)]
        for k, r in groups:
            if r is None:
                continue
            rope_shift_rows(
                k.reshape(-1),
                self.type_k,
                self.head_dim,
                k.shape[0],
                n_head_kv,
                self.n_ctx,
                self.row_bytes,
                cells,
                self.shift,
                r.packed(),
                freqs,
                r.neox,
                self.rope_offset,
            )
        self.shift[:] = 0
        self.has_shift = False

    # ------------------------------------------------------------------ state
    def layout(self) -> np.ndarray:
        """What a saved state must match: layers, KV heads, row bytes, K and V types."""
        return np.array([*self.k.shape[:2], self.row_bytes, self.type_k, self.type_v], np.int64)

    def get_state(self) -> dict[str, np.ndarray]:
        """The cells in use (K/V rows, positions, sequence sets, pending shifts), compacted."""
        used = np.nonzero(self.pos >= 0)[0]
        return {
            "k": self.k[:, :, used],
            "v": self.v[:, :, used],
            "pos": self.pos[used],
            "seq": self.seq[used],
            "shift": self.shift[used],
            "layout": self.layout(),
        }

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        """Replace the cache's contents by a :meth:`get_state` snapshot (cells 0..n-1)."""
        self._load(self.check_state(state))

    def check_state(self, state: dict[str, np.ndarray]) -> tuple:
        """The arrays of a :meth:`get_state` snapshot, checked against this cache's layout
        (a ``UsageError`` naming the mismatch; nothing is changed)."""
        k, v, pos, shift, seq = self._check_cells(state, "KV cache", {"seq": np.uint64})
        if seq.shape != (len(pos), self.seq.shape[1]):
            raise UsageError(f"KV cache state: arrays do not match {len(pos)} cells")
        return k, v, pos, seq, shift

    def _check_cells(self, state: dict[str, np.ndarray], what: str, more: dict) -> list:
        """``k, v, pos, shift`` and the ``more`` fields of a snapshot of cells: the layout
        this cache's, at most ``n_ctx`` cells, the row arrays of that many cells."""
        arrays = state_fields(
            state,
            what,
            {"k": None, "v": None, "pos": np.int32, "shift": np.int32, **more},
            self.layout(),
            "the state was saved from a different model or cache type (layout {}, this cache {})",
        )
        k, v, pos, shift = arrays[:4]
        n = len(pos)
        if n > self.n_ctx:
            raise UsageError(f"the state holds {n} cells but this cache has n_ctx = {self.n_ctx}")
        want = (*self.k.shape[:2], n, self.row_bytes)
        if k.shape != want or v.shape != want or shift.shape != (n,) or pos.ndim != 1:
            raise UsageError(f"KV cache state: arrays do not match {n} cells of shape {want}")
        return arrays

    def _load(self, arrays: tuple) -> None:
        k, v, pos, seq, shift = arrays
        n = len(pos)
        self.clear()
        self.k[:, :, :n] = k
        self.v[:, :, :n] = v
        self.pos[:n] = pos
        self.seq[:n] = seq
        self.shift[:n] = shift
        self.has_shift = bool(shift.any())
        self.head = n % self.n_ctx
        self._changed()

    def get_seq_state(self, seq_id: int) -> dict[str, np.ndarray]:
        """Sequence ``seq_id``'s cells (K/V rows, positions, pending shifts) in position
        order."""
        self._check_seq(seq_id)
        cells = np.nonzero(self._cells(seq_id, -1, -1))[0]
        cells = cells[np.argsort(self.pos[cells], kind="stable")]
        return {
            "k": self.k[:, :, cells],
            "v": self.v[:, :, cells],
            "pos": self.pos[cells],
            "shift": self.shift[cells],
            "layout": self.layout(),
        }

    def set_seq_state(self, seq_id: int, state: dict[str, np.ndarray]) -> None:
        self._load_seq(seq_id, self.check_seq_state(state))

    def check_seq_state(self, state: dict[str, np.ndarray]) -> tuple:
        """The arrays of a :meth:`get_seq_state` snapshot, checked against this cache (a
        ``UsageError`` naming the mismatch; nothing is changed)."""
        k, v, pos, shift = self._check_cells(state, "KV cache sequence", {})
        if len(pos) and (pos.min() < 0 or (np.diff(pos) <= 0).any()):
            raise UsageError("KV cache state: positions must be >= 0 and increasing")
        return k, v, pos, shift

    def _load_seq(self, seq_id: int, arrays: tuple) -> None:
        k, v, pos, shift = arrays
        self._check_seq(seq_id)
        self.seq_rm(seq_id, -1, -1)
        n = len(pos)
        if n == 0:
            return
        ub = UBatch(
            np.zeros(n, np.int32), pos.astype(np.int32), np.full((n, 1), seq_id, np.int32),
            np.zeros(0, np.int32),
        )  # fmt: skip
        cells = self.place(ub)  # KVCacheFullError when the cells are not there
        self.k[:, :, cells] = k
        self.v[:, :, cells] = v
        self.shift[cells] = shift
        self.has_shift = self.has_shift or bool(shift.any())

    # ------------------------------------------------------------------ placement
    def place(self, ub: UBatch) -> np.ndarray:
        """Find cells for the ubatch's tokens, record their positions and sequences, and
        return the cell index of each token. Raises :class:`KVCacheFullError`."""
        n = len(ub)
        sid = ub.seq_id
        seqs = [int(x) for x in (distinct(sid[sid >= 0]) if n > 1 or sid.shape[1] > 1 else sid[0])]
        prev = {s: self.seq_pos_max(s) for s in seqs}
        h = self.head
        if h > 2 * n and h > self.n_used + 2 * n:  # llama.cpp: enough free cells before the head
            h = 0
        if h + n <= self.n_ctx and (self.pos[h : h + n] < 0).all():
            cells = np.arange(h, h + n, dtype=np.int32)  # the usual case: free run at the head
        else:
            usable = np.nonzero(self._usable())[0]
            if usable.size < n:
                raise KVCacheFullError(
                    f"the KV cache is full: {n} tokens need cells but only {usable.size} of "
                    f"{self.n_ctx} are free; remove sequences (seq_rm) or use a larger n_ctx"
                )
            # first usable cells from the head on, wrapping around (as llama.cpp's search)
            order = np.concatenate([usable[usable >= h], usable[usable < h]])
            cells = order[:n].astype(np.int32)
        dropped = self._take(cells)
        self.pos[cells] = ub.pos
        if sid.shape[1] == 1 and self.seq.shape[1] == 1:
            self.seq[cells, 0] = np.uint64(1) << sid[:, 0].astype(np.uint64)
        else:
            self.seq[cells] = 0
            for c, ids in zip(cells, sid):
                for s in ids[ids >= 0]:
                    w, b = divmod(int(s), 64)
                    self.seq[c, w] |= np.uint64(1 << b)
        self._top = max(self._top, int(cells.max()) + 1)
        for s in seqs:
            new = int(ub.pos[-1]) if len(seqs) == 1 else int(ub.pos[(sid == s).any(axis=1)].max())
            self._pmax[s] = max(prev[s], new)
        for s, p in dropped.items():
            # every position of a sequence up to the last one overwritten goes: a sequence
            # keeps an unbroken run of positions (llama.cpp's purge)
            pmin = self.seq_pos_min(s)
            if 0 <= pmin <= p:
                self.seq_rm(s, pmin, p + 1)
        last = int(cells[-1]) + 1  # llama.cpp: the head moves past the last cell taken
        self.head = last if last < self.n_ctx else 0
        return cells

    def _usable(self) -> np.ndarray:
        """Cells a ubatch may take: free ones and, in a sliding-window cache, cells of one
        sequence at least ``n_swa`` positions behind that sequence's next position."""
        usable = self.pos < 0
        if self.n_swa <= 0:
            return usable
        one = ((self.seq != 0).sum(axis=1) == 1) & ((self.seq & (self.seq - 1)) == 0).all(1)
        for s, pmax in self.seq_pos_max_all().items():
            usable |= one & self._has(s) & (pmax + 1 - self.pos >= self.n_swa)
        return usable

    def _take(self, cells: np.ndarray) -> dict[int, int]:
        """Empty the cells still in use among ``cells`` (only a sliding-window cache takes
        such cells); returns sequence -> highest position dropped."""
        held = cells[self.pos[cells] >= 0]
        dropped: dict[int, int] = {}
        for c in held.tolist():
            w = int(np.flatnonzero(self.seq[c])[0])
            s = 64 * w + int(self.seq[c, w]).bit_length() - 1
            dropped[s] = max(dropped.get(s, -1), int(self.pos[c]))
        if held.size:
            self._free(held)
            self._pmax.clear()
        return dropped

    def mask(self, ub: UBatch, n_kv: int, n_swa: int = 0) -> np.ndarray:
        """``uint8 [n, n_kv]``: 1 where token ``t`` sees cell ``c`` (the cell holds the
        token's first sequence at a position not after the token's). With ``n_swa > 0``
        (sliding-window layers) the cell's position must also be less than ``n_swa`` before
        the token's (llama.cpp's standard SWA: masked when ``p_token - p_cell >= n_swa``)."""
        pos = self.pos[:n_kv]
        prim = ub.primary_seq
        seqs = prim[:1] if len(ub) == 1 or (prim == prim[0]).all() else distinct(prim)
        out = np.zeros((len(ub), n_kv), np.uint8)
        for s in seqs:
            w, b = divmod(int(s), 64)
            has = ((self.seq[:n_kv, w] >> np.uint64(b)) & np.uint64(1)).astype(bool)
            has &= pos >= 0
            rows = slice(None) if len(seqs) == 1 else prim == s
            p = ub.pos[rows][:, None]
            vis = has[None, :] & (pos[None, :] <= p)
            if n_swa > 0:
                vis &= p - pos[None, :] < n_swa
            out[rows] = vis
        return out
