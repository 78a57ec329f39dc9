"""MXFP4 (OCP microscaling FP4): blocks of 32 weights, one E8M0 exponent byte ``e`` and
4-bit E2M1 codes: ``x = 2**(e - 128) * KVALUES[q]``. ``KVALUES`` are the E2M1 values doubled
(ggml's ``kvalues_mxfp4``), hence the half scale (``ggml_e8m0_to_fp32_half``). Nibble layout
as Q4_0: byte ``j`` holds element ``j`` (low nibble) and element ``j+16`` (high nibble).

:func:`quantize` is ggml's ``quantize_row_mxfp4_ref``, which ``quantize_mxfp4`` (what
llama-quantize runs) calls whether or not an importance matrix is given: the exponent from
the block's largest magnitude, then each element to the nearest table value.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from llamacpy.gguf.constants import GGML_BLOCK_SIZES, GGMLType
from llamacpy.quants._block32 import block_absmax, vstore_u8
from llamacpy.quants._helpers import (
    F0,
    F32,
    bits_f32,
    blocks_np,
    f2i,
    f2i_np,
    run_dequantize,
    run_quantize,
    run_quantize_np,
)
from llamacpy.quants._lanes import vblend, vlt
from llamacpy.quants._registry import QuantFormat, register
from llamacpy.simd import (
    vabs,
    vload_f32,
    vload_u8,
    vperm_f32,
    vsll,
    vsplat_f32,
    vsplat_i32,
    vsrl,
    vstore_f32,
)

TYPE = GGMLType.MXFP4
QK, TYPE_SIZE = GGML_BLOCK_SIZES[TYPE]
BLOCK = np.dtype([("e", "u1"), ("qs", "u1", (QK // 2,))])
assert BLOCK.itemsize == TYPE_SIZE

KVALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.int8)
KVALUES_F32 = KVALUES.astype(np.float32)
_EXP_BIAS = F32(127 - 2)  # the exponent of 2**floor(log2(amax)) / 4: E2M1's largest is 6


@njit(cache=True, error_model="numpy")
def e8m0_half(e):
    """``ggml_e8m0_to_fp32_half``: ``2**(e - 128)`` (denormal for ``e < 2``)."""
    e = np.int64(e)
    return bits_f32((0x00200000 << e) if e < 2 else ((e - 1) << 23))


def e8m0_half_np(e: np.ndarray) -> np.ndarray:
    """Vectorized :func:`e8m0_half` (float32)."""
    e = np.asarray(e, dtype=np.uint32)
    low = np.uint32(0x00200000) << np.minimum(e, 1)
    return np.where(e < 2, low, (np.maximum(e, 1) - 1) << np.uint32(23)).view(np.float32)


@njit(cache=True, parallel=True, error_model="numpy")
def _dequantize_kernel(raw, y):
    """One block (two 16-lane halves) per step; the table is one vector, indexed by nibble."""
    table = vload_f32(KVALUES_F32, 0)
    for i in prange(y.size // QK):
        o = i * TYPE_SIZE
        d = vsplat_f32(e8m0_half(raw[o]))
        q = vload_u8(raw, o + 1)
        vstore_f32(y, i * QK, vperm_f32(table, q) * d)
        vstore_f32(y, i * QK + QK // 2, vperm_f32(table, vsrl(q, 4)) * d)


def dequantize(raw, n: int, out: np.ndarray | None = None) -> np.ndarray:
    """The first ``n`` elements stored in ``raw`` (MXFP4 blocks) as float32 (numba), in
    ``out`` if given."""
    return run_dequantize(_dequantize_kernel, raw, n, QK, TYPE_SIZE, TYPE.name, out)


def dequantize_numpy(raw, n: int) -> np.ndarray:
    """Vectorized numpy twin of :func:`dequantize`."""
    b = blocks_np(raw, n, QK, BLOCK, TYPE.name)
    q = np.concatenate([b["qs"] & 0xF, b["qs"] >> 4], axis=1)
    with np.errstate(over="ignore"):  # 12 * 2**127 is inf in C too
        return (KVALUES_F32[q] * e8m0_half_np(b["e"])[:, None]).reshape(-1)


# ----------------------------------------------------------------------------- quantize


@njit(cache=True, error_model="numpy")
def block_exponent(amax):
    """``(uint8_t)(floorf(log2f(amax)) - 2 + 127)`` as x86-64 C computes it (0 for a zero
    block): ``log2f`` correctly rounded, the float truncated to int32, its low byte kept."""
    if not amax > F0:
        return 0
    lg = F32(np.log2(np.float64(amax)))
    return f2i(F32(np.floor(lg)) + _EXP_BIAS) & 0xFF


@njit(cache=True, error_model="numpy")
def best_indices(v, d):
    """``best_index_mxfp4`` of 16 values at once: the first code whose value
    ``KVALUES[i] * d`` is nearest (a NaN gets code 0: C's ``err < best_err`` is false)."""
    best = vabs(vsplat_f32(KVALUES_F32[0] * d) - v)
    idx = vsplat_i32(0)
    for i in range(1, 16):
        err = vabs(vsplat_f32(KVALUES_F32[i] * d) - v)
        better = vlt(err, best)
        idx = vblend(better, vsplat_i32(i), idx)
        best = vblend(better, err, best)
    return idx


@njit(cache=True, parallel=True, error_model="numpy")
def _quantize_ref_kernel(x, out):
    """``quantize_row_mxfp4_ref``, one block (two 16-lane halves) per step."""
    for i in prange(x.size // QK):
        mx, v0, v1 = block_absmax(x, i * QK)  # the NaN-skipping |max| (as its signed value)
        e = block_exponent(abs(mx))
        d = e8m0_half(e)
        o = i * TYPE_SIZE
        out[o] = e
        vstore_u8(out, o + 1, best_indices(v0, d) | vsll(best_indices(v1, d), 4))


def quantize(x, imatrix=None, out=None) -> np.ndarray:
    """Quantize rows (last axis) to MXFP4 bytes, as llama.cpp's ``quantize_mxfp4`` (numba;
    an importance matrix is accepted and, as in ggml, not used)."""
    return run_quantize(_quantize_ref_kernel, None, x, imatrix, QK, TYPE_SIZE, TYPE.name, out)


def block_exponent_np(amax: np.ndarray) -> np.ndarray:
    """Vectorized :func:`block_exponent` (uint8)."""
    with np.errstate(divide="ignore"):
        lg = np.log2(amax.astype(np.float64)).astype(np.float32)
    e = f2i_np(np.floor(lg) + _EXP_BIAS) & 0xFF
    return np.where(amax > F0, e, 0).astype(np.uint8)


def _ref_np(blocks: np.ndarray) -> np.ndarray:
    a = np.abs(blocks)
    amax = np.where(np.isnan(a), F0, a).max(axis=1)
    e = block_exponent_np(amax)
    d = e8m0_half_np(e)
    err = np.abs(d[:, None, None] * KVALUES_F32 - blocks[:, :, None])  # float32 [B, 32, 16]
    err = np.where(np.isnan(err), np.inf, err)  # C never prefers a NaN error
    q = np.argmin(err, axis=-1).astype(np.uint8)  # the first of equal errors, as in C
    out = np.zeros(blocks.shape[0], dtype=BLOCK)
    out["e"] = e
    out["qs"] = q[:, : QK // 2] | (q[:, QK // 2 :] << 4)
    return out.view(np.uint8).reshape(-1, TYPE_SIZE)


def quantize_numpy(x, imatrix=None) -> np.ndarray:
    """Vectorized numpy twin of :func:`quantize`."""
    return run_quantize_np(_ref_np, None, x, imatrix, QK, TYPE_SIZE, TYPE.name)


FORMAT = register(
    QuantFormat(TYPE, BLOCK, dequantize, dequantize_numpy, quantize, quantize_numpy, GGMLType.Q8_0)
)
