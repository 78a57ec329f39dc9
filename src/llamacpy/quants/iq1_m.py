"""IQ1_M: super-blocks of 256 weights, 1.75 bits each, no ``d`` field: 32 low index bytes, 16
bytes of high index parts (3 bits per 8 weights: 11-bit indices into ``iq1s_grid``) each with
the sign of a ``delta`` (1/8) of its 8 weights, and 8 scale bytes as four 16-bit words: two
3-bit scales per 32 weights (one per 16) in the low 12 bits of each, the f16 ``d`` in their
top nibbles. ``x = d * (2 * ls + 1) * (grid + delta)``.

The integer value of a weight is ``8 * grid + sign(delta)``. Quantization is ggml's
``quantize_iq1_m`` (see :mod:`._iq1quant`), with or without importance weights.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from llamacpy.gguf.constants import GGMLType
from llamacpy.quants import _iq1quant, _iq1quant_np
from llamacpy.quants._iqgrid import QK, register_format, u16
from llamacpy.quants.iq1_s import GRID, ternary8
from llamacpy.quants.iq3_s import mult_numpy

TYPE = GGMLType.IQ1_M
BLOCK = np.dtype([("qs", "u1", (QK // 8,)), ("qh", "u1", (QK // 16,)), ("sc", "<u2", (4,))])
TYPE_SIZE = BLOCK.itemsize
NSUB = 16
C = 0.125
VALUES = (-9, -7, -1, 1, 7, 9)  # every value ``decode`` gives
_QH, _SC = 32, 48


@njit(cache=True, inline="always")
def decode(raw, o, v, sc):
    """The block at ``raw[o:]``: ``8 * grid + sign(delta)`` to ``v``, ``2 * ls + 1`` to ``sc``;
    returns the f16 bits of ``d`` gathered from the scale words' top nibbles."""
    for ib in range(8):
        w = u16(raw, o + _SC + 2 * (ib // 2)) >> (6 * (ib % 2))
        sc[2 * ib] = 2 * (w & 7) + 1
        sc[2 * ib + 1] = 2 * ((w >> 3) & 7) + 1
        for l in range(4):
            h = np.int64(raw[o + _QH + 2 * ib + l // 2]) >> (4 * (l % 2))
            gi = np.int64(raw[o + 4 * ib + l]) | ((h & 7) << 8)
            ternary8(v, 32 * ib + 8 * l, gi, -1 if h & 8 else 1)
    s0, s1 = u16(raw, o + _SC), u16(raw, o + _SC + 2)
    s2, s3 = u16(raw, o + _SC + 4), u16(raw, o + _SC + 6)
    return (s0 >> 12) | ((s1 >> 8) & 0xF0) | ((s2 >> 4) & 0xF00) | (s3 & 0xF000)


def decode_numpy(b: np.ndarray):
    """``decode`` over structured blocks: (d bits, values [n, 256], scales [n, 16])."""
    h = b["qh"].astype(np.int64)[..., None] >> np.array([0, 4])  # [n, 16, 2]: one per 8
    h = h.reshape(-1, 8, 4)
    idx = b["qs"].astype(np.int64).reshape(-1, 8, 4) | ((h & 7) << 8)
    v = 8 * GRID[idx].astype(np.int64) + np.where(h & 8, -1, 1)[..., None]
    s = b["sc"].astype(np.int64)  # [n, 4]
    w = s[:, :, None] >> np.array([0, 3, 6, 9])  # [n, 4, 4]: scales of 32 weights x 2
    sc = 2 * (w & 7).reshape(-1, NSUB) + 1
    d = (s[:, 0] >> 12) | ((s[:, 1] >> 8) & 0xF0) | ((s[:, 2] >> 4) & 0xF00) | (s[:, 3] & 0xF000)
    return d, v.reshape(-1, QK), sc


def quantize(x, imatrix=None, out=None) -> np.ndarray:
    """Quantize rows (last axis) to IQ1_M bytes, as llama.cpp's ``quantize_iq1_m`` (numba).

    Raises :class:`~llamacpy.quants.QuantError` where llama.cpp's quantizer aborts (NaN or
    infinite input).
    """
    return _iq1quant.quantize(1, x, imatrix, out, TYPE.name, TYPE_SIZE)


def quantize_numpy(x, imatrix=None) -> np.ndarray:
    """Vectorized numpy twin of :func:`quantize`."""
    return _iq1quant_np.quantize_np(1, x, imatrix, TYPE.name, TYPE_SIZE)


FORMAT = register_format(TYPE, BLOCK, NSUB, C, decode_numpy, mult_numpy, quantize, quantize_numpy)
dequantize, dequantize_numpy = FORMAT.dequantize, FORMAT.dequantize_numpy
