"""What ggml's grid and ternary formats share (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S,
IQ1_M, TQ1_0, TQ2_0): their lookup grids, and dequantization from a block's integer form.

Every one of these formats is, per super-block of 256 weights, ``x = m(d, s) * v * c``: an
integer value ``v`` per weight (grid magnitude with its sign; IQ1: ``8 * grid + delta`` so
that ``c = 1/8`` makes ``grid + delta`` exact; TQ: ``-1, 0, 1``), an integer sub-block scale
``s`` (``2 * ls + 1`` in most formats, as ggml's dot products use it) and a float multiplier
``m(d, s)`` computed as ``dequantize_row_*`` computes it (its rounding order matters). A
format's module supplies

* ``decode(raw, o, v, sc)`` (numba): the block at ``raw[o:]`` -> ``v`` (int8, 256), ``sc``
  (int32, one per sub-block), returning the IEEE half bits of ``d``;
* ``mult(d, s)`` (numba) and ``mult_numpy``: the float multiplier of a sub-block;
* ``decode_numpy(blocks)``: the vectorized twin of ``decode`` over structured blocks;

and :mod:`._iqcodes` (one numba kernel for all of them, dispatching on the type id) and
:func:`dequantize_numpy` expand them. The engine repacks the same integer form
(``ops/qdot_iq.py``).

The grids are data, ``iq_grids.npz`` (made by ``scripts/make_iq_grids.py`` from llama.cpp's
``ggml-common.h``): ``uint8 [entries, 8 or 4]``, element ``j`` of a grid point in byte ``j``
(IQ1: signed bytes). Index fields are exactly as wide as their grid (8 bits: 256 entries, 9:
512, 10: 1024, 11: 2048), so no stored index can point outside a table; :func:`grid` checks
the widths at import.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
from numba import njit

from llamacpy.gguf.constants import GGML_BLOCK_SIZES, GGMLType
from llamacpy.quants._helpers import F32, blocks_np, fp16_to_fp32_np, run_dequantize
from llamacpy.quants._registry import QuantFormat, register

QK = 256
_GRIDS = np.load(Path(__file__).with_name("iq_grids.npz"))


def grid(name: str, index_bits: int) -> np.ndarray:
    """The grid ``name`` of ``iq_grids.npz``, checked to have one entry per index value."""
    g = np.ascontiguousarray(_GRIDS[name])
    if g.shape[0] != 1 << index_bits:
        raise AssertionError(f"{name}: {g.shape[0]} entries, {index_bits}-bit indices")
    return g


# ggml's ksigns_iq2xs: 7 stored sign bits and their parity as the eighth
KSIGNS = np.array([i | (bin(i).count("1") & 1) << 7 for i in range(128)], dtype=np.uint8)


@njit(cache=True, inline="always")
def u16(raw, o):
    return np.int64(raw[o]) | (np.int64(raw[o + 1]) << 8)


@njit(cache=True, inline="always")
def u32(raw, o):
    return u16(raw, o) | (u16(raw, o + 2) << 16)


@njit(cache=True, inline="always")
def signed8(v, vo, g, gi, signs, sbit0, n):
    """``n`` magnitudes of grid entry ``g[gi]`` to ``v[vo:]``, element ``j`` negated where bit
    ``sbit0 + j`` of ``signs`` is set."""
    for j in range(n):
        m = np.int64(g[gi, j])
        v[vo + j] = -m if (signs >> (sbit0 + j)) & 1 else m


_HALF = F32(0.5)


@njit(cache=True, inline="always")
def half_scale(d, s, k):
    """``d * (0.5 + ls) * k`` as C evaluates it, from ``s = 2 * ls + 1`` (``0.5 + ls = s / 2``,
    exact): the IQ2 (``k = 0.25``) and IQ3_XXS (``k = 0.5``) multipliers."""
    return (d * (F32(s) * _HALF)) * k


def half_scale_numpy(d, s, k):
    return ((d * (s * _HALF)).astype(np.float32) * F32(k)).astype(np.float32)


def dequantize_numpy(raw, n, block, name, decode_numpy, mult_numpy, c) -> np.ndarray:
    """Vectorized twin of the numba path: ``decode_numpy`` then the same float order."""
    b = blocks_np(raw, n, QK, block, name)
    dbits, v, sc = decode_numpy(b)
    dbits = np.asarray(dbits)
    d = fp16_to_fp32_np(
        dbits.view(np.uint16) if dbits.dtype == np.float16 else dbits.astype(np.uint16)
    )
    with np.errstate(all="ignore"):  # inf/NaN scales are part of the data
        m = mult_numpy(d[:, None], sc.astype(np.float32))  # [blocks, nsub]
        y = np.repeat(m, QK // sc.shape[1], axis=1) * (v.astype(np.float32) * F32(c))
    return y.astype(np.float32).reshape(-1)


def register_format(
    t, block, nsub: int, c: float, decode_numpy, mult_numpy, quantize=None, quantize_numpy=None
) -> QuantFormat:
    """Register a grid / ternary format (with its quantizers where it has them); the numba
    dequantize path is :func:`llamacpy.quants._iqcodes.dequantize_kernel`, which dispatches
    on the type id."""
    qk, type_size = GGML_BLOCK_SIZES[t]
    assert qk == QK and block.itemsize == type_size, t

    def dequantize(raw, n: int, out: np.ndarray | None = None) -> np.ndarray:
        from llamacpy.quants._iqcodes import dequantize_kernel

        kernel = partial(dequantize_kernel, int(t))
        return run_dequantize(kernel, raw, n, QK, type_size, t.name, out)

    def dequantize_np(raw, n: int) -> np.ndarray:
        return dequantize_numpy(raw, n, block, t.name, decode_numpy, mult_numpy, c)

    dequantize.__doc__ = f"The first ``n`` elements stored in ``raw`` ({t.name} blocks) as float32."
    dequantize_np.__doc__ = "Vectorized numpy twin of ``dequantize``."
    fmt = QuantFormat(t, block, dequantize, dequantize_np, quantize, quantize_numpy, GGMLType.Q8_K)
    return register(fmt)


def signs_np(bits: np.ndarray, n: int) -> np.ndarray:
    """``[..., n]`` of -1/+1 from the low ``n`` bits of ``bits``."""
    j = np.arange(n)
    return 1 - 2 * ((bits[..., None].astype(np.int64) >> j) & 1)
