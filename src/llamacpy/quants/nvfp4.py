"""NVFP4: blocks of 64 weights in four sub-blocks of 16, each with a UE4M3 scale byte
(unsigned, 4 exponent bits with bias 7, 3 mantissa bits) and 4-bit E2M1 codes:
``x = UE4M3_HALF[d] * KVALUES[q]``, ``KVALUES`` being MXFP4's E2M1 values doubled (hence the
half scale, ggml's ``ggml_ue4m3_to_fp32``; bytes 0 and 0x7F are a zero scale, the top bit is
ignored). A block is the 4 scale bytes then 32 bytes of codes; byte ``j`` of sub-block ``s``'s
8 holds its element ``j`` (low nibble) and ``j+8`` (high nibble).

:func:`quantize` is ggml's ``quantize_row_nvfp4_ref``, which ``quantize_nvfp4`` runs whether
or not an importance matrix is given: per sub-block, the scale is ``amax / 6`` (``amax`` the
largest ``|x|``, NaNs skipped) rounded to UE4M3 as ``ggml_fp32_to_ue4m3`` does (mantissa
rounded half up from bit 19, saturating at 448 = 0x7E, subnormals from
``(int)(x * 512 + 0.5)`` capped at 7), then each element to the first nearest table value.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from llamacpy.gguf.constants import GGML_BLOCK_SIZES, GGMLType
from llamacpy.quants._helpers import (
    F0,
    F32,
    blocks_np,
    f32_bits,
    run_dequantize,
    run_quantize,
    run_quantize_np,
)
from llamacpy.quants._lanes import vblend, vlt
from llamacpy.quants._registry import QuantFormat, register
from llamacpy.quants.mxfp4 import KVALUES_F32, best_indices
from llamacpy.simd import (
    vabs,
    vhmax,
    vlane,
    vload_f32,
    vload_i32,
    vload_u8,
    vperm_f32,
    vsplat_f32,
    vsrl,
    vstore_f32,
)

TYPE = GGMLType.NVFP4
QK, TYPE_SIZE = GGML_BLOCK_SIZES[TYPE]
QK_SUB = 16
NSUB = QK // QK_SUB
BLOCK = np.dtype([("d", "u1", (NSUB,)), ("qs", "u1", (QK // 2,))])
assert BLOCK.itemsize == TYPE_SIZE


def _ue4m3_half_table() -> np.ndarray:
    """``ggml_ue4m3_to_fp32`` of every byte (exact: at most 4 significant bits)."""
    t = np.zeros(256, np.float32)
    for x in range(256):
        if x in (0, 0x7F):
            continue
        e, m = (x >> 3) & 0xF, x & 7
        raw = m * 2.0**-9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
        t[x] = raw * 0.5
    return t


UE4M3_HALF = _ue4m3_half_table()
_SIX = F32(6.0)
_MAX = F32(448.0)
_512 = F32(512.0)
_HALF = F32(0.5)


# lane shuffles of the dequantizer: the other half of a vector, and the first half's lanes
_SWAP = np.array([*range(8, 16), *range(8)], np.int32)
_FIRST = np.array([1] * 8 + [0] * 8, np.int32)


@njit(cache=True, parallel=True, error_model="numpy")
def _dequantize_kernel(raw, y):
    """Two sub-blocks (one 16-byte load) per step: the codes' table values, low and high
    nibbles, rearranged into each sub-block's 16 elements."""
    table = vload_f32(KVALUES_F32, 0)
    swap, first = vload_i32(_SWAP, 0), vload_i32(_FIRST, 0)
    for i in prange(y.size // QK):
        o = i * TYPE_SIZE
        for p in range(NSUB // 2):
            q = vload_u8(raw, o + NSUB + 16 * p)
            lo, hi = vperm_f32(table, q), vperm_f32(table, vsrl(q, 4))
            a = vblend(first, lo, vperm_f32(hi, swap)) * vsplat_f32(UE4M3_HALF[raw[o + 2 * p]])
            b = vblend(first, vperm_f32(lo, swap), hi) * vsplat_f32(UE4M3_HALF[raw[o + 2 * p + 1]])
            vstore_f32(y, i * QK + 32 * p, a)
            vstore_f32(y, i * QK + 32 * p + 16, b)


def dequantize(raw, n: int, out: np.ndarray | None = None) -> np.ndarray:
    """The first ``n`` elements stored in ``raw`` (NVFP4 blocks) as float32 (numba), in
    ``out`` if given."""
    return run_dequantize(_dequantize_kernel, raw, n, QK, TYPE_SIZE, TYPE.name, out)


def dequantize_numpy(raw, n: int) -> np.ndarray:
    """Vectorized numpy twin of :func:`dequantize`."""
    b = blocks_np(raw, n, QK, BLOCK, TYPE.name)
    qs = b["qs"].reshape(len(b), NSUB, QK_SUB // 2)
    q = np.concatenate([qs & 0xF, qs >> 4], axis=2)  # [n, 4, 16]
    return (KVALUES_F32[q] * UE4M3_HALF[b["d"]][:, :, None]).reshape(-1)


# ----------------------------------------------------------------------------- quantize


@njit(cache=True, error_model="numpy")
def to_ue4m3(x):
    """``ggml_fp32_to_ue4m3`` of a float32 (0 for anything not above 0, NaN included)."""
    if not x > F0:
        return 0
    if x > _MAX:
        x = _MAX
    bits = np.int64(f32_bits(x))
    e = ((bits >> 23) & 0xFF) - 127 + 7
    if e <= 0:  # subnormal: man * 2**-9
        m = np.int64(x * _512 + _HALF)
        return 0 if m < 1 else min(m, 7)
    m = ((bits >> 20) & 7) + ((bits >> 19) & 1)
    if m > 7:
        m = 0
        e += 1
    return 0x7E if e >= 15 else (e << 3) | m


@njit(cache=True, parallel=True, error_model="numpy")
def _quantize_ref_kernel(x, out):
    """``quantize_row_nvfp4_ref``: one sub-block (a 16-lane vector) per step."""
    for i in prange(x.size // QK):
        ob = i * TYPE_SIZE
        for s in range(NSUB):
            v = vload_f32(x, i * QK + QK_SUB * s)
            a = vabs(v)
            am = vsplat_f32(F0)
            am = vblend(vlt(am, a), a, am)  # C's `amax < |x|`: NaNs never taken
            ue = to_ue4m3(vhmax(am) / _SIX)
            out[ob + s] = ue
            idx = best_indices(v, UE4M3_HALF[ue])
            _pack_nibbles(idx, out, ob + NSUB + 8 * s)


@njit(cache=True, inline="always")
def _pack_nibbles(idx, out, o):
    """Bytes ``out[o:o+8]``: lane ``j`` (low nibble) and lane ``j+8`` (high nibble) of the
    ``i32x16`` ``idx``."""
    for j in range(8):
        out[o + j] = vlane(idx, j) | (vlane(idx, j + 8) << 4)


def quantize(x, imatrix=None, out=None) -> np.ndarray:
    """Quantize rows (last axis) to NVFP4 bytes, as llama.cpp's ``quantize_nvfp4`` (numba;
    an importance matrix is accepted and, as in ggml, not used)."""
    return run_quantize(_quantize_ref_kernel, None, x, None, QK, TYPE_SIZE, TYPE.name, out)


def to_ue4m3_np(x: np.ndarray) -> np.ndarray:
    """Vectorized :func:`to_ue4m3` (uint8)."""
    x = np.minimum(np.asarray(x, np.float32), _MAX)
    bits = x.view(np.uint32).astype(np.int64)
    e = ((bits >> 23) & 0xFF) - 120
    subnormal = e <= 0
    m = ((bits >> 20) & 7) + ((bits >> 19) & 1)
    e = np.where(m > 7, e + 1, e)
    m = np.where(m > 7, 0, m)
    normal = np.where(e >= 15, 0x7E, (e << 3) | m)
    with np.errstate(invalid="ignore"):
        sub = np.trunc(np.where(subnormal, x, F0) * _512 + _HALF).astype(np.int64)
    res = np.where(subnormal, np.minimum(sub, 7), normal)  # (sub < 1 gives 0 already)
    return np.where(x > F0, res, 0).astype(np.uint8)


def _ref_np(blocks: np.ndarray) -> np.ndarray:
    sub = blocks.reshape(-1, NSUB, QK_SUB)
    a = np.abs(sub)
    amax = np.where(np.isnan(a), F0, a).max(axis=2)
    ue = to_ue4m3_np(amax / _SIX)
    d = UE4M3_HALF[ue]
    err = np.abs(d[..., None, None] * KVALUES_F32 - sub[..., None])  # [B, 4, 16, 16]
    err = np.where(np.isnan(err), np.inf, err)  # C never prefers a NaN error
    q = np.argmin(err, axis=-1).astype(np.uint8)
    out = np.zeros(len(blocks), dtype=BLOCK)
    out["d"] = ue
    out["qs"] = (q[..., :8] | (q[..., 8:] << 4)).reshape(len(blocks), -1)
    return out.view(np.uint8).reshape(-1, TYPE_SIZE)


def quantize_numpy(x, imatrix=None) -> np.ndarray:
    """Vectorized numpy twin of :func:`quantize`."""
    return run_quantize_np(_ref_np, None, x, None, QK, TYPE_SIZE, TYPE.name)


FORMAT = register(
    QuantFormat(TYPE, BLOCK, dequantize, dequantize_numpy, quantize, quantize_numpy, GGMLType.Q8_0)
)
