"""Kernels of the Gated DeltaNet layer (qwen35), one token after another as ggml's CPU ops
(``ssm_conv``, ``gated_delta_net``) compute them; numpy twins in
:mod:`llamacpy.models.delta_net_ref` (``conv1d_step``, ``delta_rule_step``).

Each token updates the state row of its sequence (``rows[t]``), so a ubatch may interleave
sequences. ``conv_tokens`` runs the short causal convolution (taps summed in order, in float;
the state row holds ``[channel, d_conv - 1]``); ``delta_rule_tokens`` the gated delta rule on
the states ``[rows, H_v, S_v, S_k]`` (value head ``h`` reads key head ``h % H_k``).
"""

from __future__ import annotations

import numpy as np
from numba import njit

_F32 = np.float32


@njit(cache=True)
def conv_tokens(x, rows, state, w, out):
    """``out[t, c] = sum_i window[c, i] * w[c, i]`` over the window of the state row
    ``state[rows[t], c, :]`` followed by ``x[t, c]``; the state row then drops its oldest
    input and takes ``x[t, c]``."""
    n, ch = x.shape
    taps = w.shape[1]
    for t in range(n):
        s = state[rows[t]]
        for c in range(ch):
            acc = _F32(0.0)
            for i in range(taps - 1):
                acc += s[c, i] * w[c, i]
            acc += x[t, c] * w[c, taps - 1]
            out[t, c] = acc
            for i in range(taps - 2):
                s[c, i] = s[c, i + 1]
            s[c, taps - 2] = x[t, c]


@njit(cache=True)
def delta_rule_tokens(q, k, v, g, beta, rows, state, out):
    """``q``/``k`` [n, H_k, S_k], ``v`` [n, H_v, S_v], ``g``/``beta`` [n, H_v], ``state``
    [seqs, H_v, S_v, S_k] (updated), ``out`` [n, H_v, S_v]:
    ``S *= exp(g)``, ``d = (v - S k) * beta``, ``S += d k^T``, ``o = S q / sqrt(S_v)``."""
    n, h_k, s_k = q.shape
    h_v, s_v = v.shape[1], v.shape[2]
    scale = _F32(1.0) / np.sqrt(_F32(s_v))
    for t in range(n):
        for h in range(h_v):
            S = state[rows[t], h]
            kh = h % h_k
            decay = _F32(np.exp(g[t, h]))
            for j in range(s_v):
                dot = _F32(0.0)
                for i in range(s_k):
                    S[j, i] *= decay
                    dot += S[j, i] * k[t, kh, i]
                d = (v[t, h, j] - dot) * beta[t, h]
                o = _F32(0.0)
                for i in range(s_k):
                    S[j, i] += d * k[t, kh, i]
                    o += S[j, i] * q[t, kh, i]
                out[t, h, j] = o * scale
