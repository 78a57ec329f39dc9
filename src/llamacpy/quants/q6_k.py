"""Q6_K: super-blocks of 256 weights in 16 groups of 16, ``x = d*sc*(q-32)``, ``sc`` int8.

Layout: ``ql[128]`` (low nibbles), ``qh[64]`` (high 2-bit pairs), ``scales[16]`` (int8), fp16
``d``. In each half ``h`` of 128 elements, element ``128h + 32k + l`` has its low nibble in
``ql[64h + l + 32*(k%2)]`` (high nibble of the byte when ``k >= 2``) and its top bits in bits
``2k`` of ``qh[32h + l]``.
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
    GROUP_MAX_EPS,
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
from llamacpy.quants._lanes import LANES, make_qx_quants_x16
from llamacpy.quants._registry import QuantFormat, register
from llamacpy.quants._search_np import absmax_np, make_qx_quants_np
from llamacpy.simd import vand_k, vcvt, vload_u8, vsll, vsplat_f32, vsplat_i32, vsrl, vstore_f32

TYPE = GGMLType.Q6_K
QK, TYPE_SIZE = GGML_BLOCK_SIZES[TYPE]
BLOCK = np.dtype(
    [("ql", "u1", (QK // 2,)), ("qh", "u1", (QK // 4,)), ("scales", "i1", (16,)), ("d", "<f2")]
)
assert BLOCK.itemsize == TYPE_SIZE
_O_QH, _O_SC, _O_D = 128, 192, 208

_NEG128 = F32(-128.0)


@njit(cache=True, parallel=True, error_model="numpy")
def _dequantize_kernel(raw, y):
    """16 values (one scale group) per SIMD step: for each 16 ``l`` of a half, the ``ql`` and
    ``qh`` bytes are loaded once and give the four ``k``."""
    n = y.size
    sc8 = raw.view(np.int8)
    bias = vsplat_i32(32)
    for i in prange(n // QK):
        o = i * TYPE_SIZE
        d = load_f16h(raw, o + _O_D)
        for h in range(2):
            for s in range(2):  # l in 16s .. 16s+15
                qa = vload_u8(raw, o + 64 * h + 16 * s)  # k = 0 (low nibbles), 2 (high)
                qb = vload_u8(raw, o + 64 * h + 32 + 16 * s)  # k = 1, 3
                qh = vload_u8(raw, o + _O_QH + 32 * h + 16 * s)
                for k in range(4):
                    ql = qa if k % 2 == 0 else qb
                    low = vand_k(vsrl(ql, 4 * (k // 2)), 0xF)
                    q = (low | vsll(vand_k(vsrl(qh, 2 * k), 3), 4)) - bias
                    e = 128 * h + 32 * k + 16 * s
                    dl = vsplat_f32(d * F32(sc8[o + _O_SC + e // 16]))
                    vstore_f32(y, i * QK + e, dl * vcvt(q))


def dequantize(raw, n: int, out: np.ndarray | None = None) -> np.ndarray:
    """The first ``n`` elements stored in ``raw`` (Q6_K blocks) as float32 (numba), in
    ``out`` if given."""
    return run_dequantize(_dequantize_kernel, raw, n, QK, TYPE_SIZE, TYPE.name, out)


def _unpack_np(ql: np.ndarray, qh: np.ndarray) -> np.ndarray:
    low = ql.reshape(-1, 2, 1, 2, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1, 1)
    high = qh.reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    low = (low & 0xF).reshape(-1, 2, 4, 32)
    return (low | ((high & 3) << 4)).reshape(-1, QK).astype(np.int64) - 32


def dequantize_numpy(raw, n: int) -> np.ndarray:
    """Vectorized numpy twin of :func:`dequantize`."""
    b = blocks_np(raw, n, QK, BLOCK, TYPE.name)
    d = fp16_to_fp32_np(b["d"])[:, None] * b["scales"].astype(np.float32)
    q = _unpack_np(b["ql"], b["qh"]).astype(np.float32).reshape(-1, 16, 16)
    return (d[:, :, None] * q).reshape(-1)


# ----------------------------------------------------------------------------- quantize


@njit(cache=True, error_model="numpy")
def _block(x, qw, use_qw, out, o):
    """``quantize_row_q6_K_ref`` (``use_qw`` False: weights ``x*x``) / ``_impl`` for one
    super-block."""
    L = np.empty(QK, dtype=np.int8)
    xt = np.empty(QK, dtype=np.float32)
    wt = np.empty(QK, dtype=np.float32)
    Lt = np.empty(QK, dtype=np.int32)
    Lauxt = np.empty(QK, dtype=np.int32)
    scales = np.empty(LANES, dtype=np.float32)
    for g in range(16):  # sub-block g in lane g
        for k in range(16):
            v = x[16 * g + k]
            xt[LANES * k + g] = v
            wt[LANES * k + g] = qw[16 * g + k] if use_qw else v * v
    make_qx_quants_x16(16, 32, xt, wt, Lt, Lauxt, scales)
    max_scale = F0
    max_abs_scale = F0
    for g in range(16):
        for k in range(16):
            L[16 * g + k] = Lt[LANES * k + g]
        if abs(scales[g]) > max_abs_scale:
            max_abs_scale = abs(scales[g])
            max_scale = scales[g]
    if max_abs_scale < GROUP_MAX_EPS:
        for k in range(TYPE_SIZE):
            out[o + k] = 0
        return
    iscale = _NEG128 / max_scale
    store_f16(out, o + _O_D, F1 / iscale)
    for g in range(16):
        out[o + _O_SC + g] = min(127, nearest_int(iscale * scales[g])) & 0xFF
    d_all = load_f16(out, o + _O_D)
    sc8 = out[o + _O_SC : o + _O_SC + 16].view(np.int8)
    for g in range(16):
        d = d_all * F32(sc8[g])
        if d == F0:
            continue
        for k in range(16):
            L[16 * g + k] = max(-32, min(31, nearest_int(x[16 * g + k] / d))) + 32
    for h in range(2):
        for l in range(32):
            q = L[128 * h + l : 128 * h + l + 97 : 32]
            out[o + 64 * h + l] = (q[0] & 0xF) | ((q[2] & 0xF) << 4)
            out[o + 64 * h + l + 32] = (q[1] & 0xF) | ((q[3] & 0xF) << 4)
            out[o + _O_QH + 32 * h + l] = (
                (q[0] >> 4) | ((q[1] >> 4) << 2) | ((q[2] >> 4) << 4) | ((q[3] >> 4) << 6)
            )


@njit(cache=True, parallel=True, error_model="numpy")
def _quantize_ref_kernel(x, out):
    for i in prange(x.size // QK):
        _block(x[i * QK : (i + 1) * QK], x[:0], False, out, i * TYPE_SIZE)


@njit(cache=True, parallel=True, error_model="numpy")
def _quantize_impl_kernel(rows, qw, rows_per_qw, out):
    nrows, n_per_row = rows.shape
    for r in prange(nrows):
        w = qw[r // rows_per_qw]
        for i in range(n_per_row // QK):
            s = slice(i * QK, (i + 1) * QK)
            _block(rows[r, s], w[s], True, out[r], i * TYPE_SIZE)


def quantize(x, imatrix=None, out=None) -> np.ndarray:
    """Quantize rows (last axis) to Q6_K bytes, as llama.cpp's ``quantize_q6_K`` (numba)."""
    return run_quantize(
        _quantize_ref_kernel, _quantize_impl_kernel, x, imatrix, QK, TYPE_SIZE, TYPE.name, out
    )


def _blocks_np(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    scales, L = make_qx_quants_np(32, x.reshape(-1, 16), w.reshape(-1, 16))
    scales = scales.reshape(-1, 16)
    max_abs, max_scale = absmax_np(scales)
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = _NEG128 / max_scale
        sc = (np.minimum(127, nearest_int_np(iscale[:, None] * scales)) & 0xFF).astype(np.uint8)
        d16 = fp32_to_fp16_np(F1 / iscale)
        dl = fp16_to_fp32_np(d16)[:, None] * sc.view(np.int8).astype(np.float32)
        requant = np.clip(nearest_int_np(x.reshape(-1, 16, 16) / dl[:, :, None]), -32, 31) + 32
    L = np.where((dl == F0)[:, :, None], L.reshape(-1, 16, 16), requant).reshape(-1, 2, 4, 32)
    out = np.zeros(x.shape[0], dtype=BLOCK)
    out["d"] = d16.view(np.float16)
    out["scales"] = sc.view(np.int8)
    low, high = L & 0xF, L >> 4
    out["ql"] = (low[:, :, 0:2] | (low[:, :, 2:4] << 4)).reshape(-1, QK // 2)
    qh = high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)
    out["qh"] = qh.reshape(-1, 64)
    out[max_abs < GROUP_MAX_EPS] = np.zeros(1, dtype=BLOCK)
    return out.view(np.uint8).reshape(-1, TYPE_SIZE)


def _ref_np(blocks: np.ndarray) -> np.ndarray:
    return _blocks_np(blocks, blocks * blocks)


def _impl_np(rows: np.ndarray, qw: np.ndarray) -> np.ndarray:
    return _blocks_np(rows.reshape(-1, QK), qw.reshape(-1, QK)).reshape(rows.shape[0], -1)


def quantize_numpy(x, imatrix=None) -> np.ndarray:
    """Vectorized numpy twin of :func:`quantize`."""
    return run_quantize_np(_ref_np, _impl_np, x, imatrix, QK, TYPE_SIZE, TYPE.name)


FORMAT = register(
    QuantFormat(TYPE, BLOCK, dequantize, dequantize_numpy, quantize, quantize_numpy, GGMLType.Q8_K)
)
