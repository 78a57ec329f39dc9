"""Q1_0: blocks of 128 weights, one f16 scale ``d`` and one sign bit per weight:
``x = d`` where the bit is set, ``-d`` where it is clear. Bit ``j % 8`` of byte ``j // 8``
holds element ``j``.

:func:`quantize` is ggml's ``quantize_row_q1_0_ref`` (``quantize_q1_0`` runs it row by row
when given an importance matrix, which it does not use): ``d`` = the mean of ``|x|`` over the
block, summed in element order; the bit is ``x >= 0`` (set for ``-0.0``, clear for NaN).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from llamacpy.gguf.constants import GGML_BLOCK_SIZES, GGMLType
from llamacpy.quants._block32 import load_f16h, store_f16h
from llamacpy.quants._helpers import (
    F0,
    F32,
    blocks_np,
    fp16_to_fp32_np,
    fp32_to_fp16_np,
    run_dequantize,
    run_quantize,
    run_quantize_np,
)
from llamacpy.quants._registry import QuantFormat, register

TYPE = GGMLType.Q1_0
QK, TYPE_SIZE = GGML_BLOCK_SIZES[TYPE]
BLOCK = np.dtype([("d", "<f2"), ("qs", "u1", (QK // 8,))])
assert BLOCK.itemsize == TYPE_SIZE
_QK_F = F32(QK)


@njit(cache=True, parallel=True, error_model="numpy")
def _dequantize_kernel(raw, y):
    for i in prange(y.size // QK):
        o = i * TYPE_SIZE
        d = load_f16h(raw, o)
        nd = -d
        for k in range(QK // 8):
            bits = raw[o + 2 + k]
            for j in range(8):
                y[i * QK + 8 * k + j] = d if (bits >> j) & 1 else nd


def dequantize(raw, n: int, out: np.ndarray | None = None) -> np.ndarray:
    """The first ``n`` elements stored in ``raw`` (Q1_0 blocks) as float32 (numba), in
    ``out`` if given."""
    return run_dequantize(_dequantize_kernel, raw, n, QK, TYPE_SIZE, TYPE.name, out)


def dequantize_numpy(raw, n: int) -> np.ndarray:
    """Vectorized numpy twin of :func:`dequantize`."""
    b = blocks_np(raw, n, QK, BLOCK, TYPE.name)
    bits = np.unpackbits(b["qs"], axis=1, bitorder="little").astype(bool)
    d = fp16_to_fp32_np(b["d"])[:, None]
    return np.where(bits, d, -d).reshape(-1)


# ----------------------------------------------------------------------------- quantize


@njit(cache=True, parallel=True, error_model="numpy")
def _quantize_ref_kernel(x, out):
    """``quantize_row_q1_0_ref``, one block per step."""
    for i in prange(x.size // QK):
        o, ob = i * QK, i * TYPE_SIZE
        s = F0
        for j in range(QK):
            s += abs(x[o + j])
        store_f16h(out, ob, s / _QK_F)
        for k in range(QK // 8):
            q = 0
            for j in range(8):
                if x[o + 8 * k + j] >= F0:
                    q |= 1 << j
            out[ob + 2 + k] = q


def quantize(x, imatrix=None, out=None) -> np.ndarray:
    """Quantize rows (last axis) to Q1_0 bytes, as llama.cpp's ``quantize_q1_0`` (numba;
    an importance matrix is accepted and, as in ggml, not used)."""
    return run_quantize(_quantize_ref_kernel, None, x, None, QK, TYPE_SIZE, TYPE.name, out)


def _ref_np(blocks: np.ndarray) -> np.ndarray:
    a = np.abs(blocks)
    s = np.zeros(len(blocks), np.float32)
    for j in range(QK):  # C's order: one element after the other
        s = s + a[:, j]
    out = np.zeros(len(blocks), dtype=BLOCK)
    out["d"] = fp32_to_fp16_np(s / _QK_F).view(np.float16)
    out["qs"] = np.packbits(blocks >= F0, axis=1, bitorder="little")
    return out.view(np.uint8).reshape(-1, TYPE_SIZE)


def quantize_numpy(x, imatrix=None) -> np.ndarray:
    """Vectorized numpy twin of :func:`quantize`."""
    return run_quantize_np(_ref_np, None, x, None, QK, TYPE_SIZE, TYPE.name)


FORMAT = register(
    QuantFormat(TYPE, BLOCK, dequantize, dequantize_numpy, quantize, quantize_numpy, GGMLType.Q8_0)
)
