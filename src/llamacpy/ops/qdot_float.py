"""Block kernels of the float weight formats (F32, F16, BF16) x float activations.

A repacked "block" is 16 weights of 16 rows stored ``[k][row]``: one vector per weight
index ``k``, multiplied by the broadcast activation ``xf[t, 16b + k]`` (which the caller has
rounded to f16 / bf16 precision for F16 / BF16 weights, as ggml converts activations to the
weight's type before its dot products). Same contract as :mod:`.qdot_legacy`.

The formats' matmul kernels, row decoders and traits records (:mod:`.traits`) close the file.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..gguf.constants import GGMLType
from ..simd import (
    bits_to_f32,
    load_f16,
    load_f32,
    vfma,
    vload_bf16,
    vload_f16,
    vload_f32,
    vsplat_f32,
)
from .drive import drive
from .traits import ACT_BF16, ACT_F16, ACT_F32, FormatTraits, Layout, T, register


@njit(cache=True, inline="always")
def _wk(w, o, k, e):
    if e == 4:
        return vload_f32(w, o + 64 * k)
    if e == 2:
        return vload_f16(w, o + 32 * k)
    return vload_bf16(w, o + 32 * k)


@njit(cache=True, inline="always")
def _f_t1(w, o, A, t, b, acc, e):
    xf = A[7]
    for k in range(16):
        acc = vfma(_wk(w, o, k, e), vsplat_f32(xf[t, 16 * b + k]), acc)
    return acc


@njit(cache=True, inline="always")
def _f_t4(w, o, A, t, b, a0, a1, a2, a3, e):
    xf = A[7]
    for k in range(16):
        v = _wk(w, o, k, e)
        i = 16 * b + k
        a0 = vfma(v, vsplat_f32(xf[t, i]), a0)
        a1 = vfma(v, vsplat_f32(xf[t + 1, i]), a1)
        a2 = vfma(v, vsplat_f32(xf[t + 2, i]), a2)
        a3 = vfma(v, vsplat_f32(xf[t + 3, i]), a3)
    return a0, a1, a2, a3


@njit(cache=True, inline="always")
def f32_t1(w, o, A, t, b, acc):
    return _f_t1(w, o, A, t, b, acc, 4)


@njit(cache=True, inline="always")
def f32_t4(w, o, A, t, b, a0, a1, a2, a3):
    return _f_t4(w, o, A, t, b, a0, a1, a2, a3, 4)


@njit(cache=True, inline="always")
def f16_t1(w, o, A, t, b, acc):
    return _f_t1(w, o, A, t, b, acc, 2)


@njit(cache=True, inline="always")
def f16_t4(w, o, A, t, b, a0, a1, a2, a3):
    return _f_t4(w, o, A, t, b, a0, a1, a2, a3, 2)


@njit(cache=True, inline="always")
def bf16_t1(w, o, A, t, b, acc):
    return _f_t1(w, o, A, t, b, acc, 3)


@njit(cache=True, inline="always")
def bf16_t4(w, o, A, t, b, a0, a1, a2, a3):
    return _f_t4(w, o, A, t, b, a0, a1, a2, a3, 3)


# ----------------------------------------------------------------------------- the formats
# A float "block" is 16 weights; a group block holds them as [k][row] elements of ``e`` bytes.
_QK = 16
LAYOUT_F32 = Layout.of(GGMLType.F32, _QK, ACT_F32, (T, 0, 4 * _QK, 4))
LAYOUT_F16 = Layout.of(GGMLType.F16, _QK, ACT_F16, (T, 0, 2 * _QK, 2))
LAYOUT_BF16 = Layout.of(GGMLType.BF16, _QK, ACT_BF16, (T, 0, 2 * _QK, 2))
_F32_BB, _F16_BB = LAYOUT_F32.dst_bytes, LAYOUT_F16.dst_bytes
_BF16_BB = LAYOUT_BF16.dst_bytes


@njit(cache=True)
def mm_f32(w, desc, A, t0, t1, g0, g1, out, ot, add):
    drive(f32_t1, f32_t4, w, desc[1], desc[3] // _QK, _F32_BB, g0, g1, A, t0, t1, out, ot, add)


@njit(cache=True)
def mm_f16(w, desc, A, t0, t1, g0, g1, out, ot, add):
    drive(f16_t1, f16_t4, w, desc[1], desc[3] // _QK, _F16_BB, g0, g1, A, t0, t1, out, ot, add)


@njit(cache=True)
def mm_bf16(w, desc, A, t0, t1, g0, g1, out, ot, add):
    k1, k4 = bf16_t1, bf16_t4
    drive(k1, k4, w, desc[1], desc[3] // _QK, _BF16_BB, g0, g1, A, t0, t1, out, ot, add)


@njit(cache=True, inline="always")
def row_f32(w, o, r, out, y0):
    """Row ``r`` of the group block at ``w[o:]`` -> ``out[y0:y0+16]`` (rows are lanes)."""
    for k in range(_QK):
        out[y0 + k] = load_f32(w, o + (k * 16 + r) * 4)


@njit(cache=True, inline="always")
def row_f16(w, o, r, out, y0):
    for k in range(_QK):
        out[y0 + k] = load_f16(w, o + (k * 16 + r) * 2)


@njit(cache=True, inline="always")
def row_bf16(w, o, r, out, y0):
    for k in range(_QK):
        i = o + (k * 16 + r) * 2
        out[y0 + k] = bits_to_f32((np.int64(w[i]) | (np.int64(w[i + 1]) << 8)) << 16)


def _floats_numpy(f: dict, dtype) -> np.ndarray:
    return np.ascontiguousarray(f["f0"]).view(dtype).astype(np.float32)


def _bf16_numpy(f: dict) -> np.ndarray:
    bits = np.ascontiguousarray(f["f0"]).view(np.uint16).astype(np.uint32) << 16
    return bits.view(np.float32)


register(FormatTraits(LAYOUT_F32, mm_f32, row_f32, lambda f: _floats_numpy(f, np.float32)))
register(FormatTraits(LAYOUT_F16, mm_f16, row_f16, lambda f: _floats_numpy(f, np.float16)))
register(FormatTraits(LAYOUT_BF16, mm_bf16, row_bf16, _bf16_numpy))
