"""Quantized matrix x matrix (and x vector) over repacked weights, one entry point for all formats.

``matmul(w, desc, A, t0, t1, g0, g1, out, ot, add)`` computes, for tokens ``t0..t1`` and row
groups ``g0..g1`` (16 output rows each) of the weight described by ``desc``
(``[type, byte offset in w, nrows, ncols]``)::

    out[t, 16g:16g+16] (+)= W[16g:16g+16, :] . act(x[t, :])

where ``act`` is the activation prepared by :func:`prepare_acts` in the weight's dot type.
Tokens go four at a time through the ``*_t4`` kernels (each weight vector is decoded once
for four tokens), the rest one at a time; the per-token arithmetic is the same in both, so
results do not depend on batch composition. The caller splits row groups among threads.
``out`` rows must be padded to a multiple of 16 columns.

:func:`matmul_numpy` is the float64 reference twin (dequantized weights x dequantized
activations).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import errors
from numba.extending import (
    NativeValue,
    models,
    overload,
    register_model,
    typeof_impl,
    unbox,
)

from ..gguf.constants import GGMLType
from . import traits
from .dequant import dequantize_repacked_numpy
from .formats import unpack_fields
from .quantize_act import (
    quantize_q8,
    quantize_q8_numpy,
    quantize_q8k,
    quantize_q8k_numpy,
    round_activations,
    round_activations_numpy,
)
from .traits import ACT_BF16, ACT_F16, ACT_F32, ACT_Q8, ACT_Q8K

NEED_Q8, NEED_Q8K = 1 << ACT_Q8, 1 << ACT_Q8K
NEED_FLOAT = (1 << ACT_F32) | (1 << ACT_F16) | (1 << ACT_BF16)


def act_need(types) -> int:
    """Bit mask of the activation kinds the given weight types consume."""
    mask = 0
    for t in types:
        mask |= 1 << traits.get(t).act
    floats = mask & NEED_FLOAT
    if floats & (floats - 1):
        names = ", ".join(GGMLType(t).name for t in types)
        raise ValueError(f"weights of different float types share one input ({names})")
    return mask


def new_acts(n_tokens: int, k: int):
    """Zeroed activation buffers for ``n_tokens`` rows of up to ``k`` columns (k % 256 == 0
    not required; K-quant buffers are sized for ``k // 256`` blocks)."""
    return (
        np.zeros((n_tokens, k), np.int8),  # xq
        np.zeros((n_tokens, max(1, k // 32)), np.float32),  # xd
        np.zeros((n_tokens, max(1, k // 32)), np.float32),  # xs
        np.zeros((n_tokens, max(1, k // 4)), np.int32),  # xb (sums of 4)
        np.zeros((n_tokens, k), np.int8),  # xqk
        np.zeros((n_tokens, max(1, k // 256)), np.float32),  # xdk
        np.zeros((n_tokens, max(1, k // 16)), np.int32),  # xbk
        np.zeros((n_tokens, k), np.float32),  # xf
    )


@njit(cache=True)
def prepare_acts(x, t0, t1, k, need, A):
    """Quantize / round rows ``t0..t1`` of ``x[:, :k]`` into ``A`` for the kinds in ``need``."""
    if need & 1:
        quantize_q8(x, t0, t1, k, A[0], A[1], A[2], A[3])
    if need & 2:
        quantize_q8k(x, t0, t1, k, A[4], A[5], A[6])
    if need & 4:
        round_activations(x, t0, t1, k, 2, A[7])
    elif need & 8:
        round_activations(x, t0, t1, k, 3, A[7])
    elif need & 16:
        round_activations(x, t0, t1, k, 4, A[7])


class FormatSet:
    """The weight formats a model uses; passed to compiled code, where its numba type (which
    carries the set) selects the format kernels at compile time -- a model compiles only its
    formats, and each set is cached separately. ``invariant``: the kernels whose arithmetic
    for a token does not depend on how many tokens one call has (each format's
    ``matmul_invariant``; single-token numerics for every token), for deterministic contexts.
    """

    def __init__(self, types_, invariant: bool = False) -> None:
        mask = 0
        for t in types_:
            mask |= 1 << traits.type_id(t)  # a clear error for an unsupported type
        self.mask = mask
        self.invariant = bool(invariant)

    @property
    def key(self) -> tuple[int, bool]:
        return self.mask, self.invariant

    def __repr__(self) -> str:
        names = [tr.type.name for tr in traits.all_traits() if self.mask >> tr.id & 1]
        return f"FormatSet({', '.join(names)}{', invariant' if self.invariant else ''})"


class FormatSetType(types.Type):
    def __init__(self, mask: int, invariant: bool = False) -> None:
        self.mask, self.invariant = mask, invariant
        super().__init__(name=f"FormatSet({mask:#x}{', invariant' if invariant else ''})")


@typeof_impl.register(FormatSet)
def _typeof_format_set(val, c):
    return FormatSetType(val.mask, val.invariant)


@register_model(FormatSetType)
class _FormatSetModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, ir.IntType(8))


@unbox(FormatSetType)
def _unbox_format_set(typ, obj, c):
    return NativeValue(ir.Constant(ir.IntType(8), 0))


def format_mask(types_) -> FormatSet:
    """The :class:`FormatSet` of some weight types (kept under its old name)."""
    return FormatSet(types_)


def matmul_sel(fset, w, desc, A, t0, t1, g0, g1, out, ot, add):
    """Inside numba: run the kernel of ``desc[0]`` among the formats of ``fset``."""
    raise NotImplementedError("only callable from numba-compiled code")


def _chain(entries):
    if not entries:

        def none(w, desc, A, t0, t1, g0, g1, out, ot, add):
            return None

        return njit(inline="always")(none)
    tid, fn = entries[0]
    rest = _chain(entries[1:])

    def impl(w, desc, A, t0, t1, g0, g1, out, ot, add):
        if desc[0] == tid:
            fn(w, desc, A, t0, t1, g0, g1, out, ot, add)
        else:
            rest(w, desc, A, t0, t1, g0, g1, out, ot, add)

    return njit(inline="always")(impl)


_CHAINS: dict[tuple[int, bool], object] = {}


@overload(matmul_sel)
def _matmul_sel_ov(fset, w, desc, A, t0, t1, g0, g1, out, ot, add):
    if not isinstance(fset, FormatSetType):
        raise errors.TypingError("matmul_sel: the first argument must be a FormatSet")
    m, inv = fset.mask, fset.invariant
    chain = _CHAINS.get((m, inv))
    if chain is None:
        entries = [
            (tr.id, (tr.matmul_invariant or tr.matmul) if inv else tr.matmul)
            for tr in traits.all_traits()
            if m >> tr.id & 1
        ]
        chain = _CHAINS[m, inv] = _chain(entries)

    def impl(fset, w, desc, A, t0, t1, g0, g1, out, ot, add):
        chain(w, desc, A, t0, t1, g0, g1, out, ot, add)

    return impl


def matmul_rows_sel(fset, w, desc, A, rows, n, adiv, a0, g0, g1, out, o0, add):
    """Inside numba: ``out[o0 + r] (+)= W . act(A[a0 + r // adiv])`` for the rows ``r`` of
    ``rows[:n]`` (an empty ``rows``: ``r = 0..n-1``) and row groups ``g0..g1`` of the weight
    ``desc`` among the formats of ``fset``, every row with single-token numerics: the
    format's ``matmul_rows`` kernel, else its matmul called row by row."""
    raise NotImplementedError("only callable from numba-compiled code")


def _by_row(fn):
    """``fn`` (a matmul kernel) called one row at a time, as a ``matmul_rows`` kernel."""

    def impl(w, desc, A, rows, n, adiv, a0, g0, g1, out, o0, add):
        for i in range(n):
            r = rows[i] if rows.shape[0] > 0 else i
            a = a0 + r // adiv
            fn(w, desc, A, a, a + 1, g0, g1, out, o0 + r, add)

    return njit(inline="always")(impl)


def _chain_rows(entries):
    if not entries:

        def none(w, desc, A, rows, n, adiv, a0, g0, g1, out, o0, add):
            return None

        return njit(inline="always")(none)
    tid, fn = entries[0]
    rest = _chain_rows(entries[1:])

    def impl(w, desc, A, rows, n, adiv, a0, g0, g1, out, o0, add):
        if desc[0] == tid:
            fn(w, desc, A, rows, n, adiv, a0, g0, g1, out, o0, add)
        else:
            rest(w, desc, A, rows, n, adiv, a0, g0, g1, out, o0, add)

    return njit(inline="always")(impl)


_CHAINS_ROWS: dict[tuple[int, bool], object] = {}


@overload(matmul_rows_sel)
def _matmul_rows_sel_ov(fset, w, desc, A, rows, n, adiv, a0, g0, g1, out, o0, add):
    if not isinstance(fset, FormatSetType):
        raise errors.TypingError("matmul_rows_sel: the first argument must be a FormatSet")
    m, inv = fset.mask, fset.invariant
    chain = _CHAINS_ROWS.get((m, inv))
    if chain is None:
        entries = [
            (
                tr.id,
                tr.matmul_rows or _by_row((tr.matmul_invariant or tr.matmul) if inv else tr.matmul),
            )
            for tr in traits.all_traits()
            if m >> tr.id & 1
        ]
        chain = _CHAINS_ROWS[m, inv] = _chain_rows(entries)

    def impl(fset, w, desc, A, rows, n, adiv, a0, g0, g1, out, o0, add):
        chain(w, desc, A, rows, n, adiv, a0, g0, g1, out, o0, add)

    return impl


@njit(cache=True)
def matmul_rows(fset, w, desc, A, rows, n, adiv, a0, g0, g1, out, o0, add):
    """:func:`matmul_rows_sel` as a kernel of its own (tests)."""
    matmul_rows_sel(fset, w, desc, A, rows, n, adiv, a0, g0, g1, out, o0, add)


@njit(cache=True)
def matmul(fset, w, desc, A, t0, t1, g0, g1, out, ot, add):
    """``out[ot + t - t0, 16g0:16g1] (+)= W . act`` for the weight ``desc`` (see module doc);
    ``fset`` (a :class:`FormatSet`) selects which format kernels get compiled."""
    matmul_sel(fset, w, desc, A, t0, t1, g0, g1, out, ot, add)


# ----------------------------------------------------------------------------- numpy twin
def act_numpy(x: np.ndarray, t: GGMLType | int) -> np.ndarray:
    """The activation a weight of type ``t`` sees, dequantized to float64 ([n, k])."""
    kind = traits.get(t).act
    if kind == ACT_Q8:
        q, d, _, _ = quantize_q8_numpy(x)
        return (q.reshape(len(x), -1, 32) * d[..., None].astype(np.float64)).reshape(x.shape)
    if kind == ACT_Q8K:
        q, d, _ = quantize_q8k_numpy(x)
        return (q.reshape(len(x), -1, 256) * d[..., None].astype(np.float64)).reshape(x.shape)
    return round_activations_numpy(x, {ACT_F32: 2, ACT_F16: 3, ACT_BF16: 4}[kind]).astype(
        np.float64
    )


def block_mins(packed: np.ndarray, t: GGMLType | int, nrows: int, ncols: int):
    """Per-block mins ``[nrows, ncols/32]`` of the formats with one (Q4_1 / Q5_1: the record's
    ``block_min``), None for the others."""
    field = traits.get(t).block_min
    if field is None:
        return None
    f = unpack_fields(packed, t, nrows, ncols)[field]
    return np.ascontiguousarray(f).view(np.float16)[..., 0].astype(np.float64)


def matmul_numpy(
    packed: np.ndarray,
    t: GGMLType | int,
    nrows: int,
    ncols: int,
    x: np.ndarray,
    wf: np.ndarray | None = None,
    mins: np.ndarray | None = None,
):
    """Reference ``act(x) @ W.T`` in float64 -> float32 ``[n, nrows]``.

    For Q4_1 / Q5_1 the min term uses q8_1's stored ``s`` (f16) as ggml does; ``wf`` /
    ``mins`` may pass precomputed dequantized weights / :func:`block_mins`.
    """
    x = np.asarray(x, np.float32)
    if wf is None:
        wf = dequantize_repacked_numpy(packed, t, nrows, ncols)
    y = act_numpy(x, t) @ wf.T.astype(np.float64)
    if traits.get(t).block_min is not None:
        if mins is None:
            mins = block_mins(packed, t, nrows, ncols)
        _, xd, xs, xb = quantize_q8_numpy(x)
        xb32 = xb.reshape(len(x), -1, 8).sum(-1)
        y += (xs.astype(np.float64) - xd.astype(np.float64) * xb32) @ mins.T
    return y.astype(np.float32)
