"""Q8_0: blocks of 32 weights, fp16 scale ``d``, int8 quants: ``x = d*q``.

llama.cpp ignores importance weights for Q8_0, and so does :func:`quantize`.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from llamacpy.gguf.constants import GGML_BLOCK_SIZES, GGMLType
from llamacpy.quants._block32 import load_f16h
from llamacpy.quants._helpers import (
    F0,
    F1,
    F32,
    blocks_np,
    f2i,
    f2i_np,
    fp16_to_fp32_np,
    fp32_to_fp16_np,
    int8,
    int8_np,
    roundf,
    roundf_np,
    run_dequantize,
    run_quantize,
    run_quantize_np,
    store_f16,
)
from llamacpy.quants._registry import QuantFormat, register
from llamacpy.simd import vcvt, vload_i8, vsplat_f32, vstore_f32

TYPE = GGMLType.Q8_0
QK, TYPE_SIZE = GGML_BLOCK_SIZES[TYPE]
BLOCK = np.dtype([("d", "<f2"), ("qs", "i1", (QK,))])
assert BLOCK.itemsize == TYPE_SIZE

_127 = F32(127.0)


@njit(cache=True, parallel=True, error_model="numpy")
def _dequantize_kernel(raw, y):
    n = y.size
    for i in prange(n // QK):
        o = i * TYPE_SIZE
        d = vsplat_f32(load_f16h(raw, o))
        vstore_f32(y, i * QK, vcvt(vload_i8(raw, o + 2)) * d)
        vstore_f32(y, i * QK + 16, vcvt(vload_i8(raw, o + 18)) * d)


def dequantize(raw, n: int, out: np.ndarray | None = None) -> np.ndarray:
    """The first ``n`` elements stored in ``raw`` (Q8_0 blocks) as float32 (numba), in
    ``out`` if given."""
    return run_dequantize(_dequantize_kernel, raw, n, QK, TYPE_SIZE, TYPE.name, out)


def dequantize_numpy(raw, n: int) -> np.ndarray:
    """Vectorized numpy twin of :func:`dequantize`."""
    b = blocks_np(raw, n, QK, BLOCK, TYPE.name)
    return (b["qs"].astype(np.float32) * fp16_to_fp32_np(b["d"])[:, None]).reshape(-1)


@njit(cache=True, error_model="numpy")
def quantize_block(x, out, o):
    """``quantize_row_q8_0_ref`` for one block; returns (d, sum of the quants)."""
    amax = F0
    for j in range(QK):
        a = abs(x[j])
        amax = amax if amax > a else a
    d = amax / _127
    inv = F1 / d if d != F0 else F0
    store_f16(out, o, d)
    total = 0
    for j in range(QK):
        q = int8(f2i(roundf(x[j] * inv)))
        out[o + 2 + j] = q & 0xFF
        total += q
    return d, total


@njit(cache=True, parallel=True, error_model="numpy")
def _quantize_ref_kernel(x, out):
    for i in prange(x.size // QK):
        quantize_block(x[i * QK : (i + 1) * QK], out, i * TYPE_SIZE)


def quantize(x, imatrix=None, out=None) -> np.ndarray:
    """Quantize rows (last axis) to Q8_0 bytes, as llama.cpp's ``quantize_q8_0`` (numba);
    ``imatrix`` is accepted and ignored, as in llama.cpp."""
    return run_quantize(_quantize_ref_kernel, None, x, None, QK, TYPE_SIZE, TYPE.name, out)


def quantize_blocks_np(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(d, int8 quants) of (nb, 32) float32 blocks, as ``quantize_row_q8_0_ref``."""
    d = np.abs(blocks).max(axis=1) / _127
    with np.errstate(divide="ignore"):
        inv = np.where(d != F0, F1 / d, F0)
    with np.errstate(invalid="ignore"):
        return d, int8_np(f2i_np(roundf_np(blocks * inv[:, None]))).astype(np.int8)


def _ref_np(blocks: np.ndarray) -> np.ndarray:
    d, qs = quantize_blocks_np(blocks)
    out = np.zeros(d.shape[0], dtype=BLOCK)
    out["d"] = fp32_to_fp16_np(d).view(np.float16)
    out["qs"] = qs
    return out.view(np.uint8).reshape(-1, TYPE_SIZE)


def quantize_numpy(x, imatrix=None) -> np.ndarray:
    """Vectorized numpy twin of :func:`quantize`."""
    return run_quantize_np(_ref_np, None, x, None, QK, TYPE_SIZE, TYPE.name)


FORMAT = register(
    QuantFormat(TYPE, BLOCK, dequantize, dequantize_numpy, quantize, quantize_numpy, GGMLType.Q8_0)
)
