"""IQ2_XS: super-blocks of 256 weights, 2.31 bits each: an f16 ``d``, 32 16-bit words (a
9-bit index into the 512-point ``iq2xs_grid`` and a 7-bit sign field per 8 weights; the
eighth sign is the parity) and one byte per 32 weights holding two 4-bit scales ``ls`` (one
per 16): ``x = d * (0.5 + ls) * 0.25 * grid * sign``.

Quantization is ggml's ``quantize_iq2_xs`` (see :mod:`._iq2quant`); like ggml it needs an
importance matrix.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from llamacpy.gguf.constants import GGMLType
from llamacpy.quants import _iq2quant, _iq2quant_np
from llamacpy.quants import _iqgrid as G
from llamacpy.quants.iq2_xxs import mult_numpy

TYPE = GGMLType.IQ2_XS
BLOCK = np.dtype([("d", "<f2"), ("qs", "<u2", (G.QK // 8,)), ("scales", "u1", (G.QK // 32,))])
TYPE_SIZE = BLOCK.itemsize
NSUB = 16  # one scale per 16
C = 1.0
VALUES = (-43, -25, -8, 8, 25, 43)  # every value ``decode`` gives
GRID = G.grid("iq2xs_grid", 9)


@njit(cache=True, inline="always")
def decode(raw, o, v, sc):
    """The block at ``raw[o:]``: signed grid values to ``v``, ``2 * ls + 1`` to ``sc``."""
    for ib in range(8):
        s = np.int64(raw[o + 66 + ib])
        sc[2 * ib] = 2 * (s & 15) + 1
        sc[2 * ib + 1] = 2 * (s >> 4) + 1
        for l in range(4):
            q = G.u16(raw, o + 2 + 8 * ib + 2 * l)
            G.signed8(v, 32 * ib + 8 * l, GRID, q & 511, G.KSIGNS[q >> 9], 0, 8)
    return G.u16(raw, o)


def decode_numpy(b: np.ndarray):
    """``decode`` over structured blocks: (d bits, values [n, 256], scales [n, 16])."""
    q = b["qs"].astype(np.int64)  # [n, 32]
    v = GRID[q & 511].astype(np.int64) * G.signs_np(G.KSIGNS[q >> 9], 8)
    s = b["scales"].astype(np.int64)
    sc = np.stack([s & 15, s >> 4], axis=-1).reshape(-1, NSUB)
    return b["d"], v.reshape(-1, G.QK), 2 * sc + 1


def quantize(x, imatrix=None, out=None) -> np.ndarray:
    """Quantize rows (last axis) to IQ2_XS bytes, as llama.cpp's ``quantize_iq2_xs`` (numba).

    ``imatrix`` is required (ggml asserts on its absence: :class:`QuantError` here).

    Raises :class:`~llamacpy.quants.QuantError` where llama.cpp's quantizer aborts (NaN or
    infinite input, magnitudes whose squares overflow).
    """
    return _iq2quant.quantize(1, x, imatrix, out, TYPE.name, TYPE_SIZE)


def quantize_numpy(x, imatrix=None) -> np.ndarray:
    """Vectorized numpy twin of :func:`quantize`."""
    return _iq2quant_np.quantize_np(1, x, imatrix, TYPE.name, TYPE_SIZE)


FORMAT = G.register_format(TYPE, BLOCK, NSUB, C, decode_numpy, mult_numpy, quantize, quantize_numpy)
dequantize, dequantize_numpy = FORMAT.dequantize, FORMAT.dequantize_numpy
