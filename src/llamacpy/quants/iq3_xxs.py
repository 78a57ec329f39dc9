"""IQ3_XXS: super-blocks of 256 weights, 3.06 bits each: an f16 ``d``, 64 indices into the
256-point ``iq3xxs_grid`` (4 magnitudes each) and, per 32 weights, a 32-bit word with four
7-bit sign fields (the eighth sign is the parity) and a 4-bit scale ``ls``:
``x = d * (0.5 + ls) * 0.5 * grid * sign``.

Quantization is ggml's ``quantize_iq3_xxs`` (see :mod:`._iq3quant`), with or without
importance weights.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from llamacpy.gguf.constants import GGMLType
from llamacpy.quants import _iq3quant
from llamacpy.quants import _iqgrid as G
from llamacpy.quants._helpers import F32

TYPE = GGMLType.IQ3_XXS
BLOCK = np.dtype([("d", "<f2"), ("qs", "u1", (G.QK // 4,)), ("ss", "<u4", (G.QK // 32,))])
TYPE_SIZE = BLOCK.itemsize
NSUB = 8
C = 1.0
# every value ``decode`` gives: the grid's 4, 12, .., 52, 62 with a sign
VALUES = tuple(s * m for s in (-1, 1) for m in (4, 12, 20, 28, 36, 44, 52, 62))
GRID = G.grid("iq3xxs_grid", 8)
_HALF = F32(0.5)


@njit(cache=True, inline="always")
def decode(raw, o, v, sc):
    """The block at ``raw[o:]``: signed grid values to ``v``, ``2 * ls + 1`` to ``sc``."""
    for ib in range(8):
        aux = G.u32(raw, o + 66 + 4 * ib)
        sc[ib] = 2 * (aux >> 28) + 1
        q = o + 2 + 8 * ib
        for l in range(4):
            signs = G.KSIGNS[(aux >> (7 * l)) & 127]
            e = 32 * ib + 8 * l
            G.signed8(v, e, GRID, raw[q + 2 * l], signs, 0, 4)
            G.signed8(v, e + 4, GRID, raw[q + 2 * l + 1], signs, 4, 4)
    return G.u16(raw, o)


@njit(cache=True, inline="always")
def mult(d, s):
    return G.half_scale(d, s, _HALF)


def mult_numpy(d, s):
    return G.half_scale_numpy(d, s, _HALF)


def decode_numpy(b: np.ndarray):
    """``decode`` over structured blocks: (d bits, values [n, 256], scales [n, 8])."""
    aux = b["ss"].astype(np.int64)  # [n, 8]
    signs = G.KSIGNS[(aux[..., None] >> (7 * np.arange(4))) & 127]  # [n, 8, 4]
    mag = GRID[b["qs"]].reshape(-1, 8, 4, 8).astype(np.int64)  # two entries per 8 weights
    v = mag * G.signs_np(signs, 8)
    return b["d"], v.reshape(-1, G.QK), 2 * (aux >> 28) + 1


def quantize(x, imatrix=None, out=None) -> np.ndarray:
    """Quantize rows (last axis) to IQ3_XXS bytes, as llama.cpp's ``quantize_iq3_xxs`` (numba).

    Raises :class:`~llamacpy.quants.QuantError` where llama.cpp's quantizer aborts (some NaN
    or infinite input, magnitudes of about 1e12 and up).
    """
    return _iq3quant.quantize(x, imatrix, out, True, GRID, TYPE.name, TYPE_SIZE)


def quantize_numpy(x, imatrix=None) -> np.ndarray:
    """Vectorized numpy twin of :func:`quantize`."""
    return _iq3quant.quantize_numpy(x, imatrix, True, GRID, TYPE.name, TYPE_SIZE)


FORMAT = G.register_format(TYPE, BLOCK, NSUB, C, decode_numpy, mult_numpy, quantize, quantize_numpy)
dequantize, dequantize_numpy = FORMAT.dequantize, FORMAT.dequantize_numpy
