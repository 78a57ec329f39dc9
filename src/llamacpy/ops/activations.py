"""SwiGLU ``silu(gate) * up`` with ggml's AVX-512 numerics (``ggml_vec_swiglu_f32``:
``ggml_v_silu`` = ``x / (1 + ggml_v_expf(0 - x))``, a polynomial ``exp`` with its own
rounding), so the result is bit-identical to llama.cpp's on the same inputs.

GEGLU ``gelu(gate) * up`` as ggml's CPU backend computes it (``GGML_GELU_FP16``): the gate
rounded to f16 indexes a table of tanh-approximated GELU values stored as f16; gates at or
below -10 give 0, at or above 10 pass through.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..simd import (
    f32_to_f16,
    vabs,
    vfma,
    vldexp,
    vload_f32,
    vselect_gt,
    vsplat_f32,
    vstore_f32,
    vzero_f32,
)

_F32 = np.float32
_C = {
    k: _F32(float.fromhex(v))
    for k, v in {
        "r": "0x1.8p23",
        "log2e": "0x1.715476p+0",
        "ln2hi": "0x1.62e4p-1",
        "ln2lo": "0x1.7f7d1cp-20",
        "c5": "0x1.0e4020p-7",
        "c4": "0x1.573e2ep-5",
        "c3": "0x1.555e66p-3",
        "c2": "0x1.fffdb6p-2",
        "c1": "0x1.ffffecp-1",
    }.items()
}
R, LOG2E, LN2HI, LN2LO = _C["r"], _C["log2e"], _C["ln2hi"], _C["ln2lo"]
C5, C4, C3, C2, C1 = _C["c5"], _C["c4"], _C["c3"], _C["c2"], _C["c1"]


@njit(cache=True, inline="always")
def vexp_ggml(x):
    """ggml_v_expf (AVX-512 variant) on 16 lanes."""
    r = vsplat_f32(R)
    z = vfma(x, vsplat_f32(LOG2E), r)
    n = z - r
    neg_n = vzero_f32() - n
    b = vfma(neg_n, vsplat_f32(LN2LO), vfma(neg_n, vsplat_f32(LN2HI), x))
    u = b * b
    p = vfma(vfma(vsplat_f32(C5), b, vsplat_f32(C4)), u, vfma(vsplat_f32(C3), b, vsplat_f32(C2)))
    j = vfma(p, u, vfma(vsplat_f32(C1), b, vsplat_f32(1.0)))
    res = vldexp(j, n)
    # |n| > 192: +inf for large x, 0 for very negative x
    alt = vselect_gt(n, vzero_f32(), vsplat_f32(np.inf), vzero_f32())
    return vselect_gt(vabs(n), vsplat_f32(192.0), alt, res)


ACT_SWIGLU, ACT_GEGLU = 0, 1  # ffn activations of the compiled forward
GELU_COEF_A = _F32(0.044715)
SQRT_2_OVER_PI = _F32(0.79788456080286535587989211986876)


def _gelu_f16_table() -> np.ndarray:
    """``ggml_table_gelu_f16`` as float32: GELU(tanh) of every f16 value, rounded to f16."""
    x = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(_F32)
    with np.errstate(all="ignore"):
        inner = _fma(GELU_COEF_A * x, x, _F32(1.0))  # gcc contracts 1 + A*x*x
        # tanh in double, rounded: glibc's tanhf (numpy's float32 tanh is less exact)
        th = np.tanh((SQRT_2_OVER_PI * x * inner).astype(np.float64)).astype(_F32)
        y = _F32(0.5) * x * (_F32(1.0) + th)
    return y.astype(_F32).astype(np.float16).astype(_F32)


@njit(cache=True)
def geglu(g, u, t0, t1, c0, c1, out):
    """``out[t, c] = gelu(g[t, c]) * u[t, c]`` for rows ``t0..t1``, columns ``c0..c1``
    (``ggml_vec_geglu_f32`` with the f16 table)."""
    tab = GELU_F16
    for t in range(t0, t1):
        for c in range(c0, c1):
            x = g[t, c]
            if x <= -10.0:
                y = _F32(0.0)
            elif x >= 10.0:
                y = x * u[t, c]
            else:
                y = tab[np.int64(f32_to_f16(x))] * u[t, c]
            out[t, c] = y


def geglu_numpy(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    g, u = np.asarray(g, _F32), np.asarray(u, _F32)
    idx = g.astype(np.float16).view(np.uint16).astype(np.int64)
    y = np.where(g <= -10, _F32(0.0), np.where(g >= 10, g, GELU_F16[idx]))
    return (y * u).astype(_F32)


@njit(cache=True)
def swiglu(g, u, t0, t1, c0, c1, out):
    """``out[t, c] = silu(g[t, c]) * u[t, c]`` for rows ``t0..t1``, columns ``c0..c1``
    (``c1 - c0`` a multiple of 16)."""
    one = vsplat_f32(1.0)
    for t in range(t0, t1):
        for c in range(c0, c1, 16):
            x = vload_f32(g[t], c)
            e = vexp_ggml(vzero_f32() - x)
            s = x / (one + e)
            vstore_f32(out[t], c, s * vload_f32(u[t], c))


@njit(cache=True, inline="always")
def sigmoid(x):
    """ggml's scalar ``1 / (1 + expf(-x))`` (float32)."""
    one = _F32(1.0)
    return one / (one + np.exp(-x))


@njit(cache=True)
def silu(x, t0, t1, c0, c1, out):
    """``out[t, c] = silu(x[t, c])`` for rows ``t0..t1``, columns ``c0..c1`` (``c1 - c0`` a
    multiple of 16; ``out`` may be ``x``), as ggml's vectorized ``silu``."""
    one = vsplat_f32(1.0)
    for t in range(t0, t1):
        for c in range(c0, c1, 16):
            v = vload_f32(x[t], c)
            vstore_f32(out[t], c, v / (one + vexp_ggml(vzero_f32() - v)))


@njit(cache=True)
def mul_silu(z, t0, t1, c0, c1, out):
    """``out[t, c] *= silu(z[t, c])`` (rows ``t0..t1``, columns ``c0..c1``, 16 at a time):
    a gate applied as ggml's ``mul(out, silu(z))``."""
    one = vsplat_f32(1.0)
    for t in range(t0, t1):
        for c in range(c0, c1, 16):
            v = vload_f32(z[t], c)
            s = v / (one + vexp_ggml(vzero_f32() - v))
            vstore_f32(out[t], c, vload_f32(out[t], c) * s)


def silu_numpy(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, _F32)
    return (x / (_F32(1.0) + exp_ggml_numpy(_F32(0.0) - x))).astype(_F32)


# gpt-oss's clamped SwiGLU (ggml_swiglu_oai): sigmoid slope and clamp
OAI_ALPHA, OAI_LIMIT = _F32(1.702), _F32(7.0)


@njit(cache=True)
def swiglu_oai(g, u, t0, t1, c0, c1, out):
    """``out[t, c] = x * sigmoid(alpha * x) * (y + 1)`` with ``x = min(g, limit)``, ``y =
    clamp(u, -limit, limit)`` for rows ``t0..t1``, columns ``c0..c1`` (ggml's scalar loop:
    ``x / (1 + expf(alpha * -x))``)."""
    one = _F32(1.0)
    for t in range(t0, t1):
        for c in range(c0, c1):
            x = min(g[t, c], OAI_LIMIT)
            y = min(max(u[t, c], -OAI_LIMIT), OAI_LIMIT)
            out[t, c] = x / (one + np.exp(OAI_ALPHA * -x)) * (y + one)


def _fma(a, b, c):
    return (a.astype(np.float64) * b + c).astype(_F32)


def exp_ggml_numpy(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, _F32)
    with np.errstate(invalid="ignore"):
        return _exp_ggml_numpy(x)


def _exp_ggml_numpy(x: np.ndarray) -> np.ndarray:
    z = _fma(x, LOG2E, R)
    n = (z - R).astype(_F32)
    b = _fma(-n, LN2LO, _fma(-n, LN2HI, x))
    u = (b * b).astype(_F32)
    j = _fma(_fma(_fma(C5, b, C4), u, _fma(C3, b, C2)), u, _fma(C1, b, _F32(1.0)))
    with np.errstate(over="ignore", invalid="ignore"):
        res = np.ldexp(j, n.astype(np.int32)).astype(_F32)
    alt = np.where(n > 0, _F32(np.inf), _F32(0.0))
    return np.where(np.abs(n) > 192, alt, res).astype(_F32)


def swiglu_numpy(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    g = np.asarray(g, _F32)
    s = (g / (_F32(1.0) + exp_ggml_numpy(_F32(0.0) - g))).astype(_F32)
    return (s * np.asarray(u, _F32)).astype(_F32)


def swiglu_oai_numpy(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Twin of :func:`swiglu_oai`."""
    x = np.minimum(np.asarray(g, _F32), OAI_LIMIT)
    y = np.clip(np.asarray(u, _F32), -OAI_LIMIT, OAI_LIMIT)
    e = np.exp((OAI_ALPHA * -x).astype(np.float64)).astype(_F32)  # expf, rounded
    return ((x / (_F32(1.0) + e)).astype(_F32) * (y + _F32(1.0))).astype(_F32)


GELU_F16 = _gelu_f16_table()
