"""Q4_0: blocks of 32 weights, one fp16 scale ``d``, 4-bit quants ``q`` with ``x = d*(q-8)``.

Byte ``j`` of ``qs`` holds element ``j`` in its low nibble and element ``j+16`` in its high one.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from llamacpy.gguf.constants import GGML_BLOCK_SIZES, GGMLType
from llamacpy.quants._block32 import (
    absmax_scaled,
    load_f16h,
    vcvtt,
    vint8_min,
    vstore_u8,
)
from llamacpy.quants._helpers import (
    F0,
    F1,
    F32,
    blocks_np,
    f2i_np,
    fp16_to_fp32_np,
    fp32_to_fp16_np,
    int8_np,
    run_dequantize,
    run_quantize,
    run_quantize_np,
    store_f16,
)
from llamacpy.quants._registry import QuantFormat, register
from llamacpy.quants._search import make_qx_quants
from llamacpy.quants._search_np import absmax_np, make_qx_quants_np, seqsum
from llamacpy.simd import (
    vand_k,
    vcvt,
    vload_u8,
    vsll,
    vsplat_f32,
    vsplat_i32,
    vsrl,
    vstore_f32,
)

TYPE = GGMLType.Q4_0
QK, TYPE_SIZE = GGML_BLOCK_SIZES[TYPE]
BLOCK = np.dtype([("d", "<f2"), ("qs", "u1", (QK // 2,))])
assert BLOCK.itemsize == TYPE_SIZE

_NEG8 = F32(-8.0)
_8_5 = F32(8.5)


@njit(cache=True, parallel=True, error_model="numpy")
def _dequantize_kernel(raw, y):
    n = y.size
    eight = vsplat_i32(8)
    for i in prange(n // QK):
        o = i * TYPE_SIZE
        d = vsplat_f32(load_f16h(raw, o))
        q = vload_u8(raw, o + 2)
        vstore_f32(y, i * QK, vcvt(vand_k(q, 0xF) - eight) * d)
        vstore_f32(y, i * QK + QK // 2, vcvt(vsrl(q, 4) - eight) * d)


def dequantize(raw, n: int, out: np.ndarray | None = None) -> np.ndarray:
    """The first ``n`` elements stored in ``raw`` (Q4_0 blocks) as float32 (numba), in
    ``out`` if given."""
    return run_dequantize(_dequantize_kernel, raw, n, QK, TYPE_SIZE, TYPE.name, out)


def dequantize_numpy(raw, n: int) -> np.ndarray:
    """Vectorized numpy twin of :func:`dequantize`."""
    b = blocks_np(raw, n, QK, BLOCK, TYPE.name)
    q = np.concatenate([b["qs"] & 0xF, b["qs"] >> 4], axis=1).astype(np.float32) - F32(8)
    return (q * fp16_to_fp32_np(b["d"])[:, None]).reshape(-1)


# ----------------------------------------------------------------------------- quantize


@njit(cache=True, parallel=True, error_model="numpy")
def _quantize_ref_kernel(x, out):
    """``quantize_row_q4_0_ref``, one block (two 16-lane halves) per step."""
    bias = vsplat_f32(_8_5)
    for i in prange(x.size // QK):
        o = i * TYPE_SIZE
        s0, s1 = absmax_scaled(x, i * QK, out, o, _NEG8)
        q0 = vint8_min(vcvtt(s0 + bias), 15)
        q1 = vint8_min(vcvtt(s1 + bias), 15)
        vstore_u8(out, o + 2, q0 | vsll(q1, 4))


@njit(cache=True, parallel=True, error_model="numpy")
def _quantize_impl_kernel(rows, qw, rows_per_qw, out):
    """``quantize_row_q4_0_impl``: weights ``qw * sqrt(sigma2 + x*x)``, ``make_qx_quants``."""
    nrows, n_per_row = rows.shape
    for r in prange(nrows):
        x = rows[r]
        w = qw[r // rows_per_qw]
        sum_x2 = F0
        for j in range(n_per_row):
            sum_x2 += x[j] * x[j]
        sigma2 = sum_x2 / F32(n_per_row)
        weight = np.empty(QK, dtype=np.float32)
        L = np.empty(QK, dtype=np.int8)
        for ib in range(n_per_row // QK):
            xb = x[ib * QK : (ib + 1) * QK]
            for j in range(QK):
                weight[j] = w[ib * QK + j] * np.sqrt(sigma2 + xb[j] * xb[j])
            d = make_qx_quants(QK, 8, xb, L, weight)
            o = ib * TYPE_SIZE
            store_f16(out[r], o, d)
            for j in range(QK // 2):
                out[r, o + 2 + j] = L[j] | (L[j + QK // 2] << 4)


def quantize(x, imatrix=None, out=None) -> np.ndarray:
    """Quantize rows (last axis) to Q4_0 bytes, as llama.cpp's ``quantize_q4_0`` (numba)."""
    return run_quantize(
        _quantize_ref_kernel, _quantize_impl_kernel, x, imatrix, QK, TYPE_SIZE, TYPE.name, out
    )


def _pack(d: np.ndarray, L: np.ndarray) -> np.ndarray:
    out = np.zeros(d.shape[0], dtype=BLOCK)
    out["d"] = fp32_to_fp16_np(d).view(np.float16)
    out["qs"] = L[:, : QK // 2] | (L[:, QK // 2 :] << 4)
    return out.view(np.uint8).reshape(-1, TYPE_SIZE)


def _ref_np(blocks: np.ndarray) -> np.ndarray:
    _, mx = absmax_np(blocks)
    d = mx / _NEG8
    with np.errstate(divide="ignore"):
        inv = np.where(d != F0, F1 / d, F0)
    with np.errstate(invalid="ignore"):
        L = np.minimum(15, int8_np(f2i_np(blocks * inv[:, None] + _8_5)))
    return _pack(d, L)


def _impl_np(rows: np.ndarray, qw: np.ndarray) -> np.ndarray:
    sigma2 = seqsum(rows * rows) / F32(rows.shape[1])
    weight = qw * np.sqrt(sigma2[:, None] + rows * rows)
    d, L = make_qx_quants_np(8, rows.reshape(-1, QK), weight.reshape(-1, QK))
    return _pack(d, L).reshape(rows.shape[0], -1)


def quantize_numpy(x, imatrix=None) -> np.ndarray:
    """Vectorized numpy twin of :func:`quantize`."""
    return run_quantize_np(_ref_np, _impl_np, x, imatrix, QK, TYPE_SIZE, TYPE.name)


FORMAT = register(
    QuantFormat(TYPE, BLOCK, dequantize, dequantize_numpy, quantize, quantize_numpy, GGMLType.Q8_0)
)
