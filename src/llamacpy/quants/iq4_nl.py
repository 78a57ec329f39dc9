"""IQ4_NL: blocks of 32 weights, fp16 scale ``d``, 4-bit indices into a non-linear table:
``x = d * KVALUES[q]``. Nibble layout as Q4_0.

:func:`quantize` is llama.cpp's ``quantize_iq4_nl`` (what llama-quantize runs, with or without
an importance matrix): ``quantize_row_iq4_nl_impl`` with a 15-step scale search.
:func:`quantize_row_ref` is ``quantize_row_iq4_nl_ref`` (no search; what ggml's CPU backend
uses to store an IQ4_NL KV cache). The search itself is shared with IQ4_XS.
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
    as_rows,
    blocks_np,
    fp16_to_fp32_np,
    fp32_to_fp16_np,
    out_shape,
    run_dequantize,
    run_quantize,
    run_quantize_np,
    store_f16,
)
from llamacpy.quants._registry import QuantFormat, register
from llamacpy.quants._search import best_index_int8
from llamacpy.quants._search_np import absmax_np, best_index_int8_np, seqsum
from llamacpy.simd import vload_f32, vload_u8, vperm_f32, vsplat_f32, vsrl, vstore_f32

TYPE = GGMLType.IQ4_NL
QK, TYPE_SIZE = GGML_BLOCK_SIZES[TYPE]
BLOCK = np.dtype([("d", "<f2"), ("qs", "u1", (QK // 2,))])
assert BLOCK.itemsize == TYPE_SIZE

KVALUES = np.array(
    [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8
)
KVALUES_F32 = KVALUES.astype(np.float32)
NTRY = 7


@njit(cache=True, parallel=True, error_model="numpy")
def _dequantize_kernel(raw, y):
    """One block (two 16-lane halves) per step; the table is one vector, indexed by nibble."""
    n = y.size
    table = vload_f32(KVALUES_F32, 0)
    for i in prange(n // QK):
        o = i * TYPE_SIZE
        d = vsplat_f32(load_f16h(raw, o))
        q = vload_u8(raw, o + 2)
        vstore_f32(y, i * QK, d * vperm_f32(table, q))
        vstore_f32(y, i * QK + QK // 2, d * vperm_f32(table, vsrl(q, 4)))


def dequantize(raw, n: int, out: np.ndarray | None = None) -> np.ndarray:
    """The first ``n`` elements stored in ``raw`` (IQ4_NL blocks) as float32 (numba), in
    ``out`` if given."""
    return run_dequantize(_dequantize_kernel, raw, n, QK, TYPE_SIZE, TYPE.name, out)


def dequantize_numpy(raw, n: int) -> np.ndarray:
    """Vectorized numpy twin of :func:`dequantize`."""
    b = blocks_np(raw, n, QK, BLOCK, TYPE.name)
    q = np.concatenate([b["qs"] & 0xF, b["qs"] >> 4], axis=1)
    return (fp16_to_fp32_np(b["d"])[:, None] * KVALUES_F32[q]).reshape(-1)


# ----------------------------------------------------------------------------- shared search


@njit(cache=True, error_model="numpy")
def block_scale(xb, w, L, ntry):
    """One 32-element block of ``quantize_row_iq4_nl_impl``: fills ``L`` (unless the block is
    all zero) and returns the float scale."""
    amax = F0
    mx = F0
    for j in range(32):
        if abs(xb[j]) > amax:
            amax = abs(xb[j])
            mx = xb[j]
    if amax < GROUP_MAX_EPS:
        return F0
    v0 = F32(KVALUES[0])
    d = -mx / v0 if ntry > 0 else mx / v0
    inv = F1 / d
    sumqx = F0
    sumq2 = F0
    for j in range(32):
        L[j] = best_index_int8(KVALUES_F32, inv * xb[j])
        q = KVALUES_F32[L[j]]
        sumqx += w[j] * q * xb[j]
        sumq2 += w[j] * q * q
    d = sumqx / sumq2 if sumq2 > F0 else F0
    best = d * sumqx
    for itry in range(-ntry, ntry + 1):
        inv = F32(itry + KVALUES[0]) / mx
        sumqx = F0
        sumq2 = F0
        for j in range(32):
            q = KVALUES_F32[best_index_int8(KVALUES_F32, inv * xb[j])]
            sumqx += w[j] * q * xb[j]
            sumq2 += w[j] * q * q
        if sumq2 > F0 and sumqx * sumqx > best * sumq2:
            d = sumqx / sumq2
            best = d * sumqx
    return d


@njit(cache=True, error_model="numpy")
def block_weights(x, qw, use_qw, w):
    """Weights of one super-block: ``qw * sqrt(sigma2 + x*x)`` or ``x*x``."""
    sigma2 = F0
    for j in range(x.size):
        sigma2 += x[j] * x[j]
    sigma2 *= F32(2.0) / F32(x.size)
    for j in range(x.size):
        w[j] = qw[j] * np.sqrt(sigma2 + x[j] * x[j]) if use_qw else x[j] * x[j]


@njit(cache=True, error_model="numpy")
def pack_nibbles(L, out, o, nb):
    for i in range(nb):
        for j in range(16):
            out[o + 16 * i + j] = L[32 * i + j] | (L[32 * i + 16 + j] << 4)


@njit(cache=True, error_model="numpy")
def _block(x, qw, use_qw, out, o, ntry, L):
    w = np.empty(QK, dtype=np.float32)
    block_weights(x, qw, use_qw, w)
    scale = block_scale(x, w, L, ntry)
    store_f16(out, o, scale)
    if ntry > 0:
        inv = F1 / scale if scale != F0 else F0
        for j in range(QK):
            L[j] = best_index_int8(KVALUES_F32, inv * x[j])
    pack_nibbles(L, out, o + 2, 1)


@njit(cache=True, parallel=True, error_model="numpy")
def _quantize_ref_kernel(x, out):
    for i in prange(x.size // QK):
        L = np.zeros(QK, dtype=np.uint8)
        _block(x[i * QK : (i + 1) * QK], x[:0], False, out, i * TYPE_SIZE, NTRY, L)


@njit(cache=True, parallel=True, error_model="numpy")
def _quantize_impl_kernel(rows, qw, rows_per_qw, out):
    nrows, n_per_row = rows.shape
    for r in prange(nrows):
        w = qw[r // rows_per_qw]
        L = np.zeros(QK, dtype=np.uint8)
        for i in range(n_per_row // QK):
            s = slice(i * QK, (i + 1) * QK)
            _block(rows[r, s], w[s], True, out[r], i * TYPE_SIZE, NTRY, L)


@njit(cache=True, error_model="numpy")
def _quantize_row_ref_kernel(x, out):
    L = np.zeros(QK, dtype=np.uint8)  # kept across blocks, as in ggml
    for i in range(x.size // QK):
        _block(x[i * QK : (i + 1) * QK], x[:0], False, out, i * TYPE_SIZE, -1, L)


def quantize(x, imatrix=None, out=None) -> np.ndarray:
    """Quantize rows (last axis) to IQ4_NL bytes, as llama.cpp's ``quantize_iq4_nl``."""
    return run_quantize(
        _quantize_ref_kernel, _quantize_impl_kernel, x, imatrix, QK, TYPE_SIZE, TYPE.name, out
    )


def quantize_row_ref(x) -> np.ndarray:
    """``quantize_row_iq4_nl_ref``: no scale search. An all-zero block gets ``d = 0`` and the
    indices of the block before it (ggml leaves its scratch array as it was; zeros at first)."""
    rows = as_rows(x, QK, TYPE.name)
    out = np.empty(rows.size // QK * TYPE_SIZE, dtype=np.uint8)
    _quantize_row_ref_kernel(rows.reshape(-1), out)
    return out.reshape(out_shape(np.shape(x), QK, TYPE_SIZE))


# ----------------------------------------------------------------------------- numpy twins


def block_scale_np(x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """numpy twin of :func:`block_scale` (ntry = 7) for (B, 32) blocks: (scale, zero mask)."""
    amax, mx = absmax_np(x)
    zero = amax < GROUP_MAX_EPS
    with np.errstate(all="ignore"):
        inv = F1 / (-mx / KVALUES_F32[0])
        q = KVALUES_F32[best_index_int8_np(KVALUES, inv[:, None] * x)]
        sumqx, sumq2 = seqsum(w * q * x), seqsum(w * q * q)
        d = np.where(sumq2 > F0, sumqx / sumq2, F0)
        best = d * sumqx
        for itry in range(-NTRY, NTRY + 1):
            inv = F32(itry + int(KVALUES[0])) / mx
            q = KVALUES_F32[best_index_int8_np(KVALUES, inv[:, None] * x)]
            sumqx, sumq2 = seqsum(w * q * x), seqsum(w * q * q)
            upd = (sumq2 > F0) & (sumqx * sumqx > best * sumq2)
            d = np.where(upd, sumqx / sumq2, d)
            best = np.where(upd, d * sumqx, best)
    return np.where(zero, F0, d), zero


def block_weights_np(x: np.ndarray, qw: np.ndarray | None) -> np.ndarray:
    """numpy twin of :func:`block_weights` for (B, super_block_size) rows."""
    if qw is None:
        return x * x
    sigma2 = seqsum(x * x) * (F32(2.0) / F32(x.shape[1]))
    return qw * np.sqrt(sigma2[:, None] + x * x)


def _blocks_np(x: np.ndarray, qw: np.ndarray | None) -> np.ndarray:
    scale, _ = block_scale_np(x, block_weights_np(x, qw))
    with np.errstate(divide="ignore"):
        inv = np.where(scale != F0, F1 / scale, F0)
    L = best_index_int8_np(KVALUES, inv[:, None] * x)
    out = np.zeros(x.shape[0], dtype=BLOCK)
    out["d"] = fp32_to_fp16_np(scale).view(np.float16)
    out["qs"] = L[:, :16] | (L[:, 16:] << 4)
    return out.view(np.uint8).reshape(-1, TYPE_SIZE)


def _impl_np(rows: np.ndarray, qw: np.ndarray) -> np.ndarray:
    return _blocks_np(rows.reshape(-1, QK), qw.reshape(-1, QK)).reshape(rows.shape[0], -1)


def quantize_numpy(x, imatrix=None) -> np.ndarray:
    """Vectorized numpy twin of :func:`quantize`."""
    return run_quantize_np(
        lambda b: _blocks_np(b, None), _impl_np, x, imatrix, QK, TYPE_SIZE, TYPE.name
    )


FORMAT = register(
    QuantFormat(TYPE, BLOCK, dequantize, dequantize_numpy, quantize, quantize_numpy, GGMLType.Q8_0)
)
