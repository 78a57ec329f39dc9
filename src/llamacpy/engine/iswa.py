"""The cache of a model with sliding-window layers (llama.cpp's ``llama_kv_cache_iswa``).

Two :class:`~.kv_cache.KVCache`: ``base`` holds the global layers in ``n_ctx`` cells,
``swa`` the sliding-window layers in only ``pad256(min(n_ctx, n_swa * n_seq_max +
n_ubatch))`` cells (``swa_full``: ``n_ctx``, as llama.cpp's ``--swa-full``). The window part
takes a cell again once its sequence has moved ``n_swa`` positions past it, so a gemma3
sequence longer than the window costs the window, not ``n_ctx`` cells, in five layers of
six, and the attention of those layers looks at as few cells. Every sequence operation
goes to both parts; a sequence's first and last positions are the window part's (it holds
the fewest). Cells are placed exactly as llama.cpp places them, so that attention sums
over the same cells in the same order.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import UsageError
from ..models.common import lazy_zeros
from .batch import UBatch
from .kv_cache import N_KV_PAD, KVCache
from .memory import PairedMemory, Slots


def swa_cache_size(n_ctx: int, n_swa: int, n_seq_max: int, n_ubatch: int, full: bool) -> int:
    """Cells of the window part (llama.cpp: always a multiple of 256, at most ``n_ctx``
    rounded up)."""
    if full:
        return n_ctx
    n = min(n_ctx, n_swa * n_seq_max + n_ubatch)
    return -(-n // N_KV_PAD) * N_KV_PAD


class ISWACache(PairedMemory):
    """A global-layer cache and a sliding-window-layer cache (see the module docstring)."""

    PARTS = ("base", "swa")
    KIND = "sliding-window layers"

    def __init__(
        self,
        layer_swa: Sequence[bool],
        n_head_kv: int | tuple[int, int],
        head_dim: int | tuple[int, int],
        n_ctx: int,
        n_swa: int,
        type_k: str = "f16",
        type_v: str = "f16",
        n_seq_max: int = 1,
        n_ubatch: int = 512,
        swa_full: bool = False,
        zeros=lazy_zeros,
    ) -> None:
        if n_swa < 1:
            raise UsageError(f"a sliding-window cache needs a window of at least 1, not {n_swa}")
        self.layer_swa = tuple(bool(s) for s in layer_swa)
        n_win = sum(self.layer_swa)
        size = swa_cache_size(n_ctx, n_swa, n_seq_max, n_ubatch, swa_full)
        # (KV heads and head size: one for both parts, or (global, sliding-window): gemma4)
        hk = n_head_kv if isinstance(n_head_kv, tuple) else (n_head_kv, n_head_kv)
        hd = head_dim if isinstance(head_dim, tuple) else (head_dim, head_dim)
        kw = dict(type_k=type_k, type_v=type_v, n_seq_max=n_seq_max, zeros=zeros)
        self.base = KVCache(len(self.layer_swa) - n_win, hk[0], hd[0], n_ctx, **kw)
        self.swa = KVCache(n_win, hk[1], hd[1], size, n_swa=n_swa, **kw)
        self.n_ctx, self.n_swa = n_ctx, n_swa
        self.type_k, self.type_v = self.base.type_k, self.base.type_v
        self._arrays: tuple | None = None

    # ------------------------------------------------------------------ sequences
    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        ok = self.base.seq_rm(seq_id, p0, p1)
        return self.swa.seq_rm(seq_id, p0, p1) and ok

    def seq_pos_min(self, seq_id: int) -> int:
        return self.swa.seq_pos_min(seq_id)

    def seq_pos_max(self, seq_id: int) -> int:
        return self.swa.seq_pos_max(seq_id)

    def seq_pos_max_all(self) -> dict[int, int]:
        return self.swa.seq_pos_max_all()

    def n_keep(self, seq_id: int, n: int) -> int:
        """``n`` when the window part still holds the positions the token at ``n`` sees (as
        llama-server: the first cached position is at most ``n - n_swa``), else 0."""
        if n <= 0:
            return 0
        pmin = self.swa.seq_pos_min(seq_id)
        return n if 0 <= pmin <= max(0, n - self.n_swa) else 0

    # ------------------------------------------------------------------ one ubatch
    def prepare(self, ub: UBatch, ordered: bool = False) -> Slots:
        base, win = self.base.prepare(ub, ordered), self.swa.prepare(ub, ordered)
        return Slots(
            base.cells, base.n_kv, base.mask, win.cells, win.n_kv, win.mask, base.order,
            win.order,
        )  # fmt: skip

    def apply_shift(self, rope, freqs: np.ndarray) -> None:
        base, swa = self._split_ropes(rope, self.layer_swa)
        self.base.apply_shift(base, freqs)
        self.swa.apply_shift(swa, freqs)

    def forward_arrays(self) -> tuple:
        """``(k, v, k_swa, v_swa, info)``, ``info`` = k type, v type, row bytes, cells of
        each part, row bytes of the window part."""
        if self._arrays is None:
            k, v, _, _, info = self.base.forward_arrays()
            ks, vs, _, _, _ = self.swa.forward_arrays()
            info = np.array([*info[:4], self.swa.n_ctx, self.swa.row_bytes], np.int64)
            self._arrays = (k, v, ks, vs, info)
        return self._arrays
