"""Q5_K: Q4_K with a fifth bit, ``x = d*sc*q - dmin*m`` with ``q`` in 0..31.

Layout: fp16 ``d`` and ``dmin``, ``scales[12]`` (as Q4_K), ``qh[32]`` (bit ``g`` of byte ``l``
is the fifth bit of element ``32g + l``), ``qs[128]`` (low nibbles in the Q4_K layout).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from llamacpy.gguf.constants import GGML_BLOCK_SIZES, GGMLType
from llamacpy.quants._block32 import load_f16h
from llamacpy.quants._helpers import (
    F32,
    blocks_np,
    fp16_to_fp32_np,
    run_dequantize,
    run_quantize,
    run_quantize_np,
)
from llamacpy.quants._registry import QuantFormat, register
from llamacpy.quants.q4_k import (
    get_scale_min_np,
    pair_scales_k4,
    requantize,
    requantize_np,
    scales_impl,
    scales_impl_np,
    scales_ref,
    scales_ref_np,
)
from llamacpy.simd import vand_k, vcvt, vload_u8, vsll, vsrl, vstore_f32

TYPE = GGMLType.Q5_K
QK, TYPE_SIZE = GGML_BLOCK_SIZES[TYPE]
BLOCK = np.dtype(
    [
        ("d", "<f2"),
        ("dmin", "<f2"),
        ("scales", "u1", (12,)),
        ("qh", "u1", (QK // 8,)),
        ("qs", "u1", (QK // 2,)),
    ]
)
assert BLOCK.itemsize == TYPE_SIZE
_O_SC, _O_QH, _O_QS = 4, 16, 48


@njit(cache=True, parallel=True, error_model="numpy")
def _dequantize_kernel(raw, y):
    """16 values per SIMD step; groups ``2c`` and ``2c+1`` from the same 32 ``qs`` bytes."""
    n = y.size
    for i in prange(n // QK):
        o = i * TYPE_SIZE
        d = load_f16h(raw, o)
        dmin = load_f16h(raw, o + 2)
        for c in range(4):
            dl0, ml0, dl1, ml1 = pair_scales_k4(raw, o + _O_SC, c, d, dmin)
            for h in range(2):
                q = vload_u8(raw, o + _O_QS + 32 * c + 16 * h)
                qh = vload_u8(raw, o + _O_QH + 16 * h)
                q0 = vand_k(q, 0xF) | vsll(vand_k(vsrl(qh, 2 * c), 1), 4)
                q1 = vsrl(q, 4) | vsll(vand_k(vsrl(qh, 2 * c + 1), 1), 4)
                e = i * QK + 64 * c + 16 * h
                vstore_f32(y, e, dl0 * vcvt(q0) - ml0)
                vstore_f32(y, e + 32, dl1 * vcvt(q1) - ml1)


def dequantize(raw, n: int, out: np.ndarray | None = None) -> np.ndarray:
    """The first ``n`` elements stored in ``raw`` (Q5_K blocks) as float32 (numba), in
    ``out`` if given."""
    return run_dequantize(_dequantize_kernel, raw, n, QK, TYPE_SIZE, TYPE.name, out)


def dequantize_numpy(raw, n: int) -> np.ndarray:
    """Vectorized numpy twin of :func:`dequantize`."""
    b = blocks_np(raw, n, QK, BLOCK, TYPE.name)
    sc, m = get_scale_min_np(b["scales"])
    dl = fp16_to_fp32_np(b["d"])[:, None] * sc.astype(np.float32)
    ml = fp16_to_fp32_np(b["dmin"])[:, None] * m.astype(np.float32)
    qs = b["qs"].reshape(-1, 4, 1, 32)
    low = ((qs >> np.array([0, 4], dtype=np.uint8)[None, None, :, None]) & 0xF).reshape(-1, 8, 32)
    high = (b["qh"][:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1
    q = (low | (high << 4)).astype(np.float32)
    return (dl[:, :, None] * q - ml[:, :, None]).reshape(-1)


# ----------------------------------------------------------------------------- quantize


@njit(cache=True, error_model="numpy")
def _pack(L, out, o):
    for k in range(32):
        out[o + _O_QH + k] = 0
    for c in range(4):
        for k in range(32):
            l1 = np.int64(L[64 * c + k])
            l2 = np.int64(L[64 * c + 32 + k])
            if l1 > 15:
                l1 -= 16
                out[o + _O_QH + k] |= 1 << (2 * c)
            if l2 > 15:
                l2 -= 16
                out[o + _O_QH + k] |= 2 << (2 * c)
            out[o + _O_QS + 32 * c + k] = l1 | (l2 << 4)


@njit(cache=True, parallel=True, error_model="numpy")
def _quantize_ref_kernel(x, out):
    nblk = x.size // QK
    for p in prange((nblk + 1) // 2):
        nb = min(2, nblk - 2 * p)
        L = np.empty(2 * QK, dtype=np.uint8)
        scales_ref(x, 2 * p, nb, L, out, TYPE_SIZE, 31, F32(-0.5), F32(0.1), 15)
        for b in range(nb):
            i = 2 * p + b
            Lb = L[b * QK : (b + 1) * QK]
            requantize(x[i * QK : (i + 1) * QK], Lb, out, i * TYPE_SIZE, 31)
            _pack(Lb, out, i * TYPE_SIZE)


@njit(cache=True, parallel=True, error_model="numpy")
def _quantize_impl_kernel(rows, qw, rows_per_qw, out):
    nrows, n_per_row = rows.shape
    for r in prange(nrows):
        w = qw[r // rows_per_qw]
        L = np.empty(QK, dtype=np.uint8)
        for i in range(n_per_row // QK):
            s = slice(i * QK, (i + 1) * QK)
            scales_impl(rows[r, s], w[s], L, out[r], i * TYPE_SIZE, 31)
            requantize(rows[r, s], L, out[r], i * TYPE_SIZE, 31)
            _pack(L, out[r], i * TYPE_SIZE)


def quantize(x, imatrix=None, out=None) -> np.ndarray:
    """Quantize rows (last axis) to Q5_K bytes, as llama.cpp's ``quantize_q5_K`` (numba)."""
    return run_quantize(
        _quantize_ref_kernel, _quantize_impl_kernel, x, imatrix, QK, TYPE_SIZE, TYPE.name, out
    )


def _finish_np(x, L, packed, d, dmin) -> np.ndarray:
    L, d16, m16 = requantize_np(x, L, packed, d, dmin, 31)
    out = np.zeros(x.shape[0], dtype=BLOCK)
    out["d"], out["dmin"], out["scales"] = d16.view(np.float16), m16.view(np.float16), packed
    high = (L >> 4).reshape(-1, 8, 32).astype(np.uint8)
    out["qh"] = (high << np.arange(8, dtype=np.uint8)[None, :, None]).sum(axis=1)
    low = (L & 0xF).reshape(-1, 4, 2, 32)
    out["qs"] = (low[:, :, 0] | (low[:, :, 1] << 4)).reshape(-1, QK // 2)
    return out.view(np.uint8).reshape(-1, TYPE_SIZE)


def _ref_np(blocks: np.ndarray) -> np.ndarray:
    return _finish_np(blocks, *scales_ref_np(blocks, 31, F32(-0.5), F32(0.1), 15))


def _impl_np(rows: np.ndarray, qw: np.ndarray) -> np.ndarray:
    x = rows.reshape(-1, QK)
    out = _finish_np(x, *scales_impl_np(x, qw.reshape(-1, QK), 31))
    return out.reshape(rows.shape[0], -1)


def quantize_numpy(x, imatrix=None) -> np.ndarray:
    """Vectorized numpy twin of :func:`quantize`."""
    return run_quantize_np(_ref_np, _impl_np, x, imatrix, QK, TYPE_SIZE, TYPE.name)


FORMAT = register(
    QuantFormat(TYPE, BLOCK, dequantize, dequantize_numpy, quantize, quantize_numpy, GGMLType.Q8_K)
)
