"""IQ3_S: super-blocks of 256 weights, 3.44 bits each: an f16 ``d``, 64 low index bytes, 8
bytes of high index bits (9-bit indices into the 512-point ``iq3s_grid``, 4 magnitudes
each), 32 sign bytes (one per 8 weights) and one byte per 64 weights with two 4-bit scales
``ls`` (one per 32): ``x = d * (1 + 2 * ls) * grid * sign``.

Quantization is ggml's ``quantize_iq3_s`` (see :mod:`._iq3quant`), with or without
importance weights.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from llamacpy.gguf.constants import GGMLType
from llamacpy.quants import _iq3quant
from llamacpy.quants import _iqgrid as G
from llamacpy.quants._helpers import F32

TYPE = GGMLType.IQ3_S
BLOCK = np.dtype(
    [
        ("d", "<f2"),
        ("qs", "u1", (G.QK // 4,)),
        ("qh", "u1", (G.QK // 32,)),
        ("signs", "u1", (G.QK // 8,)),
        ("scales", "u1", (G.QK // 64,)),
    ]
)
TYPE_SIZE = BLOCK.itemsize
NSUB = 8
C = 1.0
VALUES = tuple(range(-15, 16, 2))  # the grid's odd 1..15 with a sign
GRID = G.grid("iq3s_grid", 9)
_QS, _QH, _SIGNS, _SC = 2, 66, 74, 106


@njit(cache=True, inline="always")
def decode(raw, o, v, sc):
    """The block at ``raw[o:]``: signed grid values to ``v``, ``1 + 2 * ls`` to ``sc``."""
    for ib in range(8):
        sc[ib] = 1 + 2 * ((np.int64(raw[o + _SC + ib // 2]) >> (4 * (ib % 2))) & 15)
        h = np.int64(raw[o + _QH + ib])
        for l in range(4):
            q = o + _QS + 8 * ib + 2 * l
            signs = np.int64(raw[o + _SIGNS + 4 * ib + l])
            g1 = np.int64(raw[q]) | ((h << (8 - 2 * l)) & 256)
            g2 = np.int64(raw[q + 1]) | ((h << (7 - 2 * l)) & 256)
            G.signed8(v, 32 * ib + 8 * l, GRID, g1, signs, 0, 4)
            G.signed8(v, 32 * ib + 8 * l + 4, GRID, g2, signs, 4, 4)
    return G.u16(raw, o)


@njit(cache=True, inline="always")
def mult(d, s):
    return d * F32(s)


def mult_numpy(d, s):
    return (d * s).astype(np.float32)


def decode_numpy(b: np.ndarray):
    """``decode`` over structured blocks: (d bits, values [n, 256], scales [n, 8])."""
    qs = b["qs"].astype(np.int64).reshape(-1, 8, 8)  # 8 indices per 32 weights
    high = (b["qh"].astype(np.int64)[..., None] >> np.arange(8)) & 1
    v = GRID[qs | (high << 8)].astype(np.int64).reshape(-1, 8, 4, 8)
    v = v * G.signs_np(b["signs"].reshape(-1, 8, 4), 8)
    s = b["scales"].astype(np.int64)
    sc = np.stack([s & 15, s >> 4], axis=-1).reshape(-1, NSUB)
    return b["d"], v.reshape(-1, G.QK), 1 + 2 * sc


def quantize(x, imatrix=None, out=None) -> np.ndarray:
    """Quantize rows (last axis) to IQ3_S bytes, as llama.cpp's ``quantize_iq3_s`` (numba).

    Raises :class:`~llamacpy.quants.QuantError` where llama.cpp's quantizer aborts (some NaN
    or infinite input, magnitudes of about 1e12 and up).
    """
    return _iq3quant.quantize(x, imatrix, out, False, GRID, TYPE.name, TYPE_SIZE)


def quantize_numpy(x, imatrix=None) -> np.ndarray:
    """Vectorized numpy twin of :func:`quantize`."""
    return _iq3quant.quantize_numpy(x, imatrix, False, GRID, TYPE.name, TYPE_SIZE)


FORMAT = G.register_format(TYPE, BLOCK, NSUB, C, decode_numpy, mult_numpy, quantize, quantize_numpy)
dequantize, dequantize_numpy = FORMAT.dequantize, FORMAT.dequantize_numpy
