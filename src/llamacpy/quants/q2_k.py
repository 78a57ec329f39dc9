"""Q2_K: super-blocks of 256 weights in 16 groups of 16, ``x = d*sc*q - dmin*m``.

Layout: ``scales[16]`` (low nibble: 4-bit scale ``sc``, high nibble: 4-bit min ``m`` of each
group), ``qs[64]`` (2-bit quants; byte ``32*h + l`` holds elements ``128*h + l + 32*k`` in bits
``2k``), then fp16 ``d`` and ``dmin``.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from llamacpy.gguf.constants import GGML_BLOCK_SIZES, GGMLType
from llamacpy.quants._helpers import (
    F0,
    F32,
    blocks_np,
    fp16_to_fp32_np,
    fp32_to_fp16_np,
    load_f16,
    nearest_int,
    nearest_int_np,
    run_dequantize,
    run_quantize,
    run_quantize_np,
    store_f16,
)
from llamacpy.quants._lanes import make_qkx_quants_groups
from llamacpy.quants._registry import QuantFormat, register
from llamacpy.quants._search import make_qp_quants
from llamacpy.quants._search_np import make_qkx_quants_np, make_qp_quants_np, seqsum

TYPE = GGMLType.Q2_K
QK, TYPE_SIZE = GGML_BLOCK_SIZES[TYPE]
BLOCK = np.dtype(
    [("scales", "u1", (QK // 16,)), ("qs", "u1", (QK // 4,)), ("d", "<f2"), ("dmin", "<f2")]
)
assert BLOCK.itemsize == TYPE_SIZE
_O_QS, _O_D = 16, 80

_15 = F32(15.0)


@njit(cache=True, parallel=True, error_model="numpy")
def _dequantize_kernel(raw, y):
    n = y.size
    for i in prange(n // QK):
        o = i * TYPE_SIZE
        d = load_f16(raw, o + _O_D)
        dmin = load_f16(raw, o + _O_D + 2)
        for h in range(2):
            for k in range(4):
                for half in range(2):
                    g = 8 * h + 2 * k + half  # group of 16: scale byte
                    sc = np.int64(raw[o + g])
                    dl = d * F32(sc & 0xF)
                    ml = dmin * F32(sc >> 4)
                    for l in range(16):
                        q = (np.int64(raw[o + _O_QS + 32 * h + 16 * half + l]) >> (2 * k)) & 3
                        y[i * QK + 16 * g + l] = dl * F32(q) - ml


def dequantize(raw, n: int, out: np.ndarray | None = None) -> np.ndarray:
    """The first ``n`` elements stored in ``raw`` (Q2_K blocks) as float32 (numba), in
    ``out`` if given."""
    return run_dequantize(_dequantize_kernel, raw, n, QK, TYPE_SIZE, TYPE.name, out)


def unpack_2bit_np(qs: np.ndarray) -> np.ndarray:
    """(nb, 256) 2-bit values from (nb, 64) packed bytes (layout of Q2_K/Q3_K ``qs``)."""
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    return ((qs.reshape(-1, 2, 1, 32) >> shifts) & 3).reshape(-1, QK)


def pack_2bit_np(L: np.ndarray) -> np.ndarray:
    """Inverse of :func:`unpack_2bit_np`."""
    L = L.reshape(-1, 2, 4, 32).astype(np.uint8)
    return (L[:, :, 0] | (L[:, :, 1] << 2) | (L[:, :, 2] << 4) | (L[:, :, 3] << 6)).reshape(-1, 64)


def dequantize_numpy(raw, n: int) -> np.ndarray:
    """Vectorized numpy twin of :func:`dequantize`."""
    b = blocks_np(raw, n, QK, BLOCK, TYPE.name)
    dl = fp16_to_fp32_np(b["d"])[:, None] * (b["scales"] & 0xF).astype(np.float32)
    ml = fp16_to_fp32_np(b["dmin"])[:, None] * (b["scales"] >> 4).astype(np.float32)
    q = unpack_2bit_np(b["qs"]).astype(np.float32).reshape(-1, 16, 16)
    return (dl[:, :, None] * q - ml[:, :, None]).reshape(-1)


# ----------------------------------------------------------------------------- quantize


@njit(cache=True, error_model="numpy")
def pack_2bit(L, out, o):
    """Store 256 two-bit values ``L`` at ``out[o:o+64]`` (Q2_K/Q3_K ``qs`` layout)."""
    for j in range(0, QK, 128):
        for k in range(32):
            out[o + j // 4 + k] = (
                L[j + k] | (L[j + k + 32] << 2) | (L[j + k + 64] << 4) | (L[j + k + 96] << 6)
            )


@njit(cache=True, error_model="numpy")
def _finish(x, L, out, o):
    """Requantize with the stored (rounded) scales and pack, as both ggml paths end."""
    d_all = load_f16(out, o + _O_D)
    m_all = load_f16(out, o + _O_D + 2)
    for g in range(16):
        d = d_all * F32(out[o + g] & 0xF)
        if d == F0:
            continue
        dm = m_all * F32(out[o + g] >> 4)
        for k in range(16):
            L[16 * g + k] = max(0, min(3, nearest_int((x[16 * g + k] + dm) / d)))
    pack_2bit(L, out, o + _O_QS)


@njit(cache=True, error_model="numpy")
def _ref_block(x, out, o):
    """``quantize_row_q2_K_ref`` for one super-block."""
    L = np.empty(QK, dtype=np.uint8)
    weights = np.empty(QK, dtype=np.float32)
    scales = np.empty(16, dtype=np.float32)
    mins = np.empty(16, dtype=np.float32)
    for k in range(QK):
        weights[k] = abs(x[k])
    make_qkx_quants_groups(16, 16, 3, x, weights, L, F32(-0.5), F32(0.1), 15, True, scales, mins)
    max_scale = F0
    max_min = F0
    for g in range(16):
        if scales[g] > max_scale:
            max_scale = scales[g]
        if mins[g] > max_min:
            max_min = mins[g]
    if max_scale > F0:
        iscale = _15 / max_scale
        for g in range(16):
            out[o + g] = nearest_int(iscale * scales[g]) & 0xFF
        store_f16(out, o + _O_D, max_scale / _15)
    else:
        for g in range(16):
            out[o + g] = 0
        store_f16(out, o + _O_D, F0)
    if max_min > F0:
        iscale = _15 / max_min
        for g in range(16):
            out[o + g] = (np.int64(out[o + g]) | (nearest_int(iscale * mins[g]) << 4)) & 0xFF
        store_f16(out, o + _O_D + 2, max_min / _15)
    else:
        store_f16(out, o + _O_D + 2, F0)
    _finish(x, L, out, o)


@njit(cache=True, parallel=True, error_model="numpy")
def _quantize_ref_kernel(x, out):
    for i in prange(x.size // QK):
        _ref_block(x[i * QK : (i + 1) * QK], out, i * TYPE_SIZE)


@njit(cache=True, error_model="numpy")
def _impl_block(x, qw, out, o):
    """``quantize_row_q2_K_impl`` for one super-block."""
    L = np.empty(QK, dtype=np.uint8)
    weight = np.empty(QK, dtype=np.float32)
    scales = np.empty(16, dtype=np.float32)
    mins = np.empty(16, dtype=np.float32)
    sw = np.zeros(16, dtype=np.float32)
    Ls = np.empty(16, dtype=np.uint8)
    Lm = np.empty(16, dtype=np.uint8)
    sumx2 = F0
    for j in range(QK):
        sumx2 += x[j] * x[j]
    sigma2 = sumx2 / F32(QK)
    for g in range(16):
        for k in range(16 * g, 16 * g + 16):
            weight[k] = qw[k] * np.sqrt(sigma2 + x[k] * x[k])
        for k in range(16 * g, 16 * g + 16):
            sw[g] += weight[k]
    make_qkx_quants_groups(16, 16, 3, x, weight, L, F32(-0.9), F32(0.05), 36, False, scales, mins)
    dm = make_qp_quants(16, 15, scales, Ls, sw)
    mm = make_qp_quants(16, 15, mins, Lm, sw)
    store_f16(out, o + _O_D, dm)
    store_f16(out, o + _O_D + 2, mm)
    for g in range(16):
        out[o + g] = Ls[g] | (Lm[g] << 4)
    _finish(x, L, out, o)


@njit(cache=True, parallel=True, error_model="numpy")
def _quantize_impl_kernel(rows, qw, rows_per_qw, out):
    nrows, n_per_row = rows.shape
    for r in prange(nrows):
        w = qw[r // rows_per_qw]
        for i in range(n_per_row // QK):
            s = slice(i * QK, (i + 1) * QK)
            _impl_block(rows[r, s], w[s], out[r], i * TYPE_SIZE)


def quantize(x, imatrix=None, out=None) -> np.ndarray:
    """Quantize rows (last axis) to Q2_K bytes, as llama.cpp's ``quantize_q2_K`` (numba)."""
    return run_quantize(
        _quantize_ref_kernel, _quantize_impl_kernel, x, imatrix, QK, TYPE_SIZE, TYPE.name, out
    )


def _finish_np(x: np.ndarray, L: np.ndarray, sc: np.ndarray, d: np.ndarray, dmin: np.ndarray):
    out = np.zeros(x.shape[0], dtype=BLOCK)
    out["scales"] = sc
    out["d"] = fp32_to_fp16_np(d).view(np.float16)
    out["dmin"] = fp32_to_fp16_np(dmin).view(np.float16)
    dl = fp16_to_fp32_np(out["d"])[:, None] * (sc & 0xF).astype(np.float32)
    ml = fp16_to_fp32_np(out["dmin"])[:, None] * (sc >> 4).astype(np.float32)
    xg = x.reshape(-1, 16, 16)
    with np.errstate(divide="ignore", invalid="ignore"):
        requant = np.clip(nearest_int_np((xg + ml[:, :, None]) / dl[:, :, None]), 0, 3)
    L = np.where((dl == F0)[:, :, None], L.reshape(-1, 16, 16), requant)
    out["qs"] = pack_2bit_np(L)
    return out.view(np.uint8).reshape(-1, TYPE_SIZE)


def _running_max(v: np.ndarray) -> np.ndarray:
    m = np.zeros(v.shape[0], dtype=np.float32)
    for g in range(v.shape[1]):
        m = np.where(v[:, g] > m, v[:, g], m)
    return m


def _ref_np(blocks: np.ndarray) -> np.ndarray:
    xg = blocks.reshape(-1, 16)
    scales, mins, L = make_qkx_quants_np(3, xg, np.abs(xg), F32(-0.5), F32(0.1), 15, True)
    scales, mins = scales.reshape(-1, 16), mins.reshape(-1, 16)
    max_scale, max_min = _running_max(scales), _running_max(mins)
    with np.errstate(divide="ignore", invalid="ignore"):
        ls = nearest_int_np((_15 / max_scale)[:, None] * scales) & 0xFF
        lm = nearest_int_np((_15 / max_min)[:, None] * mins) << 4
    sc = np.where((max_scale > F0)[:, None], ls, 0)
    sc = np.where((max_min > F0)[:, None], sc | lm, sc) & 0xFF
    d = np.where(max_scale > F0, max_scale / _15, F0)
    dmin = np.where(max_min > F0, max_min / _15, F0)
    return _finish_np(blocks, L, sc.astype(np.uint8), d, dmin)


def _impl_np(rows: np.ndarray, qw: np.ndarray) -> np.ndarray:
    x = rows.reshape(-1, QK)
    sigma2 = seqsum(x * x) / F32(QK)
    weight = qw.reshape(-1, QK) * np.sqrt(sigma2[:, None] + x * x)
    xg, wg = x.reshape(-1, 16), weight.reshape(-1, 16)
    sw = seqsum(wg).reshape(-1, 16)
    scales, mins, L = make_qkx_quants_np(3, xg, wg, F32(-0.9), F32(0.05), 36, False)
    dm, Ls = make_qp_quants_np(15, scales.reshape(-1, 16), sw)
    mm, Lm = make_qp_quants_np(15, mins.reshape(-1, 16), sw)
    sc = ((Ls | (Lm << 4)) & 0xFF).astype(np.uint8)
    return _finish_np(x, L, sc, dm, mm).reshape(rows.shape[0], -1)


def quantize_numpy(x, imatrix=None) -> np.ndarray:
    """Vectorized numpy twin of :func:`quantize`."""
    return run_quantize_np(_ref_np, _impl_np, x, imatrix, QK, TYPE_SIZE, TYPE.name)


FORMAT = register(
    QuantFormat(TYPE, BLOCK, dequantize, dequantize_numpy, quantize, quantize_numpy, GGMLType.Q8_K)
)
