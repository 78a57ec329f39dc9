"""IQ2_XXS: super-blocks of 256 weights, 2.06 bits each: an f16 ``d`` and, per 32 weights,
8 bytes: four indices into the 256-point ``iq2xxs_grid`` (8 magnitudes each), then a 32-bit
word with four 7-bit sign fields (the eighth sign is the parity) and a 4-bit scale ``ls``:
``x = d * (0.5 + ls) * 0.25 * grid * sign``.

Quantization is ggml's ``quantize_iq2_xxs`` (see :mod:`._iq2quant`); like ggml it needs an
importance matrix.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from llamacpy.gguf.constants import GGML_BLOCK_SIZES, GGMLType
from llamacpy.quants import _iq2quant, _iq2quant_np
from llamacpy.quants import _iqgrid as G
from llamacpy.quants._helpers import F32

TYPE = GGMLType.IQ2_XXS
TYPE_SIZE = GGML_BLOCK_SIZES[TYPE][1]
BLOCK = np.dtype([("d", "<f2"), ("qs", "<u4", (G.QK // 16,))])
assert BLOCK.itemsize == TYPE_SIZE
NSUB = 8  # one scale per 32
C = 1.0
VALUES = (-43, -25, -8, 8, 25, 43)  # the grid's 8, 25, 43 with a sign
GRID = G.grid("iq2xxs_grid", 8)
_QUARTER = F32(0.25)


@njit(cache=True, inline="always")
def decode(raw, o, v, sc):
    """The block at ``raw[o:]``: signed grid values to ``v``, ``2 * ls + 1`` to ``sc``."""
    for ib in range(8):
        q = o + 2 + 8 * ib
        aux = G.u32(raw, q + 4)
        sc[ib] = 2 * (aux >> 28) + 1
        for l in range(4):
            G.signed8(v, 32 * ib + 8 * l, GRID, raw[q + l], G.KSIGNS[(aux >> (7 * l)) & 127], 0, 8)
    return G.u16(raw, o)


@njit(cache=True, inline="always")
def mult(d, s):
    return G.half_scale(d, s, _QUARTER)


def mult_numpy(d, s):
    return G.half_scale_numpy(d, s, _QUARTER)


def decode_numpy(b: np.ndarray):
    """``decode`` over structured blocks: (d bits, values [n, 256], scales [n, 8])."""
    q = b["qs"].reshape(-1, 8, 2)  # two 32-bit words per 32 weights
    idx = q[..., 0:1].view(np.uint8).reshape(-1, 8, 4)
    aux = q[..., 1].astype(np.int64)
    signs = G.KSIGNS[(aux[..., None] >> (7 * np.arange(4))) & 127]  # [n, 8, 4]
    v = GRID[idx].astype(np.int64) * G.signs_np(signs, 8)
    return b["d"], v.reshape(-1, G.QK), 2 * (aux >> 28) + 1


def quantize(x, imatrix=None, out=None) -> np.ndarray:
    """Quantize rows (last axis) to IQ2_XXS bytes, as llama.cpp's ``quantize_iq2_xxs`` (numba).

    ``imatrix`` is required (ggml asserts on its absence: :class:`QuantError` here).

    Raises :class:`~llamacpy.quants.QuantError` where llama.cpp's quantizer aborts (NaN or
    infinite input, magnitudes whose squares overflow).
    """
    return _iq2quant.quantize(0, x, imatrix, out, TYPE.name, TYPE_SIZE)


def quantize_numpy(x, imatrix=None) -> np.ndarray:
    """Vectorized numpy twin of :func:`quantize`."""
    return _iq2quant_np.quantize_np(0, x, imatrix, TYPE.name, TYPE_SIZE)


FORMAT = G.register_format(TYPE, BLOCK, NSUB, C, decode_numpy, mult_numpy, quantize, quantize_numpy)
dequantize, dequantize_numpy = FORMAT.dequantize, FORMAT.dequantize_numpy
