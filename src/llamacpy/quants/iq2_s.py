"""IQ2_S: super-blocks of 256 weights, 2.56 bits each: an f16 ``d``, 32 low index bytes, 32
sign bytes (one per 8 weights, all 8 signs stored), 8 bytes of high index bits (2 per 8
weights: 10-bit indices into the 1024-point ``iq2s_grid``) and one byte per 32 weights with
two 4-bit scales ``ls``: ``x = d * (0.5 + ls) * 0.25 * grid * sign``.

Quantization is ggml's ``quantize_iq2_s`` (see :mod:`._iq2quant`), with or without
importance weights.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from llamacpy.gguf.constants import GGMLType
from llamacpy.quants import _iq2quant, _iq2quant_np
from llamacpy.quants import _iqgrid as G
from llamacpy.quants.iq2_xxs import mult_numpy

TYPE = GGMLType.IQ2_S
BLOCK = np.dtype(
    [
        ("d", "<f2"),
        ("qs", "u1", (G.QK // 8,)),
        ("signs", "u1", (G.QK // 8,)),
        ("qh", "u1", (G.QK // 32,)),
        ("scales", "u1", (G.QK // 32,)),
    ]
)
TYPE_SIZE = BLOCK.itemsize
NSUB = 16
C = 1.0
VALUES = (-43, -25, -8, 8, 25, 43)  # every value ``decode`` gives
GRID = G.grid("iq2s_grid", 10)
_QS, _SIGNS, _QH, _SC = 2, 34, 66, 74


@njit(cache=True, inline="always")
def decode(raw, o, v, sc):
    """The block at ``raw[o:]``: signed grid values to ``v``, ``2 * ls + 1`` to ``sc``."""
    for ib in range(8):
        s = np.int64(raw[o + _SC + ib])
        sc[2 * ib] = 2 * (s & 15) + 1
        sc[2 * ib + 1] = 2 * (s >> 4) + 1
        h = np.int64(raw[o + _QH + ib])
        for l in range(4):
            gi = np.int64(raw[o + _QS + 4 * ib + l]) | ((h << (8 - 2 * l)) & 0x300)
            G.signed8(v, 32 * ib + 8 * l, GRID, gi, np.int64(raw[o + _SIGNS + 4 * ib + l]), 0, 8)
    return G.u16(raw, o)


def decode_numpy(b: np.ndarray):
    """``decode`` over structured blocks: (d bits, values [n, 256], scales [n, 16])."""
    qs = b["qs"].astype(np.int64).reshape(-1, 8, 4)
    h = b["qh"].astype(np.int64)[..., None] >> (2 * np.arange(4))
    v = GRID[qs | ((h & 3) << 8)].astype(np.int64)
    v = v * G.signs_np(b["signs"].reshape(-1, 8, 4), 8)
    s = b["scales"].astype(np.int64)
    sc = np.stack([s & 15, s >> 4], axis=-1).reshape(-1, NSUB)
    return b["d"], v.reshape(-1, G.QK), 2 * sc + 1


def quantize(x, imatrix=None, out=None) -> np.ndarray:
    """Quantize rows (last axis) to IQ2_S bytes, as llama.cpp's ``quantize_iq2_s`` (numba).

    Raises :class:`~llamacpy.quants.QuantError` where llama.cpp's quantizer aborts (NaN or
    infinite input, magnitudes whose squares overflow).
    """
    return _iq2quant.quantize(2, x, imatrix, out, TYPE.name, TYPE_SIZE)


def quantize_numpy(x, imatrix=None) -> np.ndarray:
    """Vectorized numpy twin of :func:`quantize`."""
    return _iq2quant_np.quantize_np(2, x, imatrix, TYPE.name, TYPE_SIZE)


FORMAT = G.register_format(TYPE, BLOCK, NSUB, C, decode_numpy, mult_numpy, quantize, quantize_numpy)
dequantize, dequantize_numpy = FORMAT.dequantize, FORMAT.dequantize_numpy
