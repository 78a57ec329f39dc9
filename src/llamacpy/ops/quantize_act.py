"""Activation quantization for the integer dot products, exactly as ggml's CPU backend does it.

* q8 (blocks of 32; ggml's ``quantize_row_q8_0`` / ``q8_1`` on x86): ``d = amax/127``,
  ``q = round_half_even(x * (127/amax))``; the scale is stored as f16 (so ``xd`` holds the
  rounded value), ``xs = f16(d * sum(q))`` (q8_1's ``s``), ``xb`` = sums of 4 consecutive
  ``q`` (what the kernels need to take back weight offsets per 4-element lane).
* q8_K (blocks of 256; ``quantize_row_q8_K_ref``): ``iscale = -127/max`` where ``max`` is the
  signed value of largest magnitude, ``q = min(127, nearest_int(iscale*x))``, ``d = 1/iscale``
  (f32), ``xbk`` = sums of 16 consecutive ``q``.
* float formats: ``xf`` = x rounded to the weight's dot type (f16 or bf16) or copied (f32).

Buffers are ``[n_tokens, K]`` (and ``[n_tokens, K/32]`` ...) with ``K`` the largest input
width; a call fills rows ``t0..t1`` for the first ``k`` columns.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..simd import bits_to_f32, f32_to_bits, round_f16

_F32 = np.float32


@njit(cache=True)
def quantize_q8(x, t0, t1, k, xq, xd, xs, xb):
    """Rows ``t0..t1`` of ``x[:, :k]`` -> q8 blocks of 32 (``xq`` int8, ``xd``, ``xs``, ``xb``
    per 4)."""
    for t in range(t0, t1):
        for b in range(k // 32):
            amax = _F32(0.0)
            for j in range(32):
                a = abs(x[t, b * 32 + j])
                if a > amax:
                    amax = a
            d = amax / _F32(127.0)
            inv = _F32(127.0) / amax if amax != 0 else _F32(0.0)
            isum = 0
            for j in range(32):
                q = np.int32(np.rint(x[t, b * 32 + j] * inv))
                xq[t, b * 32 + j] = q
                isum += q
                if j % 4 == 0:
                    xb[t, b * 8 + j // 4] = q
                else:
                    xb[t, b * 8 + j // 4] += q
            xd[t, b] = round_f16(d)
            xs[t, b] = round_f16(d * _F32(isum))


@njit(cache=True)
def quantize_q8k(x, t0, t1, k, xq, xd, xb):
    """Rows ``t0..t1`` of ``x[:, :k]`` -> q8_K blocks of 256 (``xq``, ``xd`` f32, ``xb`` per 16)."""
    for t in range(t0, t1):
        for b in range(k // 256):
            amax = _F32(0.0)
            mx = _F32(0.0)
            for j in range(256):
                v = x[t, b * 256 + j]
                if abs(v) > amax:
                    amax = abs(v)
                    mx = v
            if amax == 0:
                xd[t, b] = 0
                for j in range(256):
                    xq[t, b * 256 + j] = 0
                for j in range(16):
                    xb[t, b * 16 + j] = 0
                continue
            iscale = _F32(-127.0) / mx
            for j in range(16):
                s = 0
                for i in range(16):
                    q = min(127, np.int32(np.rint(iscale * x[t, b * 256 + 16 * j + i])))
                    xq[t, b * 256 + 16 * j + i] = q
                    s += q
                xb[t, b * 16 + j] = s
            xd[t, b] = _F32(1.0) / iscale


@njit(cache=True)
def round_activations(x, t0, t1, k, mode, xf):
    """``xf[t, :k] = x[t, :k]`` rounded to f16 (``mode`` 3), bf16 (4) or copied (2)."""
    for t in range(t0, t1):
        for j in range(k):
            v = x[t, j]
            if mode == 3:
                v = round_f16(v)
            elif mode == 4:
                v = round_bf16(v)
            xf[t, j] = v


@njit(cache=True, inline="always")
def round_bf16(v):
    """float32 -> nearest bfloat16 (ties to even, NaN kept quiet), as ggml, back to float32."""
    u = np.int64(f32_to_bits(v))
    if (u & 0x7FFFFFFF) > 0x7F800000:
        return bits_to_f32((u | 0x00400000) & 0xFFFF0000)
    u = (u + (0x7FFF + ((u >> 16) & 1))) & 0xFFFF0000
    return bits_to_f32(u)


# ----------------------------------------------------------------------------- numpy twins
def quantize_q8_numpy(x: np.ndarray):
    """``x`` [n, k] -> (xq int8 [n, k], xd [n, k/32], xs [n, k/32], xb int32 [n, k/4])."""
    x = np.asarray(x, _F32)
    n, k = x.shape
    xb_ = x.reshape(n, k // 32, 32)
    amax = np.abs(xb_).max(-1)
    d = amax / _F32(127.0)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, _F32(127.0) / amax, _F32(0.0)).astype(_F32)
    q = np.rint(xb_ * inv[..., None]).astype(np.int32)
    isum = q.sum(-1)
    xd = d.astype(np.float16).astype(_F32)
    xs = (d * isum.astype(_F32)).astype(np.float16).astype(_F32)
    xb = q.reshape(n, k // 4, 4).sum(-1).astype(np.int32)
    return q.reshape(n, k).astype(np.int8), xd, xs, xb


def quantize_q8k_numpy(x: np.ndarray):
    """``x`` [n, k] -> (xq int8 [n, k], xd [n, k/256], xb int32 [n, k/16])."""
    x = np.asarray(x, _F32)
    n, k = x.shape
    blocks = x.reshape(n, k // 256, 256)
    idx = np.abs(blocks).argmax(-1)  # first of the largest, as the reference's strict '>'
    mx = np.take_along_axis(blocks, idx[..., None], -1)[..., 0]
    with np.errstate(divide="ignore"):
        iscale = np.where(mx != 0, _F32(-127.0) / mx, _F32(0.0)).astype(_F32)
    q = np.minimum(127, np.rint(iscale[..., None] * blocks)).astype(np.int32)
    with np.errstate(divide="ignore"):
        d = np.where(mx != 0, _F32(1.0) / iscale, _F32(0.0)).astype(_F32)
    xb = q.reshape(n, k // 16, 16).sum(-1).astype(np.int32)
    return q.reshape(n, k).astype(np.int8), d, xb


def round_activations_numpy(x: np.ndarray, mode: int) -> np.ndarray:
    x = np.asarray(x, _F32)
    if mode == 3:
        return x.astype(np.float16).astype(_F32)
    if mode == 4:
        u = x.view(np.uint32).astype(np.uint64)
        nan = (u & 0x7FFFFFFF) > 0x7F800000
        r = (u + (0x7FFF + ((u >> 16) & 1))) & 0xFFFF0000
        r = np.where(nan, (u | 0x00400000) & 0xFFFF0000, r)
        return r.astype(np.uint32).view(_F32)
    return x.copy()
