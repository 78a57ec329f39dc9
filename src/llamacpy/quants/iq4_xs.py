"""IQ4_XS: super-blocks of 256 weights in 8 groups of 32, ``x = d*(ls-32)*KVALUES[q]``.

Layout: fp16 ``d``, uint16 ``scales_h`` (high 2 bits of the eight 6-bit group scales ``ls``),
``scales_l[4]`` (their low nibbles, two per byte), ``qs[128]`` (IQ4_NL nibble layout per
group). Quantization is llama.cpp's ``quantize_iq4_xs`` (``quantize_row_iq4_nl_impl`` over a
super-block, with or without importance weights).
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
    fp16_to_fp32_np,
    fp32_to_fp16_np,
    nearest_int,
    nearest_int_np,
    run_dequantize,
    run_quantize,
    run_quantize_np,
    store_f16,
)
from llamacpy.quants._registry import QuantFormat, register
from llamacpy.quants._search import best_index_int8
from llamacpy.quants._search_np import absmax_np, best_index_int8_np
from llamacpy.quants.iq4_nl import (
    KVALUES,
    KVALUES_F32,
    NTRY,
    block_scale,
    block_scale_np,
    block_weights,
    block_weights_np,
    pack_nibbles,
)
from llamacpy.simd import vload_f32, vload_u8, vperm_f32, vsplat_f32, vsrl, vstore_f32

TYPE = GGMLType.IQ4_XS
QK, TYPE_SIZE = GGML_BLOCK_SIZES[TYPE]
BLOCK = np.dtype(
    [("d", "<f2"), ("scales_h", "<u2"), ("scales_l", "u1", (QK // 64,)), ("qs", "u1", (QK // 2,))]
)
assert BLOCK.itemsize == TYPE_SIZE
_O_SH, _O_SL, _O_QS = 2, 4, 8

_32 = F32(32.0)


@njit(cache=True, parallel=True, error_model="numpy")
def _dequantize_kernel(raw, y):
    """One group (two 16-lane halves) per step, the table looked up as in IQ4_NL."""
    n = y.size
    table = vload_f32(KVALUES_F32, 0)
    for i in prange(n // QK):
        o = i * TYPE_SIZE
        d = load_f16h(raw, o)
        sh = np.int64(raw[o + _O_SH]) | (np.int64(raw[o + _O_SH + 1]) << 8)
        for g in range(8):
            ls = ((np.int64(raw[o + _O_SL + g // 2]) >> (4 * (g % 2))) & 0xF) | (
                ((sh >> (2 * g)) & 3) << 4
            )
            dl = vsplat_f32(d * F32(ls - 32))
            q = vload_u8(raw, o + _O_QS + 16 * g)
            vstore_f32(y, i * QK + 32 * g, dl * vperm_f32(table, q))
            vstore_f32(y, i * QK + 32 * g + 16, dl * vperm_f32(table, vsrl(q, 4)))


def dequantize(raw, n: int, out: np.ndarray | None = None) -> np.ndarray:
    """The first ``n`` elements stored in ``raw`` (IQ4_XS blocks) as float32 (numba), in
    ``out`` if given."""
    return run_dequantize(_dequantize_kernel, raw, n, QK, TYPE_SIZE, TYPE.name, out)


def dequantize_numpy(raw, n: int) -> np.ndarray:
    """Vectorized numpy twin of :func:`dequantize`."""
    b = blocks_np(raw, n, QK, BLOCK, TYPE.name)
    g = np.arange(8)
    low = (b["scales_l"][:, g // 2].astype(np.int64) >> (4 * (g % 2))) & 0xF
    high = (b["scales_h"][:, None].astype(np.int64) >> (2 * g)) & 3
    dl = fp16_to_fp32_np(b["d"])[:, None] * ((low | (high << 4)) - 32).astype(np.float32)
    qs = b["qs"].reshape(-1, 8, 16)
    q = KVALUES_F32[np.concatenate([qs & 0xF, qs >> 4], axis=2)]
    return (dl[:, :, None] * q).reshape(-1)


# ----------------------------------------------------------------------------- quantize


@njit(cache=True, error_model="numpy")
def _block(x, qw, use_qw, out, o):
    """``quantize_row_iq4_nl_impl`` with super_block_size 256 (ntry 7)."""
    w = np.empty(QK, dtype=np.float32)
    L = np.zeros(QK, dtype=np.uint8)
    scales = np.empty(8, dtype=np.float32)
    block_weights(x, qw, use_qw, w)
    max_scale = F0
    amax_scale = F0
    for g in range(8):
        s = slice(32 * g, 32 * g + 32)
        scales[g] = block_scale(x[s], w[s], L[s], NTRY)
        if abs(scales[g]) > amax_scale:
            amax_scale = abs(scales[g])
            max_scale = scales[g]
    d = -max_scale / _32
    store_f16(out, o, d)
    inv = F1 / d if d != F0 else F0
    sh = 0
    for g in range(8):
        l = max(-32, min(31, nearest_int(inv * scales[g])))
        dl = d * F32(l)
        idl = F1 / dl if dl != F0 else F0
        for j in range(32):
            L[32 * g + j] = best_index_int8(KVALUES_F32, idl * x[32 * g + j])
        l += 32
        if g % 2 == 0:
            out[o + _O_SL + g // 2] = l & 0xF
        else:
            out[o + _O_SL + g // 2] |= (l & 0xF) << 4
        sh |= (l >> 4) << (2 * g)
    out[o + _O_SH] = sh & 0xFF
    out[o + _O_SH + 1] = sh >> 8
    pack_nibbles(L, out, o + _O_QS, 8)


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
    """Quantize rows (last axis) to IQ4_XS bytes, as llama.cpp's ``quantize_iq4_xs``."""
    return run_quantize(
        _quantize_ref_kernel, _quantize_impl_kernel, x, imatrix, QK, TYPE_SIZE, TYPE.name, out
    )


def _blocks_np(x: np.ndarray, qw: np.ndarray | None) -> np.ndarray:
    w = block_weights_np(x, qw)
    scales, _ = block_scale_np(x.reshape(-1, 32), w.reshape(-1, 32))
    scales = scales.reshape(-1, 8)
    _, max_scale = absmax_np(scales)
    d = -max_scale / _32
    with np.errstate(divide="ignore"):
        inv = np.where(d != F0, F1 / d, F0)
        l = np.clip(nearest_int_np(inv[:, None] * scales), -32, 31).astype(np.int64)
        dl = d[:, None] * l.astype(np.float32)
        idl = np.where(dl != F0, F1 / dl, F0)
    L = best_index_int8_np(KVALUES, idl[:, :, None] * x.reshape(-1, 8, 32)).reshape(-1, 8, 2, 16)
    l += 32
    out = np.zeros(x.shape[0], dtype=BLOCK)
    out["d"] = fp32_to_fp16_np(d).view(np.float16)
    out["scales_l"] = (l[:, 0::2] & 0xF) | ((l[:, 1::2] & 0xF) << 4)
    out["scales_h"] = ((l >> 4) << (2 * np.arange(8))).sum(axis=1)
    out["qs"] = (L[:, :, 0] | (L[:, :, 1] << 4)).reshape(-1, QK // 2)
    return out.view(np.uint8).reshape(-1, TYPE_SIZE)


def _impl_np(rows: np.ndarray, qw: np.ndarray) -> np.ndarray:
    return _blocks_np(rows.reshape(-1, QK), qw.reshape(-1, QK)).reshape(rows.shape[0], -1)


def quantize_numpy(x, imatrix=None) -> np.ndarray:
    """Vectorized numpy twin of :func:`quantize`."""
    return run_quantize_np(
        lambda b: _blocks_np(b, None), _impl_np, x, imatrix, QK, TYPE_SIZE, TYPE.name
    )


FORMAT = register(
    QuantFormat(TYPE, BLOCK, dequantize, dequantize_numpy, quantize, quantize_numpy, GGMLType.Q8_K)
)
