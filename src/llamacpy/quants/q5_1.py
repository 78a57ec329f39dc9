"""Q5_1: blocks of 32 weights, fp16 scale ``d`` and min ``m``, 5-bit quants: ``x = d*q + m``.

Bits are laid out as in Q5_0 (``qh`` fifth bits, ``qs`` low nibbles).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from llamacpy.gguf.constants import GGML_BLOCK_SIZES, GGMLType
from llamacpy.quants._block32 import load_f16h, minmax_scaled, vcvtt, vqh_bits
from llamacpy.quants._helpers import (
    F0,
    F1,
    F32,
    blocks_np,
    f2i_np,
    fp16_to_fp32_np,
    fp32_to_fp16_np,
    run_dequantize,
    run_quantize,
    run_quantize_np,
    store_f16,
)
from llamacpy.quants._registry import QuantFormat, register
from llamacpy.quants._search import make_qkx_quants
from llamacpy.quants._search_np import make_qkx_quants_np, minmax_np, seqsum
from llamacpy.quants.q5_0 import load_qh, pack_5bit, pack_5bit_np, store_5bit, unpack_5bit_np
from llamacpy.simd import vand_k, vcvt, vload_u8, vsplat_f32, vsrl, vstore_f32

TYPE = GGMLType.Q5_1
QK, TYPE_SIZE = GGML_BLOCK_SIZES[TYPE]
BLOCK = np.dtype([("d", "<f2"), ("m", "<f2"), ("qh", "<u4"), ("qs", "u1", (QK // 2,))])
assert BLOCK.itemsize == TYPE_SIZE

_FLT_MAX = F32(np.finfo(np.float32).max)
_31 = F32(31.0)
_HALF = F32(0.5)
_RMIN = F32(-0.9)
_RDELTA = F32(0.05)


@njit(cache=True, parallel=True, error_model="numpy")
def _dequantize_kernel(raw, y):
    n = y.size
    for i in prange(n // QK):
        o = i * TYPE_SIZE
        d = vsplat_f32(load_f16h(raw, o))
        m = vsplat_f32(load_f16h(raw, o + 2))
        qh = load_qh(raw, o + 4)
        q = vload_u8(raw, o + 8)
        q0 = vand_k(q, 0xF) | vqh_bits(qh, 0)
        q1 = vsrl(q, 4) | vqh_bits(qh, QK // 2)
        vstore_f32(y, i * QK, vcvt(q0) * d + m)
        vstore_f32(y, i * QK + QK // 2, vcvt(q1) * d + m)


def dequantize(raw, n: int, out: np.ndarray | None = None) -> np.ndarray:
    """The first ``n`` elements stored in ``raw`` (Q5_1 blocks) as float32 (numba), in
    ``out`` if given."""
    return run_dequantize(_dequantize_kernel, raw, n, QK, TYPE_SIZE, TYPE.name, out)


def dequantize_numpy(raw, n: int) -> np.ndarray:
    """Vectorized numpy twin of :func:`dequantize`."""
    b = blocks_np(raw, n, QK, BLOCK, TYPE.name)
    q = unpack_5bit_np(b).astype(np.float32)
    d = fp16_to_fp32_np(b["d"])[:, None]
    return (q * d + fp16_to_fp32_np(b["m"])[:, None]).reshape(-1)


# ----------------------------------------------------------------------------- quantize


@njit(cache=True, parallel=True, error_model="numpy")
def _quantize_ref_kernel(x, out):
    """``quantize_row_q5_1_ref``, one block (two 16-lane halves) per step (note: no clamp to
    31, as in ggml)."""
    half = vsplat_f32(_HALF)
    for i in prange(x.size // QK):
        o = i * TYPE_SIZE
        s0, s1 = minmax_scaled(x, i * QK, out, o, _31)
        q0 = vcvtt(s0 + half)
        q1 = vcvtt(s1 + half)
        store_5bit(q0, q1, out, o + 4, o + 8)


@njit(cache=True, parallel=True, error_model="numpy")
def _quantize_impl_kernel(rows, qw, rows_per_qw, out):
    """``quantize_row_q5_1_impl``: weights ``qw * sqrt(sigma2 + x*x)``, ``make_qkx3_quants``."""
    nrows, n_per_row = rows.shape
    for r in prange(nrows):
        x = rows[r]
        w = qw[r // rows_per_qw]
        sum_x2 = F0
        for j in range(n_per_row):
            sum_x2 += x[j] * x[j]
        sigma2 = sum_x2 / F32(n_per_row)
        weight = np.empty(QK, dtype=np.float32)
        L = np.empty(QK, dtype=np.uint8)
        Laux = np.empty(QK, dtype=np.uint8)
        for ib in range(n_per_row // QK):
            xb = x[ib * QK : (ib + 1) * QK]
            for j in range(QK):
                weight[j] = w[ib * QK + j] * np.sqrt(sigma2 + xb[j] * xb[j])
            d, the_min = make_qkx_quants(QK, 31, xb, weight, L, Laux, _RMIN, _RDELTA, 36, False)
            o = ib * TYPE_SIZE
            store_f16(out[r], o, d)
            store_f16(out[r], o + 2, -the_min)
            pack_5bit(L, out[r], o + 4, o + 8)


def quantize(x, imatrix=None, out=None) -> np.ndarray:
    """Quantize rows (last axis) to Q5_1 bytes, as llama.cpp's ``quantize_q5_1`` (numba)."""
    return run_quantize(
        _quantize_ref_kernel, _quantize_impl_kernel, x, imatrix, QK, TYPE_SIZE, TYPE.name, out
    )


def _pack(d: np.ndarray, m: np.ndarray, L: np.ndarray) -> np.ndarray:
    out = np.zeros(d.shape[0], dtype=BLOCK)
    out["d"] = fp32_to_fp16_np(d).view(np.float16)
    out["m"] = fp32_to_fp16_np(m).view(np.float16)
    out["qh"], out["qs"] = pack_5bit_np(L)
    return out.view(np.uint8).reshape(-1, TYPE_SIZE)


def _ref_np(blocks: np.ndarray) -> np.ndarray:
    mn, mx = minmax_np(blocks)
    d = (mx - mn) / _31
    with np.errstate(divide="ignore"):
        inv = np.where(d != F0, F1 / d, F0)
    with np.errstate(invalid="ignore"):
        L = f2i_np((blocks - mn[:, None]) * inv[:, None] + _HALF) & 0xFF
    return _pack(d, mn, L)


def _impl_np(rows: np.ndarray, qw: np.ndarray) -> np.ndarray:
    sigma2 = seqsum(rows * rows) / F32(rows.shape[1])
    weight = qw * np.sqrt(sigma2[:, None] + rows * rows)
    xb, wb = rows.reshape(-1, QK), weight.reshape(-1, QK)
    d, the_min, L = make_qkx_quants_np(31, xb, wb, _RMIN, _RDELTA, 36, False)
    return _pack(d, -the_min, L).reshape(rows.shape[0], -1)


def quantize_numpy(x, imatrix=None) -> np.ndarray:
    """Vectorized numpy twin of :func:`quantize`."""
    return run_quantize_np(_ref_np, _impl_np, x, imatrix, QK, TYPE_SIZE, TYPE.name)


FORMAT = register(
    QuantFormat(TYPE, BLOCK, dequantize, dequantize_numpy, quantize, quantize_numpy, GGMLType.Q8_1)
)
