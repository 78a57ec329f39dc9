"""TQ1_0: ternary super-blocks of 256 weights, 1.69 bits each: 48 bytes of five base-3 digits
each (``q = (uint8)(byte * 3**n) * 3 >> 8``; bytes 0..31 give elements ``32 n + m``, bytes
32..47 elements ``160 + 16 n + m``), 4 bytes of four digits each (elements ``240 + 4 n + j``)
and an f16 ``d``: ``x = (q - 1) * d``.

Quantization is ggml's ``quantize_row_tq1_0_ref`` (``d`` and the digits ``q`` as in TQ2_0;
each byte holds its digits, the first most significant, scaled by ``256 / 243`` rounding
up); llama.cpp ignores importance weights for TQ1_0, and so does :func:`quantize`.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from llamacpy.gguf.constants import GGMLType
from llamacpy.quants._helpers import run_quantize, run_quantize_np
from llamacpy.quants._iqgrid import QK, register_format, u16
from llamacpy.quants.tq2_0 import absmax_scale, mult_numpy, ternary_np, trit_code

TYPE = GGMLType.TQ1_0
BLOCK = np.dtype([("qs", "u1", (48,)), ("qh", "u1", (4,)), ("d", "<f2")])
TYPE_SIZE = BLOCK.itemsize
NSUB = 1
C = 1.0
VALUES = (-1, 0, 1)  # every value ``decode`` gives
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


# ----------------------------------------------------------------------------- quantize


@njit(cache=True, inline="always")
def pack_byte(q):
    """A byte of base-3 digits ``q`` (the five-digit value) as stored: ``ceil(q * 256 / 243)``
    (C's ``uint8_t`` arithmetic: wraps modulo 256)."""
    return ((q * 256 + 242) // 243) & 0xFF


@njit(cache=True, parallel=True, error_model="numpy")
def _quantize_ref_kernel(x, out):
    for i in prange(x.size // QK):
        o, ob = i * QK, i * TYPE_SIZE
        inv = absmax_scale(x, o, out, ob + 52)
        t = np.empty(QK, np.int32)
        for j in range(QK):
            t[j] = trit_code(x[o + j] * inv)
        for b0, nb, nd, e0 in _RUNS:
            for m in range(nb):
                q = np.int32(0)  # C's uint8_t wraps: the low byte is all that counts
                for n in range(nd):
                    q = q * 3 + t[e0 + nb * n + m]
                if nd == 4:  # the first digit to the most significant place
                    q *= 3
                out[ob + b0 + m] = pack_byte(q & 0xFF)


def quantize(x, imatrix=None, out=None) -> np.ndarray:
    """Quantize rows (last axis) to TQ1_0 bytes, as llama.cpp's ``quantize_tq1_0`` (numba);
    ``imatrix`` is accepted and ignored, as in llama.cpp."""
    return run_quantize(_quantize_ref_kernel, None, x, None, QK, TYPE_SIZE, TYPE.name, out)


def _ref_np(blocks: np.ndarray) -> np.ndarray:
    d, t = ternary_np(blocks)
    raw = np.zeros((len(blocks), TYPE_SIZE), np.int64)
    for b0, nb, nd, e0 in _RUNS:
        q = np.zeros((len(blocks), nb), np.int64)
        for n in range(nd):
            q = (q * 3 + t[:, e0 + nb * n : e0 + nb * (n + 1)]) & 0xFF
        if nd == 4:
            q = (q * 3) & 0xFF
        raw[:, b0 : b0 + nb] = ((q * 256 + 242) // 243) & 0xFF
    raw[:, 52], raw[:, 53] = d & 0xFF, d >> 8
    return raw.astype(np.uint8)


def quantize_numpy(x, imatrix=None) -> np.ndarray:
    """Vectorized numpy twin of :func:`quantize`."""
    return run_quantize_np(_ref_np, None, x, None, QK, TYPE_SIZE, TYPE.name)


FORMAT = register_format(TYPE, BLOCK, NSUB, C, decode_numpy, mult_numpy, quantize, quantize_numpy)
dequantize, dequantize_numpy = FORMAT.dequantize, FORMAT.dequantize_numpy
