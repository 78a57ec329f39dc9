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
