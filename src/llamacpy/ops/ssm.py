"""Kernels of the Mamba-2 layer, one token after another as ggml's CPU ops (``ssm_conv``,
``ssm_scan`` with a scalar decay per head) compute them; numpy twins in
:mod:`llamacpy.models.mamba2_ref`. The convolution also serves qwen35's Gated DeltaNet
and LFM2's short convolution (without a bias).

Each token updates the state rows of its sequence (``rows[t]``), so a ubatch may interleave
sequences. ``conv_bias_tokens`` runs the causal depthwise convolution of the channels
``c0..c1`` (taps summed in order, in float, then the channel's bias: ggml's ``ssm_conv``
then ``add``; the state row holds ``[channel, d_conv - 1]``); ``scan_head`` one token of the
selective scan on one head's state ``[head_dim, d_state]``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..simd import vfma, vhsum, vload_f32, vsplat_f32, vstore_f32, vzero_f32

_F32 = np.float32


@njit(cache=True)
def conv_bias_tokens(x, xoff, n, rows, state, w, bias, out, c0, c1):
    """For tokens ``0..n`` and channels ``c0..c1``: ``out[t, c] = sum_i window[c, i] *
    w[c, i] + bias[c]`` over the window of the state row ``state[rows[t], c, :]`` followed
    by ``x[t, xoff + c]``; the state row then drops its oldest input and takes the new one.
    An empty ``bias``: none added. ``out`` may be ``x`` (with ``xoff`` 0)."""
    has_bias = bias.shape[0] > 0
    taps = w.shape[1]
    for t in range(n):
        s = state[rows[t]]
        for c in range(c0, c1):
            xv = x[t, xoff + c]
            acc = _F32(0.0)
            for i in range(taps - 1):
                acc += s[c, i] * w[c, i]
            acc += xv * w[c, taps - 1]
            for i in range(taps - 2):
                s[c, i] = s[c, i + 1]
            s[c, taps - 2] = xv
            out[t, c] = acc + bias[c] if has_bias else acc


@njit(cache=True, inline="always")
def softplus(x):
    """ggml's ``softplus``: ``x`` above 20, else ``logf(1 + expf(x))``."""
    if x > _F32(20.0):
        return x
    return np.log(_F32(1.0) + np.exp(x))


@njit(cache=True, inline="always")
def scan_row(s, soff, bc, boff, coff, n, da, xdt):
    """One state row ``s[soff : soff + n]`` (updated): ``s = s * dA + B * x_dt`` (``B`` at
    ``bc[boff:]``, ``C`` at ``bc[coff:]``); returns
    ``sum(s * C)`` as ggml's AVX-512 loop: four 16-lane accumulators over the first ``n &
    ~63`` values (``acc = fma(s, C, acc)``), added (0+2, 1+3, then 0+1) and reduced as a
    tree; the leftovers added one by one."""
    m = n & ~63
    total = _F32(0.0)
    if m > 0:
        vda, vxdt = vsplat_f32(da), vsplat_f32(xdt)
        a0, a1, a2, a3 = vzero_f32(), vzero_f32(), vzero_f32(), vzero_f32()
        for i in range(0, m, 64):
            v0 = vload_f32(s, soff + i) * vda + vload_f32(bc, boff + i) * vxdt
            v1 = vload_f32(s, soff + i + 16) * vda + vload_f32(bc, boff + i + 16) * vxdt
            v2 = vload_f32(s, soff + i + 32) * vda + vload_f32(bc, boff + i + 32) * vxdt
            v3 = vload_f32(s, soff + i + 48) * vda + vload_f32(bc, boff + i + 48) * vxdt
            a0 = vfma(v0, vload_f32(bc, coff + i), a0)
            a1 = vfma(v1, vload_f32(bc, coff + i + 16), a1)
            a2 = vfma(v2, vload_f32(bc, coff + i + 32), a2)
            a3 = vfma(v3, vload_f32(bc, coff + i + 48), a3)
            vstore_f32(s, soff + i, v0)
            vstore_f32(s, soff + i + 16, v1)
            vstore_f32(s, soff + i + 32, v2)
            vstore_f32(s, soff + i + 48, v3)
        total = vhsum((a0 + a2) + (a1 + a3))
    for i in range(m, n):
        v = s[soff + i] * da + bc[boff + i] * xdt
        total += v * bc[coff + i]
        s[soff + i] = v
    return total


@njit(cache=True, inline="always")
def scan_head(S, x, xoff, hd, bc, boff, coff, ds, dt, a, d, y, yoff):
    """One token on one head's state ``S`` (flat ``[head_dim, d_state]``, updated) as ggml's
    ``ssm_scan`` with a scalar ``A``: ``dt = softplus(dt)``, ``dA = exp(dt * A)``; per row
    ``i``: ``S_i = S_i * dA + B * (x_i * dt)``, ``y_i = S_i . C + x_i * D`` (the skip
    connection added after, as ggml's ``add(y, mul(x, D))``); ``x`` / ``y`` read and written
    at ``xoff`` / ``yoff``, ``B`` and ``C`` (the head's group) at ``bc[boff:]``, ``bc[coff:]``."""
    sp = softplus(dt)
    da = _F32(np.exp(sp * a))
    for i in range(hd):
        xv = x[xoff + i]
        acc = scan_row(S, i * ds, bc, boff, coff, ds, da, xv * sp)
        y[yoff + i] = acc + xv * d
