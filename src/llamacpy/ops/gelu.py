"""GELU as ggml computes it on the CPU (``ggml_vec_gelu_f32`` with ``GGML_GELU_FP16``): the
tanh approximation ``0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2)))`` looked up in a
65536-entry table indexed by ``x`` rounded to f16, whose entries are themselves f16; inputs
at or below -10 give 0, at or above 10 give ``x``.

:func:`gelu` is the compiled kernel (rows of a 2-D array, in place allowed); :func:`gelu_numpy`
its twin; :func:`gelu_erf_numpy` is the exact erf form (``ggml_gelu_erf``), for reference.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from ..simd import f32_to_f16
from .activations import GELU_F16

_F32 = np.float32


# ggml_table_gelu_f16 (built in .activations, shared with GEGLU)
GELU_TABLE = GELU_F16


@njit(cache=True)
def gelu(x, t0, t1, n, table, out):
    """``out[t, :n] = gelu(x[t, :n])`` for rows ``t0..t1`` (ggml's f16 table form)."""
    for t in range(t0, t1):
        for i in range(n):
            v = x[t, i]
            if v <= -10.0:
                out[t, i] = 0.0
            elif v >= 10.0:
                out[t, i] = v
            else:
                out[t, i] = table[np.int64(f32_to_f16(v))]


def gelu_numpy(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, _F32)
    idx = np.clip(x, -10, 10).astype(np.float16).view(np.uint16)
    y = GELU_TABLE[idx]
    return np.where(x <= -10, _F32(0), np.where(x >= 10, x, y)).astype(_F32)


def gelu_erf_numpy(x: np.ndarray) -> np.ndarray:
    """Exact GELU ``0.5 x (1 + erf(x / sqrt(2)))`` (float64 inside)."""
    x = np.asarray(x, np.float64)
    erf = np.vectorize(math.erf, otypes=[np.float64])
    return (0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))).astype(_F32)
