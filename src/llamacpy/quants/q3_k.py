"""Q3_K: super-blocks of 256 weights in 16 groups of 16, ``x = d*(sc-32)*(q-4)``.

Layout: ``hmask[32]`` (bit ``k`` of byte ``l``: high bit of element ``32k + l``), ``qs[64]``
(low 2 bits, Q2_K layout), ``scales[12]`` (16 six-bit scales: low nibbles in bytes 0-7, high
2-bit pairs in bytes 8-11), fp16 ``d``. A set high bit means ``q >= 4``.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from llamacpy.gguf.constants import GGML_BLOCK_SIZES, GGMLType
from llamacpy.quants._block32 import vstore_u8
from llamacpy.quants._helpers import (
    F0,
    F1,
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
from llamacpy.quants._lanes import LANES, make_q3_quants_x16, make_qx_quants_x16, vnearest
from llamacpy.quants._registry import QuantFormat, register
from llamacpy.quants._search import make_qx_quants
from llamacpy.quants._search_np import absmax_np, make_q3_quants_np, make_qx_quants_np, seqsum
from llamacpy.quants.q2_k import pack_2bit_np, unpack_2bit_np
from llamacpy.simd import (
    vand_k,
    vload_f32,
    vload_i32,
    vsll,
    vsplat_f32,
    vsplat_i32,
    vsrl,
    vstore_f32,
    vstore_i32,
)

TYPE = GGMLType.Q3_K
QK, TYPE_SIZE = GGML_BLOCK_SIZES[TYPE]
BLOCK = np.dtype(
    [("hmask", "u1", (QK // 8,)), ("qs", "u1", (QK // 4,)), ("scales", "u1", (12,)), ("d", "<f2")]
)
assert BLOCK.itemsize == TYPE_SIZE
_O_QS, _O_SC, _O_D = 32, 96, 108

_NEG32 = F32(-32.0)


@njit(cache=True, error_model="numpy")
def get_scale(q, o, j):
    """Six-bit scale ``j`` (0..15, not yet offset by -32) from the 12 bytes at ``q[o:]``."""
    low = (q[o + j] & 0xF) if j < 8 else (q[o + j - 8] >> 4)
    return np.int64(low) | (((np.int64(q[o + 8 + j % 4]) >> (2 * (j // 4))) & 3) << 4)


def get_scales_np(sc: np.ndarray) -> np.ndarray:
    """(nb, 16) six-bit scales from (nb, 12) packed bytes."""
    low = np.concatenate([sc[:, :8] & 0xF, sc[:, :8] >> 4], axis=1).astype(np.int64)
    j = np.arange(16)
    high = (sc[:, 8 + j % 4].astype(np.int64) >> (2 * (j // 4))) & 3
    return low | (high << 4)


def put_scales_np(ls: np.ndarray) -> np.ndarray:
    """Inverse of :func:`get_scales_np` (``ls`` in 0..63)."""
    out = np.zeros((ls.shape[0], 12), dtype=np.int64)
    out[:, :8] = (ls[:, :8] & 0xF) | ((ls[:, 8:] & 0xF) << 4)
    for j in range(16):
        out[:, 8 + j % 4] |= (ls[:, j] >> 4) << (2 * (j // 4))
    return out.astype(np.uint8)


@njit(cache=True, parallel=True, error_model="numpy")
def _dequantize_kernel(raw, y):
    n = y.size
    for i in prange(n // QK):
        o = i * TYPE_SIZE
        d_all = load_f16(raw, o + _O_D)
        for h in range(2):
            for k in range(4):
                for half in range(2):
                    g = 8 * h + 2 * k + half  # group of 16
                    dl = d_all * F32(get_scale(raw, o + _O_SC, g) - 32)
                    for l in range(16):
                        b = 16 * half + l
                        q = (np.int64(raw[o + _O_QS + 32 * h + b]) >> (2 * k)) & 3
                        if not (np.int64(raw[o + b]) >> (4 * h + k)) & 1:
                            q -= 4
                        y[i * QK + 16 * g + l] = dl * F32(q)


def dequantize(raw, n: int, out: np.ndarray | None = None) -> np.ndarray:
    """The first ``n`` elements stored in ``raw`` (Q3_K blocks) as float32 (numba), in
    ``out`` if given."""
    return run_dequantize(_dequantize_kernel, raw, n, QK, TYPE_SIZE, TYPE.name, out)


def dequantize_numpy(raw, n: int) -> np.ndarray:
    """Vectorized numpy twin of :func:`dequantize`."""
    b = blocks_np(raw, n, QK, BLOCK, TYPE.name)
    dl = fp16_to_fp32_np(b["d"])[:, None] * (get_scales_np(b["scales"]) - 32).astype(np.float32)
    high = (b["hmask"][:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1
    q = unpack_2bit_np(b["qs"]).astype(np.int64) - 4 * (1 - high.reshape(-1, QK))
    return (dl[:, :, None] * q.astype(np.float32).reshape(-1, 16, 16)).reshape(-1)


# ----------------------------------------------------------------------------- quantize


@njit(cache=True, error_model="numpy")
def _finish(x, Lt, out, o):
    """Requantize with the stored scales, then write ``hmask`` and ``qs``. ``Lt`` holds the
    searches' quants (transposed, group ``g`` in lane ``g``), kept where a scale is 0.

    One group of 16 per SIMD step: element ``32j + 16s + l`` (the ``hmask`` bit ``j`` of
    byte ``16s + l``) and element ``128h + 32k + 16s + l`` (bits ``2k`` of ``qs[32h + 16s +
    l]``) are lane ``l`` of groups ``2j + s`` and ``8h + 2k + s``."""
    L = np.empty(QK, dtype=np.int32)  # group g at [16g:16g+16]
    d_all = load_f16(out, o + _O_D)
    for g in range(16):
        d = d_all * F32(get_scale(out, o + _O_SC, g) - 32)
        if d == F0:
            for k in range(16):
                L[16 * g + k] = Lt[LANES * k + g]
        else:
            q = vnearest(vload_f32(x, 16 * g) / vsplat_f32(d), -4, 3)
            vstore_i32(L, 16 * g, q + vsplat_i32(4))
    for s in range(2):
        hm = vsrl(vload_i32(L, 16 * s), 2)
        for j in range(1, 8):
            hm = hm | vsll(vsrl(vload_i32(L, 16 * (2 * j + s)), 2), j)
        vstore_u8(out, o + 16 * s, hm)
        for h in range(2):
            qs = vand_k(vload_i32(L, 16 * (8 * h + s)), 3)
            for k in range(1, 4):
                qs = qs | vsll(vand_k(vload_i32(L, 16 * (8 * h + 2 * k + s)), 3), 2 * k)
            vstore_u8(out, o + _O_QS + 32 * h + 16 * s, qs)


@njit(cache=True, error_model="numpy")
def _put_scale(out, o, j, l):
    if j < 8:
        out[o + j] = l & 0xF
    else:
        out[o + j - 8] |= (l & 0xF) << 4
    out[o + 8 + j % 4] |= (l >> 4) << (2 * (j // 4))


@njit(cache=True, error_model="numpy")
def _ref_block(x, out, o):
    """``quantize_row_q3_K_ref`` for one super-block (the 16 groups' searches side by side,
    group ``g`` in lane ``g``)."""
    xt = np.empty(QK, dtype=np.float32)
    Lt = np.empty(QK, dtype=np.int32)
    scales = np.empty(LANES, dtype=np.float32)
    for g in range(16):
        for k in range(16):
            xt[LANES * k + g] = x[16 * g + k]
    make_q3_quants_x16(16, 4, xt, Lt, scales)
    max_scale = F0
    amax = F0
    for g in range(16):
        if abs(scales[g]) > amax:
            amax = abs(scales[g])
            max_scale = scales[g]
    for k in range(12):
        out[o + _O_SC + k] = 0
    if max_scale != F0:
        iscale = _NEG32 / max_scale
        for g in range(16):
            l8 = ((nearest_int(iscale * scales[g]) + 128) & 0xFF) - 128  # int8_t
            _put_scale(out, o + _O_SC, g, max(-32, min(31, l8)) + 32)
        store_f16(out, o + _O_D, F1 / iscale)
    else:
        store_f16(out, o + _O_D, F0)
    _finish(x, Lt, out, o)


@njit(cache=True, parallel=True, error_model="numpy")
def _quantize_ref_kernel(x, out):
    for i in prange(x.size // QK):
        _ref_block(x[i * QK : (i + 1) * QK], out, i * TYPE_SIZE)


@njit(cache=True, error_model="numpy")
def _impl_block(x, qw, out, o):
    """``quantize_row_q3_K_impl`` for one super-block (the 16 groups' searches side by side,
    group ``g`` in lane ``g``)."""
    xt = np.empty(QK, dtype=np.float32)
    wt = np.empty(QK, dtype=np.float32)
    Lt = np.empty(QK, dtype=np.int32)
    Lauxt = np.empty(QK, dtype=np.int32)
    scales = np.empty(LANES, dtype=np.float32)
    Ls = np.empty(16, dtype=np.int8)
    sumx2 = F0
    for j in range(QK):
        sumx2 += x[j] * x[j]
    sigma2 = F32(2.0) * sumx2 / F32(QK)
    for g in range(16):
        for k in range(16):
            v = x[16 * g + k]
            xt[LANES * k + g] = v
            wt[LANES * k + g] = qw[16 * g + k] * np.sqrt(sigma2 + v * v)
    sw = vsplat_f32(F0)  # from +0 as ggml's sum (-0 weights)
    for k in range(16):
        sw = sw + vload_f32(wt, LANES * k)
    sumw = np.empty(LANES, dtype=np.float32)
    vstore_f32(sumw, 0, sw)
    make_qx_quants_x16(16, 4, xt, wt, Lt, Lauxt, scales)
    for k in range(12):
        out[o + _O_SC + k] = 0
    d_block = make_qx_quants(16, 32, scales, Ls, sumw)
    for g in range(16):
        _put_scale(out, o + _O_SC, g, np.int64(Ls[g]))
    store_f16(out, o + _O_D, d_block)
    _finish(x, Lt, out, o)


@njit(cache=True, parallel=True, error_model="numpy")
def _quantize_impl_kernel(rows, qw, rows_per_qw, out):
    nrows, n_per_row = rows.shape
    for r in prange(nrows):
        w = qw[r // rows_per_qw]
        for i in range(n_per_row // QK):
            s = slice(i * QK, (i + 1) * QK)
            _impl_block(rows[r, s], w[s], out[r], i * TYPE_SIZE)


def quantize(x, imatrix=None, out=None) -> np.ndarray:
    """Quantize rows (last axis) to Q3_K bytes, as llama.cpp's ``quantize_q3_K`` (numba)."""
    return run_quantize(
        _quantize_ref_kernel, _quantize_impl_kernel, x, imatrix, QK, TYPE_SIZE, TYPE.name, out
    )


def _finish_np(x: np.ndarray, L: np.ndarray, ls: np.ndarray, d: np.ndarray) -> np.ndarray:
    out = np.zeros(x.shape[0], dtype=BLOCK)
    out["scales"] = put_scales_np(ls)
    out["d"] = fp32_to_fp16_np(d).view(np.float16)
    dl = fp16_to_fp32_np(out["d"])[:, None] * (ls - 32).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        requant = np.clip(nearest_int_np(x.reshape(-1, 16, 16) / dl[:, :, None]), -4, 3) + 4
    L = np.where((dl == F0)[:, :, None], L.reshape(-1, 16, 16), requant).reshape(-1, QK)
    high = (L > 3).astype(np.uint8).reshape(-1, 8, 32)
    out["hmask"] = (high << np.arange(8, dtype=np.uint8)[None, :, None]).sum(axis=1)
    out["qs"] = pack_2bit_np(np.where(L > 3, L - 4, L))
    return out.view(np.uint8).reshape(-1, TYPE_SIZE)


def _ref_np(blocks: np.ndarray) -> np.ndarray:
    scales, L = make_q3_quants_np(4, blocks.reshape(-1, 16))
    scales = scales.reshape(-1, 16)
    _, max_scale = absmax_np(scales)
    nz = max_scale != F0
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = _NEG32 / max_scale
        l8 = ((nearest_int_np(iscale[:, None] * scales).astype(np.int64) + 128) & 0xFF) - 128
        d = np.where(nz, F1 / iscale, F0)
    ls = np.where(nz[:, None], np.clip(l8, -32, 31) + 32, 0)
    return _finish_np(blocks, L, ls, d)


def _impl_np(rows: np.ndarray, qw: np.ndarray) -> np.ndarray:
    x = rows.reshape(-1, QK)
    sigma2 = F32(2.0) * seqsum(x * x) / F32(QK)
    weight = qw.reshape(-1, QK) * np.sqrt(sigma2[:, None] + x * x)
    wg = weight.reshape(-1, 16)
    scales, L = make_qx_quants_np(4, x.reshape(-1, 16), wg)
    d_block, Ls = make_qx_quants_np(32, scales.reshape(-1, 16), seqsum(wg).reshape(-1, 16))
    return _finish_np(x, L, Ls, d_block).reshape(rows.shape[0], -1)


def quantize_numpy(x, imatrix=None) -> np.ndarray:
    """Vectorized numpy twin of :func:`quantize`."""
    return run_quantize_np(_ref_np, _impl_np, x, imatrix, QK, TYPE_SIZE, TYPE.name)


FORMAT = register(
    QuantFormat(TYPE, BLOCK, dequantize, dequantize_numpy, quantize, quantize_numpy, GGMLType.Q8_K)
)
