"""Q8_K: super-blocks of 256 int8 quants with a float32 scale and 16 group sums.

An activation format (the right-hand side of dot products with K-quant weights). Layout:
float32 ``d``, ``qs[256]`` int8, ``bsums[16]`` int16 (sum of each group of 16 quants).
Quantization is ``quantize_row_q8_K_ref``: ``d = max/-127`` of the signed absolute maximum.
For an all-zero super-block ggml writes ``d = 0`` and zero quants but leaves ``bsums`` as they
were; here they are zero.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from llamacpy.gguf.constants import GGML_BLOCK_SIZES, GGMLType
from llamacpy.quants._helpers import (
    F0,
    F1,
    F32,
    bits_f32,
    blocks_np,
    f32_bits,
    int8,
    int8_np,
    nearest_int,
    nearest_int_np,
    run_dequantize,
    run_quantize,
    run_quantize_np,
)
from llamacpy.quants._registry import QuantFormat, register
from llamacpy.quants._search_np import absmax_np

TYPE = GGMLType.Q8_K
QK, TYPE_SIZE = GGML_BLOCK_SIZES[TYPE]
BLOCK = np.dtype([("d", "<f4"), ("qs", "i1", (QK,)), ("bsums", "<i2", (QK // 16,))])
assert BLOCK.itemsize == TYPE_SIZE
_O_QS, _O_BS = 4, 4 + QK

_NEG127 = F32(-127.0)


@njit(cache=True, error_model="numpy")
def _load_f32(raw, o):
    return bits_f32(
        np.int64(raw[o])
        | (np.int64(raw[o + 1]) << 8)
        | (np.int64(raw[o + 2]) << 16)
        | (np.int64(raw[o + 3]) << 24)
    )


@njit(cache=True, parallel=True, error_model="numpy")
def _dequantize_kernel(raw, y):
    n = y.size
    q = raw.view(np.int8)
    for i in prange(n // QK):
        o = i * TYPE_SIZE
        d = _load_f32(raw, o)
        for j in range(QK):
            y[i * QK + j] = d * F32(q[o + _O_QS + j])


def dequantize(raw, n: int, out: np.ndarray | None = None) -> np.ndarray:
    """The first ``n`` elements stored in ``raw`` (Q8_K blocks) as float32 (numba), in
    ``out`` if given."""
    return run_dequantize(_dequantize_kernel, raw, n, QK, TYPE_SIZE, TYPE.name, out)


def dequantize_numpy(raw, n: int) -> np.ndarray:
    """Vectorized numpy twin of :func:`dequantize`."""
    b = blocks_np(raw, n, QK, BLOCK, TYPE.name)
    return (b["d"][:, None] * b["qs"].astype(np.float32)).reshape(-1)


@njit(cache=True, parallel=True, error_model="numpy")
def _quantize_ref_kernel(x, out):
    for i in prange(x.size // QK):
        xb = x[i * QK : (i + 1) * QK]
        o = i * TYPE_SIZE
        mx = F0
        amax = F0
        for j in range(QK):
            if abs(xb[j]) > amax:
                amax = abs(xb[j])
                mx = xb[j]
        for j in range(TYPE_SIZE):
            out[o + j] = 0
        if amax == F0:
            continue
        iscale = _NEG127 / mx
        for g in range(16):
            total = 0
            for k in range(16):
                v = int8(min(127, nearest_int(iscale * xb[16 * g + k])))
                out[o + _O_QS + 16 * g + k] = v & 0xFF
                total += v
            out[o + _O_BS + 2 * g] = total & 0xFF
            out[o + _O_BS + 2 * g + 1] = (total >> 8) & 0xFF
        bits = np.int64(f32_bits(F1 / iscale))
        for k in range(4):
            out[o + k] = (bits >> (8 * k)) & 0xFF


def quantize(x, imatrix=None, out=None) -> np.ndarray:
    """Quantize rows (last axis) to Q8_K bytes, as ``quantize_row_q8_K_ref`` (numba);
    ``imatrix`` is ignored."""
    return run_quantize(_quantize_ref_kernel, None, x, None, QK, TYPE_SIZE, TYPE.name, out)


def _ref_np(blocks: np.ndarray) -> np.ndarray:
    amax, mx = absmax_np(blocks)
    zero = amax == F0
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = _NEG127 / mx
        qs = int8_np(np.minimum(127, nearest_int_np(iscale[:, None] * blocks)))
        d = F1 / iscale
    qs = np.where(zero[:, None], 0, qs).astype(np.int8)
    out = np.zeros(blocks.shape[0], dtype=BLOCK)
    out["d"] = np.where(zero, F0, d)
    out["qs"] = qs
    out["bsums"] = qs.reshape(-1, 16, 16).astype(np.int64).sum(axis=2)
    return out.view(np.uint8).reshape(-1, TYPE_SIZE)


def quantize_numpy(x, imatrix=None) -> np.ndarray:
    """Vectorized numpy twin of :func:`quantize`."""
    return run_quantize_np(_ref_np, None, x, None, QK, TYPE_SIZE, TYPE.name)


FORMAT = register(
    QuantFormat(TYPE, BLOCK, dequantize, dequantize_numpy, quantize, quantize_numpy, None)
)
