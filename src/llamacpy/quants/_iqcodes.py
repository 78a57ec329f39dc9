"""The integer form of the grid and ternary formats (see :mod:`._iqgrid`) for any of them,
chosen by ggml type id: :func:`decode` / :func:`mult` dispatch to the format's module, and
:func:`dequantize_kernel` (numba) expands blocks to floats with them. The engine repacks
weights through :func:`decode` too (``ops/qdot_iq.py``).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from llamacpy.quants import iq1_m, iq1_s, iq2_s, iq2_xs, iq2_xxs, iq3_s, iq3_xxs, tq1_0, tq2_0
from llamacpy.quants._helpers import F32
from llamacpy.quants._iqgrid import QK
from llamacpy.simd import f16_to_f32

MODULES = (iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s, iq1_s, iq1_m, tq1_0, tq2_0)
IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, TQ1_0 = (int(m.TYPE) for m in MODULES[:8])
TYPE_IDS = tuple(int(m.TYPE) for m in MODULES)
_N = max(TYPE_IDS) + 1
# per type id: sub-block scales per 256 weights, the value factor c, block bytes
NSUB = np.zeros(_N, np.int64)
C = np.zeros(_N, np.float32)
TYPE_SIZE = np.zeros(_N, np.int64)
for _m in MODULES:
    NSUB[int(_m.TYPE)], C[int(_m.TYPE)], TYPE_SIZE[int(_m.TYPE)] = _m.NSUB, _m.C, _m.TYPE_SIZE
# per type id: its values (at most 16) as 4-bit codes -- VALUE_U[t, i]: value i + 128 (u8;
# unused codes 128), VALUE_CODE[t, v + 128]: the code of value v (255: not a value of t)
VALUE_U = np.full((_N, 16), 128, np.uint8)
VALUE_CODE = np.full((_N, 256), 255, np.uint8)
for _m in MODULES:
    assert len(_m.VALUES) <= 16, _m
    for _i, _v in enumerate(_m.VALUES):
        VALUE_U[int(_m.TYPE), _i] = _v + 128
        VALUE_CODE[int(_m.TYPE), _v + 128] = _i


@njit(cache=True, inline="always")
def decode(t, raw, o, v, sc):
    """Format ``t``'s block at ``raw[o:]`` -> values ``v``, scales ``sc``; the f16 bits of d."""
    if t == IQ2_XXS:
        return iq2_xxs.decode(raw, o, v, sc)
    if t == IQ2_XS:
        return iq2_xs.decode(raw, o, v, sc)
    if t == IQ2_S:
        return iq2_s.decode(raw, o, v, sc)
    if t == IQ3_XXS:
        return iq3_xxs.decode(raw, o, v, sc)
    if t == IQ3_S:
        return iq3_s.decode(raw, o, v, sc)
    if t == IQ1_S:
        return iq1_s.decode(raw, o, v, sc)
    if t == IQ1_M:
        return iq1_m.decode(raw, o, v, sc)
    if t == TQ1_0:
        return tq1_0.decode(raw, o, v, sc)
    return tq2_0.decode(raw, o, v, sc)


@njit(cache=True, inline="always")
def mult(t, d, s):
    """Format ``t``'s float multiplier of a sub-block with scale ``s`` (``d``: float32)."""
    if t == IQ2_XXS or t == IQ2_XS or t == IQ2_S:  # noqa: SIM109 (numba)
        return iq2_xxs.mult(d, s)
    if t == IQ3_XXS:
        return iq3_xxs.mult(d, s)
    if t == IQ3_S or t == IQ1_S or t == IQ1_M:  # noqa: SIM109 (numba)
        return iq3_s.mult(d, s)
    return d


@njit(cache=True, inline="always")
def dequantize_block(t, raw, i, y):
    """Block ``i``: ``y[256 i + e] = mult(d, sc[e // (256 / nsub)]) * (v[e] * c)``."""
    nsub, c = NSUB[t], C[t]
    v = np.empty(QK, np.int8)
    sc = np.empty(nsub, np.int32)
    d = f16_to_f32(decode(t, raw, i * TYPE_SIZE[t], v, sc))
    per = QK // nsub
    for s in range(nsub):
        m = mult(t, d, sc[s])
        for e in range(s * per, s * per + per):
            y[i * QK + e] = m * (F32(v[e]) * c)


@njit(cache=True, parallel=True, error_model="numpy")
def dequantize_kernel(t, raw, y):
    """Every block of ``raw`` (format ``t``) into ``y``."""
    for i in prange(y.size // QK):
        dequantize_block(t, raw, i, y)
