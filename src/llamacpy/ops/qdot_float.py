"""Block kernels of the float weight formats (F32, F16, BF16) x float activations.

A repacked "block" is 16 weights of 16 rows stored ``[k][row]``: one vector per weight
index ``k``, multiplied by the broadcast activation ``xf[t, 16b + k]`` (which the caller has
rounded to f16 / bf16 precision for F16 / BF16 weights, as ggml converts activations to the
weight's type before its dot products). Same contract as :mod:`.qdot_legacy`.
"""

from __future__ import annotations

from numba import njit

from ..simd import vfma, vload_bf16, vload_f16, vload_f32, vsplat_f32


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
