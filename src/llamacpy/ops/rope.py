"""Rotary position embedding, as ggml's ``rope_ext``: normal (adjacent pairs) and NeoX
(halves) modes, ``freq_base``, linear ``freq_scale``, per-dimension frequency factors
(llama3 rope scaling, ``rope_freqs.weight``) and YaRN (``ext_factor``, ``attn_factor``,
correction dims from ``beta_fast``/``beta_slow``).

The angle table of a position is computed like ggml (float32, ``theta *= theta_scale`` pair
after pair, ``cosf``/``sinf``), so results agree bit for bit up to libm.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numba import njit

from ..simd import fmaf

_F32 = np.float32


@dataclass(frozen=True)
class RopeParams:
    """Rope settings of a model + context (llama.cpp's cparams / hparams names)."""

    n_rot: int
    neox: bool = False
    freq_base: float = 10000.0
    freq_scale: float = 1.0
    ext_factor: float = 0.0
    attn_factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    n_ctx_orig: int = 0
    factors: bool = True  # False: the context's frequency factors are not applied (gemma4's
    # sliding-window layers; its global layers take ``rope_freqs``)

    def corr_dims(self) -> tuple[float, float]:
        """ggml_rope_yarn_corr_dims (float32 arithmetic)."""
        n_dims, base = _F32(self.n_rot), _F32(self.freq_base)

        def corr_dim(n_rot: float) -> np.float32:
            num = _F32(self.n_ctx_orig) / (_F32(n_rot) * _F32(2) * _F32(math.pi))
            return n_dims * _F32(math.log(num)) / (_F32(2) * _F32(math.log(base)))

        start = math.floor(corr_dim(self.beta_fast))
        end = math.ceil(corr_dim(self.beta_slow))
        return float(max(0, start)), float(min(self.n_rot - 1, end))

    def packed(self) -> np.ndarray:
        """float32 [9]: theta_scale, freq_scale, ext_factor, attn_factor, corr0, corr1,
        n_rot, neox, factors -- the form the kernels take (no rotated dimensions: a model
        without attention, theta_scale 1; factors 0: frequency factors ignored)."""
        exponent = -2.0 / self.n_rot if self.n_rot else 0.0
        theta_scale = _F32(math.pow(float(_F32(self.freq_base)), exponent))
        c0, c1 = self.corr_dims() if self.n_ctx_orig > 0 else (0.0, 0.0)
        return np.array(
            [
                theta_scale,
                self.freq_scale,
                self.ext_factor,
                self.attn_factor,
                c0,
                c1,
                self.n_rot,
                1.0 if self.neox else 0.0,
                1.0 if self.factors else 0.0,
            ],
            dtype=_F32,
        )


@njit(cache=True)
def rope_cache(pos, rp, ff, cache):
    """cos/sin of position ``pos`` into ``cache[0:n_rot]`` (pairs cos, sin), as
    ``ggml_rope_cache_init``; ``ff`` holds n_rot/2 frequency factors or is empty (or is
    ignored: ``rp[8]`` 0)."""
    if rp[8] == 0:
        ff = ff[:0]
    theta_scale, freq_scale, ext_factor, mscale0 = rp[0], rp[1], rp[2], rp[3]
    corr0, corr1 = rp[4], rp[5]
    n_rot = np.int64(rp[6])
    theta = _F32(pos)
    for i0 in range(0, n_rot, 2):
        f = ff[i0 // 2] if ff.size > 0 else _F32(1.0)
        extrap = theta / f
        interp = freq_scale * extrap
        th = interp
        mscale = mscale0
        if ext_factor != 0:
            y = (_F32(i0 // 2) - corr0) / max(_F32(0.001), corr1 - corr0)
            ramp = (_F32(1.0) - min(_F32(1.0), max(_F32(0.0), y))) * ext_factor
            th = interp * (_F32(1.0) - ramp) + extrap * ramp
            mscale = mscale * (_F32(1.0) + _F32(0.1) * np.log(_F32(1.0) / freq_scale))
        cache[i0] = np.cos(th) * mscale
        cache[i0 + 1] = np.sin(th) * mscale
        theta = theta * theta_scale


@njit(cache=True)
def rope_apply(x, t, off, n_heads, hd, cache, n_rot, neox):
    """Rotate heads ``x[t, off + h*hd : ...]`` (h < n_heads) in place with ``cache``."""
    half = n_rot // 2
    for h in range(n_heads):
        base = off + h * hd
        for i0 in range(0, n_rot, 2):
            c, s = cache[i0], cache[i0 + 1]
            if neox:
                i, j = base + i0 // 2, base + i0 // 2 + half
            else:
                i, j = base + i0, base + i0 + 1
            x0, x1 = x[t, i], x[t, j]
            # gcc contracts ggml's `x0*cos - x1*sin` into fma(x0, cos, -(x1*sin))
            x[t, i] = fmaf(x0, c, -(x1 * s))
            x[t, j] = fmaf(x0, s, x1 * c)


def _fma(a, b, c):
    """float32 fused multiply-add (the float64 product of two float32 is exact)."""
    return (a.astype(np.float64) * b + c).astype(_F32)


def rope_numpy(x: np.ndarray, pos: np.ndarray, params: RopeParams, ff=None) -> np.ndarray:
    """Twin: ``x`` [n_tokens, n_heads, head_dim] rotated by ``pos`` [n_tokens]."""
    rp = params.packed()
    ff = np.zeros(0, _F32) if ff is None else np.asarray(ff, _F32)
    x = np.array(x, dtype=_F32)
    n_rot, half = params.n_rot, params.n_rot // 2
    for t, p in enumerate(pos):
        cache = np.zeros(n_rot, _F32)
        rope_cache(int(p), rp, ff, cache)  # the table is scalar code either way
        c, s = cache[0::2], cache[1::2]
        if params.neox:
            a, b = x[t, :, :half].copy(), x[t, :, half:n_rot].copy()
            x[t, :, :half], x[t, :, half:n_rot] = _fma(a, c, -(b * s)), _fma(a, s, b * c)
        else:
            a, b = x[t, :, 0:n_rot:2].copy(), x[t, :, 1:n_rot:2].copy()
            x[t, :, 0:n_rot:2], x[t, :, 1:n_rot:2] = _fma(a, c, -(b * s)), _fma(a, s, b * c)
    return x
