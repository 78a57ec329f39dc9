"""Q8_1: Q8_0 plus ``s = d * sum(q)`` (fp16); blocks of 32 weights, ``x = d*q``.

An activation format: ggml's CPU backend converts the right-hand side of dot products with
Q4_1/Q5_1 weights to Q8_1. ggml has no ``dequantize_row_q8_1``; :func:`dequantize` returns
``d*q``.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from llamacpy.gguf.constants import GGML_BLOCK_SIZES, GGMLType
from llamacpy.quants._helpers import (
    F32,
    blocks_np,
    fp16_to_fp32_np,
    fp32_to_fp16_np,
    load_f16,
    run_dequantize,
    run_quantize,
    run_quantize_np,
    store_f16,
)
from llamacpy.quants._registry import QuantFormat, register
from llamacpy.quants.q8_0 import quantize_block, quantize_blocks_np

TYPE = GGMLType.Q8_1
QK, TYPE_SIZE = GGML_BLOCK_SIZES[TYPE]
BLOCK = np.dtype([("d", "<f2"), ("s", "<f2"), ("qs", "i1", (QK,))])
assert BLOCK.itemsize == TYPE_SIZE


@njit(cache=True, parallel=True, error_model="numpy")
def _dequantize_kernel(raw, y):
    n = y.size
    q = raw.view(np.int8)
    for i in prange(n // QK):
        o = i * TYPE_SIZE
        d = load_f16(raw, o)
        for j in range(QK):
            y[i * QK + j] = F32(q[o + 4 + j]) * d


def dequantize(raw, n: int, out: np.ndarray | None = None) -> np.ndarray:
    """The first ``n`` elements stored in ``raw`` (Q8_1 blocks) as float32 (numba), in
    ``out`` if given."""
    return run_dequantize(_dequantize_kernel, raw, n, QK, TYPE_SIZE, TYPE.name, out)


def dequantize_numpy(raw, n: int) -> np.ndarray:
    """Vectorized numpy twin of :func:`dequantize`."""
    b = blocks_np(raw, n, QK, BLOCK, TYPE.name)
    return (b["qs"].astype(np.float32) * fp16_to_fp32_np(b["d"])[:, None]).reshape(-1)


@njit(cache=True, parallel=True, error_model="numpy")
def _quantize_ref_kernel(x, out):
    """``quantize_row_q8_1_ref``: the Q8_0 block at byte 2 shifted by the ``s`` field."""
    for i in prange(x.size // QK):
        o = i * TYPE_SIZE
        tmp = np.empty(QK + 2, dtype=np.uint8)
        d, total = quantize_block(x[i * QK : (i + 1) * QK], tmp, 0)
        out[o] = tmp[0]
        out[o + 1] = tmp[1]
        store_f16(out, o + 2, F32(total) * d)
        for j in range(QK):
            out[o + 4 + j] = tmp[2 + j]


def quantize(x, imatrix=None, out=None) -> np.ndarray:
    """Quantize rows (last axis) to Q8_1 bytes, as ``quantize_row_q8_1_ref`` (numba);
    ``imatrix`` is ignored."""
    return run_quantize(_quantize_ref_kernel, None, x, None, QK, TYPE_SIZE, TYPE.name, out)


def _ref_np(blocks: np.ndarray) -> np.ndarray:
    d, qs = quantize_blocks_np(blocks)
    out = np.zeros(d.shape[0], dtype=BLOCK)
    out["d"] = fp32_to_fp16_np(d).view(np.float16)
    out["s"] = fp32_to_fp16_np(qs.astype(np.int64).sum(axis=1).astype(np.float32) * d).view(
        np.float16
    )
    out["qs"] = qs
    return out.view(np.uint8).reshape(-1, TYPE_SIZE)


def quantize_numpy(x, imatrix=None) -> np.ndarray:
    """Vectorized numpy twin of :func:`quantize`."""
    return run_quantize_np(_ref_np, None, x, None, QK, TYPE_SIZE, TYPE.name)


FORMAT = register(
    QuantFormat(TYPE, BLOCK, dequantize, dequantize_numpy, quantize, quantize_numpy, GGMLType.Q8_1)
)
