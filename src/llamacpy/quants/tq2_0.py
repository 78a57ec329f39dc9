"""TQ2_0: ternary super-blocks of 256 weights, 2.06 bits each: 64 bytes of 2-bit codes ``q``
(byte ``m`` of each 32-byte half holds elements ``m + 32 * l`` of that half at bits ``2 l``)
then an f16 ``d``: ``x = (q - 1) * d``.

Dequantize only (ggml's ``dequantize_row_tq2_0``).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from llamacpy.gguf.constants import GGMLType
from llamacpy.quants._iqgrid import QK, register_format, u16

TYPE = GGMLType.TQ2_0
BLOCK = np.dtype([("qs", "u1", (QK // 4,)), ("d", "<f2")])
TYPE_SIZE = BLOCK.itemsize
NSUB = 1
C = 1.0


@njit(cache=True, inline="always")
def decode(raw, o, v, sc):
    """The block at ``raw[o:]``: ``q - 1`` to ``v`` (``sc``: 1)."""
    sc[0] = 1
    for h in range(2):
        for l in range(4):
            for m in range(32):
                v[128 * h + 32 * l + m] = ((np.int64(raw[o + 32 * h + m]) >> (2 * l)) & 3) - 1
    return u16(raw, o + QK // 4)


@njit(cache=True, inline="always")
def mult(d, s):
    return d


def mult_numpy(d, s):
    return np.broadcast_to(d, s.shape).astype(np.float32)


def decode_numpy(b: np.ndarray):
    """``decode`` over structured blocks: (d bits, values [n, 256], scales [n, 1])."""
    q = b["qs"].astype(np.int64).reshape(-1, 2, 1, 32) >> (2 * np.arange(4))[:, None]
    v = (q & 3) - 1  # [n, 2, 4, 32]
    return b["d"], v.reshape(-1, QK), np.ones((len(b), 1), np.int64)


FORMAT = register_format(TYPE, BLOCK, NSUB, C, decode_numpy, mult_numpy)
dequantize, dequantize_numpy = FORMAT.dequantize, FORMAT.dequantize_numpy
