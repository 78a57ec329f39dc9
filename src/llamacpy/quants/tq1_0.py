"""TQ1_0: ternary super-blocks of 256 weights, 1.69 bits each: 48 bytes of five base-3 digits
each (``q = (uint8)(byte * 3**n) * 3 >> 8``; bytes 0..31 give elements ``32 n + m``, bytes
32..47 elements ``160 + 16 n + m``), 4 bytes of four digits each (elements ``240 + 4 n + j``)
and an f16 ``d``: ``x = (q - 1) * d``.

Dequantize only (ggml's ``dequantize_row_tq1_0``).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from llamacpy.gguf.constants import GGMLType
from llamacpy.quants._iqgrid import register_format, u16
from llamacpy.quants.tq2_0 import mult_numpy

TYPE = GGMLType.TQ1_0
BLOCK = np.dtype([("qs", "u1", (48,)), ("qh", "u1", (4,)), ("d", "<f2")])
TYPE_SIZE = BLOCK.itemsize
NSUB = 1
C = 1.0
POW3 = np.array([1, 3, 9, 27, 81, 243], dtype=np.int64)
# (first byte, bytes, digits, first element) of the three runs of a block
_RUNS = ((0, 32, 5, 0), (32, 16, 5, 160), (48, 4, 4, 240))


@njit(cache=True, inline="always")
def trit(byte, n):
    """Digit ``n`` of a packed byte, as ggml extracts it."""
    q = (np.int64(byte) * POW3[n]) & 0xFF
    return (q * 3) >> 8


@njit(cache=True, inline="always")
def decode(raw, o, v, sc):
    """The block at ``raw[o:]``: ``q - 1`` to ``v`` (``sc``: 1)."""
    sc[0] = 1
    for b0, nb, nd, e0 in _RUNS:
        for n in range(nd):
            for m in range(nb):
                v[e0 + nb * n + m] = trit(raw[o + b0 + m], n) - 1
    return u16(raw, o + 52)


def decode_numpy(b: np.ndarray):
    """``decode`` over structured blocks: (d bits, values [n, 256], scales [n, 1])."""
    raw = b.view(np.uint8).reshape(len(b), -1).astype(np.int64)
    parts = []
    for b0, nb, nd, _ in _RUNS:
        q = (raw[:, None, b0 : b0 + nb] * POW3[:nd, None]) & 0xFF  # [n, digits, bytes]
        parts.append((((q * 3) >> 8) - 1).reshape(len(b), -1))
    return b["d"], np.concatenate(parts, axis=1), np.ones((len(b), 1), np.int64)


FORMAT = register_format(TYPE, BLOCK, NSUB, C, decode_numpy, mult_numpy)
dequantize, dequantize_numpy = FORMAT.dequantize, FORMAT.dequantize_numpy
