"""Q4_K: super-blocks of 256 weights in 8 groups of 32, ``x = d*sc*q - dmin*m``.

Layout: fp16 ``d`` and ``dmin``, ``scales[12]`` (eight 6-bit scales ``sc`` and mins ``m``,
packed as ggml's ``get_scale_min_k4`` reads them), ``qs[128]`` (byte ``32c + l`` holds element
``64c + l`` in its low nibble and ``64c + 32 + l`` in its high one).

The scale searches here are shared with Q5_K (``nmax`` 31 instead of 15).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from llamacpy.gguf.constants import GGML_BLOCK_SIZES, GGMLType
from llamacpy.quants._block32 import load_f16h
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
from llamacpy.quants._lanes import LANES, make_qkx_quants_groups
from llamacpy.quants._registry import QuantFormat, register
from llamacpy.quants._search import (
    get_scale_min_k4,
    make_qp_quants,
    put_scale_min_k4,
)
from llamacpy.quants._search_np import make_qkx_quants_np, make_qp_quants_np, seqsum
from llamacpy.simd import vand_k, vcvt, vload_u8, vsplat_f32, vsrl, vstore_f32

TYPE = GGMLType.Q4_K
QK, TYPE_SIZE = GGML_BLOCK_SIZES[TYPE]
BLOCK = np.dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", (12,)), ("qs", "u1", (QK // 2,))])
assert BLOCK.itemsize == TYPE_SIZE
_O_SC, _O_QS = 4, 16

_63 = F32(63.0)


@njit(cache=True, inline="always")
def pair_scales_k4(raw, osc, c, d, dmin):
    """Splatted scale and min of sub-blocks ``2c`` and ``2c+1`` (the low and high nibbles of
    the same 32 quant bytes) from the 12 packed scale bytes at ``raw[osc:]``:
    ``(d*sc0, dmin*m0, d*sc1, dmin*m1)``."""
    sc0, m0 = get_scale_min_k4(2 * c, raw, osc)
    sc1, m1 = get_scale_min_k4(2 * c + 1, raw, osc)
    return (
        vsplat_f32(d * F32(sc0)),
        vsplat_f32(dmin * F32(m0)),
        vsplat_f32(d * F32(sc1)),
        vsplat_f32(dmin * F32(m1)),
    )


@njit(cache=True, parallel=True, error_model="numpy")
def _dequantize_kernel(raw, y):
    n = y.size
    for i in prange(n // QK):
        o = i * TYPE_SIZE
        d = load_f16h(raw, o)
        dmin = load_f16h(raw, o + 2)
        for c in range(4):  # groups 2c (low nibbles) and 2c+1 (high nibbles) share 32 bytes
            dl0, ml0, dl1, ml1 = pair_scales_k4(raw, o + _O_SC, c, d, dmin)
            for h in range(2):
                q = vload_u8(raw, o + _O_QS + 32 * c + 16 * h)
                e = i * QK + 64 * c + 16 * h
                vstore_f32(y, e, dl0 * vcvt(vand_k(q, 0xF)) - ml0)
                vstore_f32(y, e + 32, dl1 * vcvt(vsrl(q, 4)) - ml1)


def dequantize(raw, n: int, out: np.ndarray | None = None) -> np.ndarray:
    """The first ``n`` elements stored in ``raw`` (Q4_K blocks) as float32 (numba), in
    ``out`` if given."""
    return run_dequantize(_dequantize_kernel, raw, n, QK, TYPE_SIZE, TYPE.name, out)


def get_scale_min_np(sc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(scales, mins), each (nb, 8), from the (nb, 12) packed bytes."""
    sc = sc.astype(np.int64)
    lo = np.concatenate([sc[:, 0:4] & 63, (sc[:, 8:12] & 0xF) | ((sc[:, 0:4] >> 6) << 4)], 1)
    mn = np.concatenate([sc[:, 4:8] & 63, (sc[:, 8:12] >> 4) | ((sc[:, 4:8] >> 6) << 4)], 1)
    return lo, mn


def put_scale_min_np(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """Inverse of :func:`get_scale_min_np` (values in 0..63)."""
    out = np.zeros((ls.shape[0], 12), dtype=np.int64)
    out[:, 0:4] = ls[:, :4] | ((ls[:, 4:] >> 4) << 6)
    out[:, 4:8] = lm[:, :4] | ((lm[:, 4:] >> 4) << 6)
    out[:, 8:12] = (ls[:, 4:] & 0xF) | ((lm[:, 4:] & 0xF) << 4)
    return out.astype(np.uint8)


def dequantize_numpy(raw, n: int) -> np.ndarray:
    """Vectorized numpy twin of :func:`dequantize`."""
    b = blocks_np(raw, n, QK, BLOCK, TYPE.name)
    sc, m = get_scale_min_np(b["scales"])
    dl = fp16_to_fp32_np(b["d"])[:, None] * sc.astype(np.float32)
    ml = fp16_to_fp32_np(b["dmin"])[:, None] * m.astype(np.float32)
    qs = b["qs"].reshape(-1, 4, 1, 32)
    q = ((qs >> np.array([0, 4], dtype=np.uint8)[None, None, :, None]) & 0xF).reshape(-1, 8, 32)
    return (dl[:, :, None] * q.astype(np.float32) - ml[:, :, None]).reshape(-1)


# ----------------------------------------------------------------------------- shared with Q5_K


@njit(cache=True, error_model="numpy")
def scales_ref(x, i0, nb, L, out, type_size, nmax, rmin, rdelta, nstep):
    """The ``_ref`` scale search of Q4_K/Q5_K for the ``nb`` (1 or 2) super-blocks from
    block ``i0`` of ``x``, their 16 sub-blocks searched together: fills ``L`` (``nb * 256``
    quants) and writes each block's d, dmin and scales into ``out`` (blocks of
    ``type_size`` bytes)."""
    xb = x[i0 * QK : (i0 + nb) * QK]
    weights = np.empty(nb * QK, dtype=np.float32)
    res = np.empty(2 * LANES, dtype=np.float32)
    for g in range(8 * nb):
        sum_x2 = F0
        for k in range(32):
            sum_x2 += xb[32 * g + k] * xb[32 * g + k]
        av_x = np.sqrt(sum_x2 / F32(32))
        for k in range(32):
            weights[32 * g + k] = av_x + abs(xb[32 * g + k])
    make_qkx_quants_groups(
        8 * nb, 32, nmax, xb, weights, L, rmin, rdelta, nstep, False, res, res[LANES:]
    )
    for b in range(nb):
        o = (i0 + b) * type_size
        max_scale = F0
        max_min = F0
        for g in range(8):
            if res[8 * b + g] > max_scale:
                max_scale = res[8 * b + g]
            if res[LANES + 8 * b + g] > max_min:
                max_min = res[LANES + 8 * b + g]
        inv_scale = _63 / max_scale if max_scale > F0 else F0
        inv_min = _63 / max_min if max_min > F0 else F0
        for g in range(8):
            ls = min(63, nearest_int(inv_scale * res[8 * b + g]) & 0xFF)
            lm = min(63, nearest_int(inv_min * res[LANES + 8 * b + g]) & 0xFF)
            put_scale_min_k4(g, out, o + _O_SC, ls, lm)
        store_f16(out, o, max_scale / _63)
        store_f16(out, o + 2, max_min / _63)


@njit(cache=True, error_model="numpy")
def scales_impl(x, qw, L, out, o, nmax):
    """The ``_impl`` (importance-weighted) scale search of Q4_K/Q5_K."""
    weights = np.empty(QK, dtype=np.float32)
    scales = np.empty(8, dtype=np.float32)
    mins = np.empty(8, dtype=np.float32)
    sw = np.empty(8, dtype=np.float32)
    Ls = np.empty(8, dtype=np.uint8)
    Lm = np.empty(8, dtype=np.uint8)
    sum_x2 = F0
    for k in range(QK):
        sum_x2 += x[k] * x[k]
    sigma2 = F32(2.0) * sum_x2 / F32(QK)
    for g in range(8):
        sumw = F0
        for k in range(32 * g, 32 * g + 32):
            weights[k] = qw[k] * np.sqrt(sigma2 + x[k] * x[k])
            sumw += weights[k]
        sw[g] = sumw
    make_qkx_quants_groups(
        8, 32, nmax, x, weights, L, F32(-0.9), F32(0.05), 36, False, scales, mins
    )
    d_block = make_qp_quants(8, 63, scales, Ls, sw)
    m_block = make_qp_quants(8, 63, mins, Lm, sw)
    for g in range(8):
        put_scale_min_k4(g, out, o + _O_SC, min(63, Ls[g]), min(63, Lm[g]))
    store_f16(out, o, d_block)
    store_f16(out, o + 2, m_block)


@njit(cache=True, error_model="numpy")
def requantize(x, L, out, o, nmax):
    """Requantize ``L`` with the stored (fp16-rounded) scales and mins."""
    d_all = load_f16(out, o)
    m_all = load_f16(out, o + 2)
    for g in range(8):
        sc, m = get_scale_min_k4(g, out, o + _O_SC)
        d = d_all * F32(sc)
        if d == F0:
            continue
        dm = m_all * F32(m)
        for k in range(32):
            L[32 * g + k] = max(0, min(nmax, nearest_int((x[32 * g + k] + dm) / d)))


def scales_ref_np(x, nmax, rmin, rdelta, nstep):
    """numpy twin of :func:`scales_ref`: returns (L, packed scales, d, dmin)."""
    xg = x.reshape(-1, 32)
    av_x = np.sqrt(seqsum(xg * xg) / F32(32))
    weights = av_x[:, None] + np.abs(xg)
    scales, mins, L = make_qkx_quants_np(nmax, xg, weights, rmin, rdelta, nstep, False)
    scales, mins = scales.reshape(-1, 8), mins.reshape(-1, 8)
    max_scale = np.zeros(x.shape[0], dtype=np.float32)
    max_min = np.zeros(x.shape[0], dtype=np.float32)
    for g in range(8):
        max_scale = np.where(scales[:, g] > max_scale, scales[:, g], max_scale)
        max_min = np.where(mins[:, g] > max_min, mins[:, g], max_min)
    with np.errstate(divide="ignore"):
        inv_scale = np.where(max_scale > F0, _63 / max_scale, F0)
        inv_min = np.where(max_min > F0, _63 / max_min, F0)
    ls = np.minimum(63, nearest_int_np(inv_scale[:, None] * scales) & 0xFF)
    lm = np.minimum(63, nearest_int_np(inv_min[:, None] * mins) & 0xFF)
    return L.reshape(-1, QK), put_scale_min_np(ls, lm), max_scale / _63, max_min / _63


def scales_impl_np(x, qw, nmax):
    """numpy twin of :func:`scales_impl`: returns (L, packed scales, d, dmin)."""
    sigma2 = F32(2.0) * seqsum(x * x) / F32(QK)
    weights = (qw * np.sqrt(sigma2[:, None] + x * x)).reshape(-1, 32)
    xg = x.reshape(-1, 32)
    sw = seqsum(weights).reshape(-1, 8)
    scales, mins, L = make_qkx_quants_np(nmax, xg, weights, F32(-0.9), F32(0.05), 36, False)
    d_block, Ls = make_qp_quants_np(63, scales.reshape(-1, 8), sw)
    m_block, Lm = make_qp_quants_np(63, mins.reshape(-1, 8), sw)
    packed = put_scale_min_np(np.minimum(63, Ls), np.minimum(63, Lm))
    return L.reshape(-1, QK), packed, d_block, m_block


def requantize_np(x, L, packed, d, dmin, nmax):
    """numpy twin of :func:`requantize`: returns (L, d fp16 bits, dmin fp16 bits)."""
    d16, m16 = fp32_to_fp16_np(d), fp32_to_fp16_np(dmin)
    sc, m = get_scale_min_np(packed)
    dl = fp16_to_fp32_np(d16)[:, None] * sc.astype(np.float32)
    ml = fp16_to_fp32_np(m16)[:, None] * m.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        v = (x.reshape(-1, 8, 32) + ml[:, :, None]) / dl[:, :, None]
        requant = np.clip(nearest_int_np(v), 0, nmax)
    L = np.where((dl == F0)[:, :, None], L.reshape(-1, 8, 32), requant).reshape(-1, QK)
    return L, d16, m16


# ----------------------------------------------------------------------------- quantize


@njit(cache=True, error_model="numpy")
def _pack(L, out, o):
    for c in range(4):
        for k in range(32):
            out[o + _O_QS + 32 * c + k] = L[64 * c + k] | (L[64 * c + 32 + k] << 4)


@njit(cache=True, parallel=True, error_model="numpy")
def _quantize_ref_kernel(x, out):
    nblk = x.size // QK
    for p in prange((nblk + 1) // 2):
        nb = min(2, nblk - 2 * p)
        L = np.empty(2 * QK, dtype=np.uint8)
        scales_ref(x, 2 * p, nb, L, out, TYPE_SIZE, 15, F32(-1.0), F32(0.1), 20)
        for b in range(nb):
            i = 2 * p + b
            Lb = L[b * QK : (b + 1) * QK]
            requantize(x[i * QK : (i + 1) * QK], Lb, out, i * TYPE_SIZE, 15)
            _pack(Lb, out, i * TYPE_SIZE)


@njit(cache=True, parallel=True, error_model="numpy")
def _quantize_impl_kernel(rows, qw, rows_per_qw, out):
    nrows, n_per_row = rows.shape
    for r in prange(nrows):
        w = qw[r // rows_per_qw]
        L = np.empty(QK, dtype=np.uint8)
        for i in range(n_per_row // QK):
            s = slice(i * QK, (i + 1) * QK)
            scales_impl(rows[r, s], w[s], L, out[r], i * TYPE_SIZE, 15)
            requantize(rows[r, s], L, out[r], i * TYPE_SIZE, 15)
            _pack(L, out[r], i * TYPE_SIZE)


def quantize(x, imatrix=None, out=None) -> np.ndarray:
    """Quantize rows (last axis) to Q4_K bytes, as llama.cpp's ``quantize_q4_K`` (numba)."""
    return run_quantize(
        _quantize_ref_kernel, _quantize_impl_kernel, x, imatrix, QK, TYPE_SIZE, TYPE.name, out
    )


def _finish_np(x, L, packed, d, dmin) -> np.ndarray:
    L, d16, m16 = requantize_np(x, L, packed, d, dmin, 15)
    out = np.zeros(x.shape[0], dtype=BLOCK)
    out["d"], out["dmin"], out["scales"] = d16.view(np.float16), m16.view(np.float16), packed
    L = L.reshape(-1, 4, 2, 32)
    out["qs"] = (L[:, :, 0] | (L[:, :, 1] << 4)).reshape(-1, QK // 2)
    return out.view(np.uint8).reshape(-1, TYPE_SIZE)


def _ref_np(blocks: np.ndarray) -> np.ndarray:
    return _finish_np(blocks, *scales_ref_np(blocks, 15, F32(-1.0), F32(0.1), 20))


def _impl_np(rows: np.ndarray, qw: np.ndarray) -> np.ndarray:
    x = rows.reshape(-1, QK)
    out = _finish_np(x, *scales_impl_np(x, qw.reshape(-1, QK), 15))
    return out.reshape(rows.shape[0], -1)


def quantize_numpy(x, imatrix=None) -> np.ndarray:
    """Vectorized numpy twin of :func:`quantize`."""
    return run_quantize_np(_ref_np, _impl_np, x, imatrix, QK, TYPE_SIZE, TYPE.name)


FORMAT = register(
    QuantFormat(TYPE, BLOCK, dequantize, dequantize_numpy, quantize, quantize_numpy, GGMLType.Q8_K)
)
