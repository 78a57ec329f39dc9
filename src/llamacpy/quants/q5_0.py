"""Q5_0: blocks of 32 weights, fp16 scale ``d``, 5-bit quants ``q`` with ``x = d*(q-16)``.

``qs`` holds the low 4 bits as in Q4_0; bit ``j`` of the little-endian uint32 ``qh`` is the
fifth bit of element ``j``.
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
    vnz_bits,
    vqh_bits,
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
    store_u32,
    vand_k,
    vcvt,
    vload_u8,
    vsll,
    vsplat_f32,
    vsplat_i32,
    vsrl,
    vstore_f32,
)

TYPE = GGMLType.Q5_0
QK, TYPE_SIZE = GGML_BLOCK_SIZES[TYPE]
BLOCK = np.dtype([("d", "<f2"), ("qh", "<u4"), ("qs", "u1", (QK // 2,))])
assert BLOCK.itemsize == TYPE_SIZE

_NEG16 = F32(-16.0)
_16_5 = F32(16.5)


@njit(cache=True, error_model="numpy")
def load_qh(raw, o):
    """The little-endian uint32 at byte ``o``."""
    return (
        np.int64(raw[o])
        | (np.int64(raw[o + 1]) << 8)
        | (np.int64(raw[o + 2]) << 16)
        | (np.int64(raw[o + 3]) << 24)
    )


@njit(cache=True, error_model="numpy")
def pack_5bit(L, out, o_qh, o_qs):
    """Store 32 five-bit values ``L``: low nibbles at ``out[o_qs:]``, fifth bits in ``qh``."""
    qh = 0
    for j in range(QK // 2):
        q0 = np.int64(L[j])
        q1 = np.int64(L[j + QK // 2])
        out[o_qs + j] = (q0 & 0x0F) | ((q1 & 0x0F) << 4)
        qh |= ((q0 & 0x10) >> 4) << j
        qh |= ((q1 & 0x10) >> 4) << (j + QK // 2)
    for k in range(4):
        out[o_qh + k] = (qh >> (8 * k)) & 0xFF


def unpack_5bit_np(b: np.ndarray) -> np.ndarray:
    """(nb, 32) five-bit values from structured blocks with ``qh`` and ``qs`` fields."""
    low = np.concatenate([b["qs"] & 0xF, b["qs"] >> 4], axis=1).astype(np.int64)
    high = (b["qh"][:, None].astype(np.int64) >> np.arange(QK)) & 1
    return low | (high << 4)


def pack_5bit_np(L: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(qh, qs) fields for (nb, 32) five-bit values."""
    qs = (L[:, : QK // 2] & 0xF) | ((L[:, QK // 2 :] & 0xF) << 4)
    qh = (((L >> 4) & 1) << np.arange(QK)).sum(axis=1)
    return qh.astype(np.uint32), qs.astype(np.uint8)


@njit(cache=True, parallel=True, error_model="numpy")
def _dequantize_kernel(raw, y):
    n = y.size
    sixteen = vsplat_i32(16)
    for i in prange(n // QK):
        o = i * TYPE_SIZE
        d = vsplat_f32(load_f16h(raw, o))
        qh = load_qh(raw, o + 2)
        q = vload_u8(raw, o + 6)
        q0 = (vand_k(q, 0xF) | vqh_bits(qh, 0)) - sixteen
        q1 = (vsrl(q, 4) | vqh_bits(qh, QK // 2)) - sixteen
        vstore_f32(y, i * QK, vcvt(q0) * d)
        vstore_f32(y, i * QK + QK // 2, vcvt(q1) * d)


def dequantize(raw, n: int, out: np.ndarray | None = None) -> np.ndarray:
    """The first ``n`` elements stored in ``raw`` (Q5_0 blocks) as float32 (numba), in
    ``out`` if given."""
    return run_dequantize(_dequantize_kernel, raw, n, QK, TYPE_SIZE, TYPE.name, out)


def dequantize_numpy(raw, n: int) -> np.ndarray:
    """Vectorized numpy twin of :func:`dequantize`."""
    b = blocks_np(raw, n, QK, BLOCK, TYPE.name)
    q = (unpack_5bit_np(b) - 16).astype(np.float32)
    return (q * fp16_to_fp32_np(b["d"])[:, None]).reshape(-1)


# ----------------------------------------------------------------------------- quantize


@njit(cache=True, error_model="numpy")
def store_5bit(q0, q1, out, o_qh, o_qs):
    """Store 5-bit quants given as two ``i32x16`` halves (only the low 5 bits are used):
    low nibbles at ``out[o_qs:]``, fifth bits in the little-endian ``qh`` at ``o_qh``."""
    vstore_u8(out, o_qs, vand_k(q0, 0xF) | vsll(vand_k(q1, 0xF), 4))
    store_u32(out, o_qh, vnz_bits(vand_k(q0, 0x10)) | (vnz_bits(vand_k(q1, 0x10)) << 16))


@njit(cache=True, parallel=True, error_model="numpy")
def _quantize_ref_kernel(x, out):
    """``quantize_row_q5_0_ref``, one block (two 16-lane halves) per step."""
    bias = vsplat_f32(_16_5)
    for i in prange(x.size // QK):
        o = i * TYPE_SIZE
        s0, s1 = absmax_scaled(x, i * QK, out, o, _NEG16)
        q0 = vint8_min(vcvtt(s0 + bias), 31)
        q1 = vint8_min(vcvtt(s1 + bias), 31)
        store_5bit(q0, q1, out, o + 2, o + 6)


@njit(cache=True, parallel=True, error_model="numpy")
def _quantize_impl_kernel(rows, qw, rows_per_qw, out):
    """``quantize_row_q5_0_impl``: weights ``qw * sqrt(sigma2 + x*x)``, ``make_qx_quants``."""
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
            d = make_qx_quants(QK, 16, xb, L, weight)
            o = ib * TYPE_SIZE
            store_f16(out[r], o, d)
            pack_5bit(L, out[r], o + 2, o + 6)


def quantize(x, imatrix=None, out=None) -> np.ndarray:
    """Quantize rows (last axis) to Q5_0 bytes, as llama.cpp's ``quantize_q5_0`` (numba)."""
    return run_quantize(
        _quantize_ref_kernel, _quantize_impl_kernel, x, imatrix, QK, TYPE_SIZE, TYPE.name, out
    )


def _pack(d: np.ndarray, L: np.ndarray) -> np.ndarray:
    out = np.zeros(d.shape[0], dtype=BLOCK)
    out["d"] = fp32_to_fp16_np(d).view(np.float16)
    out["qh"], out["qs"] = pack_5bit_np(L)
    return out.view(np.uint8).reshape(-1, TYPE_SIZE)


def _ref_np(blocks: np.ndarray) -> np.ndarray:
    _, mx = absmax_np(blocks)
    d = mx / _NEG16
    with np.errstate(divide="ignore"):
        inv = np.where(d != F0, F1 / d, F0)
    with np.errstate(invalid="ignore"):
        L = np.minimum(31, int8_np(f2i_np(blocks * inv[:, None] + _16_5)))
    return _pack(d, L)


def _impl_np(rows: np.ndarray, qw: np.ndarray) -> np.ndarray:
    sigma2 = seqsum(rows * rows) / F32(rows.shape[1])
    weight = qw * np.sqrt(sigma2[:, None] + rows * rows)
    d, L = make_qx_quants_np(16, rows.reshape(-1, QK), weight.reshape(-1, QK))
    return _pack(d, L).reshape(rows.shape[0], -1)


def quantize_numpy(x, imatrix=None) -> np.ndarray:
    """Vectorized numpy twin of :func:`quantize`."""
    return run_quantize_np(_ref_np, _impl_np, x, imatrix, QK, TYPE_SIZE, TYPE.name)


FORMAT = register(
    QuantFormat(TYPE, BLOCK, dequantize, dequantize_numpy, quantize, quantize_numpy, GGMLType.Q8_0)
)
