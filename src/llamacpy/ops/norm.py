"""RMSNorm fused with the weight multiply, as ggml computes it (sum of squares in double)."""

from __future__ import annotations

import numpy as np
from numba import njit

_F32 = np.float32


@njit(cache=True)
def rms_norm(x, t0, t1, n, w, eps, out):
    """``out[t, :n] = x[t, :n] / sqrt(mean(x^2) + eps) * w`` for rows ``t0..t1``.

    ggml: ``sum += (double)(x*x)``; ``mean = (float)(sum/n)``; ``scale = 1/sqrtf(mean+eps)``;
    ``y = x * scale * w``.
    """
    for t in range(t0, t1):
        s = 0.0
        for i in range(n):
            v = x[t, i]
            s += np.float64(v * v)
        mean = _F32(s / n)
        scale = _F32(1.0) / np.sqrt(mean + eps)
        for i in range(n):
            out[t, i] = x[t, i] * scale * w[i]


def rms_norm_numpy(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    x = np.asarray(x, _F32)
    s = (x * x).astype(np.float64).sum(-1)
    mean = (s / x.shape[-1]).astype(_F32)
    scale = _F32(1.0) / np.sqrt(mean + _F32(eps))
    return x * scale[..., None] * np.asarray(w, _F32)


@njit(cache=True)
def layer_norm(x, t0, t1, n, w, b, eps, out):
    """``out[t, :n] = (x[t, :n] - mean) / sqrt(var + eps) * w + b`` for rows ``t0..t1``.

    ggml_norm: ``mean = (float)(sum (double)x / n)``; ``y = x - mean``;
    ``var = (float)(sum (double)(y*y) / n)``; ``y *= 1/sqrtf(var + eps)``; then the weight
    and bias are applied as separate element-wise ops (``ggml_mul``, ``ggml_add``).
    """
    for t in range(t0, t1):
        s = 0.0
        for i in range(n):
            s += np.float64(x[t, i])
        mean = _F32(_F32(s) / _F32(n))
        v = 0.0
        for i in range(n):
            d = x[t, i] - mean
            v += np.float64(d * d)
        var = _F32(v / n)
        scale = _F32(1.0) / np.sqrt(var + eps)
        for i in range(n):
            out[t, i] = (x[t, i] - mean) * scale * w[i] + b[i]


def layer_norm_numpy(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    x = np.asarray(x, _F32)
    n = x.shape[-1]
    mean = (x.astype(np.float64).sum(-1).astype(_F32) / _F32(n)).astype(_F32)
    y = x - mean[..., None]
    var = ((y * y).astype(np.float64).sum(-1) / n).astype(_F32)
    scale = _F32(1.0) / np.sqrt(var + _F32(eps))
    return (y * scale[..., None] * np.asarray(w, _F32) + np.asarray(b, _F32)).astype(_F32)


@njit(cache=True, inline="always")
def head_rms_norm(x, t, h0, h1, hd, w, eps):
    """RMSNorm of each head ``x[t, h*hd : (h+1)*hd]`` (``h0 <= h < h1``) in place, times ``w``
    (``hd`` values): the per-head Q/K norm of gemma3 / qwen3, qwen35's gated output norm
    (ggml ``rms_norm`` over the head dimension)."""
    for h in range(h0, h1):
        b = h * hd
        s = 0.0
        for i in range(hd):
            v = x[t, b + i]
            s += np.float64(v * v)
        mean = _F32(s / hd)
        scale = _F32(1.0) / np.sqrt(mean + eps)
        for i in range(hd):
            x[t, b + i] = x[t, b + i] * scale * w[i]


@njit(cache=True, inline="always")
def head_rms_norm_plain(x, t, h0, h1, hd, eps):
    """RMSNorm of each head ``x[t, h*hd : (h+1)*hd]`` (``h0 <= h < h1``) in place, no weight
    (ggml ``rms_norm`` alone: gemma4's value norm)."""
    for h in range(h0, h1):
        b = h * hd
        s = 0.0
        for i in range(hd):
            v = x[t, b + i]
            s += np.float64(v * v)
        mean = _F32(s / hd)
        scale = _F32(1.0) / np.sqrt(mean + eps)
        for i in range(hd):
            x[t, b + i] = x[t, b + i] * scale
