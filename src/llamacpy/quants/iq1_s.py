"""IQ1_S: super-blocks of 256 weights, 1.56 bits each: an f16 ``d``, 32 low index bytes and,
per 32 weights, a 16-bit word with four 3-bit high index parts (11-bit indices into the
2048-point ternary ``iq1s_grid``), a 3-bit scale ``ls`` and the sign of a shift ``delta``
(1/8): ``x = d * (2 * ls + 1) * (grid + delta)``.

The integer value of a weight is ``8 * grid + sign(delta)`` (``grid + delta`` is that over
8, exactly). Quantization is ggml's ``quantize_iq1_s`` (see :mod:`._iq1quant`); like ggml
it needs an importance matrix.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from llamacpy.gguf.constants import GGMLType
from llamacpy.quants import _iq1quant, _iq1quant_np
from llamacpy.quants._iqgrid import QK, grid, register_format, u16
from llamacpy.quants.iq3_s import mult_numpy

TYPE = GGMLType.IQ1_S
BLOCK = np.dtype([("d", "<f2"), ("qs", "u1", (QK // 8,)), ("qh", "<u2", (QK // 32,))])
TYPE_SIZE = BLOCK.itemsize
NSUB = 8
C = 0.125  # IQ1S_DELTA: values are 8 * (grid + delta)
VALUES = (-9, -7, -1, 1, 7, 9)  # 8 * grid (-1, 0, 1) + delta (+-1)
GRID = grid("iq1s_grid", 11).view(np.int8)


@njit(cache=True, inline="always")
def ternary8(v, vo, gi, delta):
    """``8 * grid + delta`` of the 8 elements of grid entry ``gi`` to ``v[vo:]``."""
    for j in range(8):
        v[vo + j] = 8 * np.int64(GRID[gi, j]) + delta


@njit(cache=True, inline="always")
def decode(raw, o, v, sc):
    """The block at ``raw[o:]``: ``8 * grid + sign(delta)`` to ``v``, ``2 * ls + 1`` to ``sc``."""
    for ib in range(8):
        h = u16(raw, o + 34 + 2 * ib)
        sc[ib] = 2 * ((h >> 12) & 7) + 1
        delta = -1 if h & 0x8000 else 1
        for l in range(4):
            gi = np.int64(raw[o + 2 + 4 * ib + l]) | (((h >> (3 * l)) & 7) << 8)
            ternary8(v, 32 * ib + 8 * l, gi, delta)
    return u16(raw, o)


def decode_numpy(b: np.ndarray):
    """``decode`` over structured blocks: (d bits, values [n, 256], scales [n, 8])."""
    h = b["qh"].astype(np.int64)  # [n, 8]
    idx = b["qs"].astype(np.int64).reshape(-1, 8, 4) | (
        ((h[..., None] >> (3 * np.arange(4))) & 7) << 8
    )
    delta = np.where(h & 0x8000, -1, 1)[..., None, None]
    v = 8 * GRID[idx].astype(np.int64) + delta  # [n, 8, 4, 8]
    return b["d"], v.reshape(-1, QK), 2 * ((h >> 12) & 7) + 1


def quantize(x, imatrix=None, out=None) -> np.ndarray:
    """Quantize rows (last axis) to IQ1_S bytes, as llama.cpp's ``quantize_iq1_s`` (numba).

    ``imatrix`` is required (ggml asserts on its absence: :class:`QuantError` here).

    Raises :class:`~llamacpy.quants.QuantError` where llama.cpp's quantizer aborts (NaN or
    infinite input).
    """
    return _iq1quant.quantize(0, x, imatrix, out, TYPE.name, TYPE_SIZE)


def quantize_numpy(x, imatrix=None) -> np.ndarray:
    """Vectorized numpy twin of :func:`quantize`."""
    return _iq1quant_np.quantize_np(0, x, imatrix, TYPE.name, TYPE_SIZE)


FORMAT = register_format(TYPE, BLOCK, NSUB, C, decode_numpy, mult_numpy, quantize, quantize_numpy)
dequantize, dequantize_numpy = FORMAT.dequantize, FORMAT.dequantize_numpy
