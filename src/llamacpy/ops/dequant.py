"""Dequantization of repacked weights: whole tensors (numpy, the reference) and single rows
(numba: the embedding lookup ``get_row`` reads the token table in its repacked layout, so a
tied output head and the embedding share one copy).

Each format's decoders are in its traits record (:mod:`.traits`): ``row`` (numba, one row of
one group block) and ``dequant_numpy`` (numpy, whole tensors); both follow ggml's
``dequantize_row_*`` formulas exactly (float32 arithmetic). This module dispatches on the
type.
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numba.core.errors import TypingError
from numba.extending import overload

from ..gguf.constants import GGMLType
from . import traits
from .formats import unpack_fields


def dequantize_repacked_numpy(packed: np.ndarray, t: GGMLType | int, nrows: int, ncols: int):
    """float32 ``[nrows, ncols]`` from a repacked tensor (numpy twin of :func:`get_row`)."""
    tr = traits.get(t)
    y = tr.dequant_numpy(unpack_fields(packed, tr.type, nrows, ncols))
    return np.ascontiguousarray(y, dtype=np.float32).reshape(nrows, ncols)


def _row_any(t, w, off, ncols, row, out):
    """Inside numba: :func:`get_row` for every registered format (chosen by ``t``)."""
    raise NotImplementedError("only callable from numba-compiled code")


_ROW_KERNELS: dict[int, object] = {}


def _row_kernel(tr):
    """Row ``row`` of a tensor of ``tr``'s format: its group blocks' rows, block by block.

    A function of its own (one per format, shared by every chain), not inlined into the
    chain: numba types an inlined body again in each caller, and the chain of every format
    inlined took minutes to compile; called, each decoder compiles once in seconds (a call
    per row looked up costs nothing next to the row's decoding)."""
    kernel = _ROW_KERNELS.get(tr.id)
    if kernel is not None:
        return kernel
    dec, qk, bb = tr.row, tr.qk, tr.layout.dst_bytes

    def rows(w, off, ncols, row, out):
        g, r = row // 16, row % 16
        nblk = ncols // qk
        for b in range(nblk):
            dec(w, off + (g * nblk + b) * bb, r, out, b * qk)

    kernel = _ROW_KERNELS[tr.id] = njit(rows)
    return kernel


def _chain(records):
    if not records:

        def none(t, w, off, ncols, row, out):
            return None

        return njit(inline="always")(none)
    first, rest = records[0], _chain(records[1:])
    tid, kernel = first.id, _row_kernel(first)

    def pick(t, w, off, ncols, row, out):
        if t == tid:
            kernel(w, off, ncols, row, out)
        else:
            rest(t, w, off, ncols, row, out)

    return njit(inline="always")(pick)


@overload(_row_any)
def _row_any_ov(t, w, off, ncols, row, out):
    chain = _chain(traits.all_traits())

    def impl(t, w, off, ncols, row, out):
        chain(t, w, off, ncols, row, out)

    return impl


def get_row_sel(fset, w, off, t, ncols, row, out):
    """Inside numba: :func:`get_row` among the formats of ``fset`` (a
    :class:`~.matmul.FormatSet`): a model's forward compiles only its own formats' decoders
    (all of them took ~40 s to compile)."""
    raise NotImplementedError("only callable from numba-compiled code")


_ROW_CHAINS: dict[int, object] = {}


@overload(get_row_sel)
def _get_row_sel_ov(fset, w, off, t, ncols, row, out):
    from .matmul import FormatSetType

    if not isinstance(fset, FormatSetType):
        raise TypingError("get_row_sel: the first argument must be a FormatSet")
    m = fset.mask
    chain = _ROW_CHAINS.get(m)
    if chain is None:
        chain = _ROW_CHAINS[m] = _chain([tr for tr in traits.all_traits() if m >> tr.id & 1])

    def impl(fset, w, off, t, ncols, row, out):
        chain(t, w, off, ncols, row, out)

    return impl


@njit(cache=True)
def get_row(w, off, t, ncols, row, out):
    """Dequantize row ``row`` of a repacked tensor (type id ``t``, starting at ``w[off]``)
    into ``out[:ncols]``; the twin of :func:`dequantize_repacked_numpy`."""
    _row_any(t, w, off, ncols, row, out)
