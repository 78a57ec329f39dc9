"""Kernels of the Gated DeltaNet layer (qwen35), one token after another as ggml's CPU ops
(``ssm_conv``, ``l2_norm``, ``gated_delta_net``) compute them; numpy twins in
:mod:`llamacpy.models.delta_net_ref` (``conv1d_step``, ``l2_norm_numpy``,
``delta_rule_step``).

Each token updates the state row of its sequence (``rows[t]``), so a ubatch may interleave
sequences. The short causal convolution is :func:`.ssm.conv_bias_tokens` (no bias);
``delta_rule_head`` one token of the gated delta rule on one value head's state ``[S_v,
S_k]``; ``delta_rule_tokens`` every token and head of a ubatch (value head ``h`` reads key
head ``h % H_k``, as ggml broadcasts).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..simd import vfma, vhsum, vload_f32, vsplat_f32, vstore_f32, vzero_f32

_F32 = np.float32


@njit(cache=True, inline="always")
def l2_norm(x, off, n, eps, out):
    """``out[:n] = x[off:off+n] / sqrt(mean(x^2) + eps / n) / sqrt(n)``: ggml's L2 norm as
    the model graph computes it (an RMS norm over the head, sum of squares in double)."""
    s = 0.0
    for i in range(n):
        v = x[off + i]
        s += np.float64(v * v)
    mean = _F32(s / n)
    scale = _F32(1.0) / np.sqrt(mean + _F32(eps) / _F32(n))
    inv = _F32(1.0) / np.sqrt(_F32(n))
    for i in range(n):
        out[i] = x[off + i] * scale * inv


@njit(cache=True, inline="always")
def _dot(x, y, n):
    """``sum x[i] * y[i]`` as ggml_vec_dot_f32 (AVX-512): four 16-lane FMA accumulators over
    the first ``n & ~63`` values, added (0+2, 1+3, then 0+1) and reduced as a tree; the
    leftovers added one by one."""
    m = n & ~63
    total = _F32(0.0)
    if m > 0:
        s0, s1, s2, s3 = vzero_f32(), vzero_f32(), vzero_f32(), vzero_f32()
        for i in range(0, m, 64):
            s0 = vfma(vload_f32(x, i), vload_f32(y, i), s0)
            s1 = vfma(vload_f32(x, i + 16), vload_f32(y, i + 16), s1)
            s2 = vfma(vload_f32(x, i + 32), vload_f32(y, i + 32), s2)
            s3 = vfma(vload_f32(x, i + 48), vload_f32(y, i + 48), s3)
        total = vhsum((s0 + s2) + (s1 + s3))
    for i in range(m, n):
        total += x[i] * y[i]
    return total


@njit(cache=True, inline="always")
def _mad(y, x, v, n):
    """``y += x * v`` as ggml_vec_mad_f32: fused multiply-adds on the first ``n & ~63``
    values, the leftovers one by one."""
    m = n & ~63
    vv = vsplat_f32(v)
    for i in range(0, m, 16):
        vstore_f32(y, i, vfma(vload_f32(x, i), vv, vload_f32(y, i)))
    for i in range(m, n):
        y[i] += x[i] * v


@njit(cache=True, inline="always")
def delta_rule_head(S, q, k, v, voff, g, beta, out, ooff):
    """One token on one value head's state ``S`` [S_v, S_k] (updated), as ggml's
    ``gated_delta_net``: ``S *= exp(g)``, ``d = (v - S k) * beta``, ``S += d k^T``, ``out =
    S q / sqrt(S_v)`` (rows are independent: each row goes through the four steps at once);
    ``v`` and ``out`` are read and written at ``voff`` / ``ooff``."""
    s_v, s_k = S.shape
    scale = _F32(1.0) / np.sqrt(_F32(s_v))
    decay = _F32(np.exp(g))
    for j in range(s_v):
        row = S[j]
        for i in range(s_k):
            row[i] *= decay
        d = (v[voff + j] - _dot(row, k, s_k)) * beta
        _mad(row, k, d, s_k)
        out[ooff + j] = _dot(row, q, s_k) * scale


@njit(cache=True)
def delta_rule_tokens(q, k, v, g, beta, rows, state, out):
    """``q``/``k`` [n, H_k, S_k] (normalized), ``v`` [n, H_v, S_v], ``g``/``beta`` [n, H_v],
    ``state`` [seqs, H_v, S_v, S_k] (updated), ``out`` [n, H_v, S_v]: every token and value
    head through :func:`delta_rule_head`."""
    n, h_k = q.shape[0], q.shape[1]
    h_v = v.shape[1]
    for t in range(n):
        for h in range(h_v):
            kh = h % h_k
            S = state[rows[t], h]
            delta_rule_head(S, q[t, kh], k[t, kh], v[t, h], 0, g[t, h], beta[t, h], out[t, h], 0)
