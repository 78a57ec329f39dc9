"""The numpy twins of Qwen3.5's Gated DeltaNet layer's steps (llama.cpp's
``src/models/qwen35.cpp`` and ``delta-net-base.cpp`` with ggml's CPU ops), which
:mod:`.reference`'s ``delta_net_*`` stages and the tests of :mod:`llamacpy.ops.delta_net` use.

A Gated DeltaNet layer, per token ``t`` of sequence state row ``r``:

* in-projections of the normed input: ``qkv = h . attn_qkv`` (the convolution's channels:
  keys of the queries, keys, values), the output gate ``z = h . attn_gate``,
  ``beta = sigmoid(h . ssm_beta)`` and the decay ``g = softplus(h . ssm_alpha + ssm_dt) *
  ssm_a`` (``ssm_a`` = -exp(A_log)), one per value head;
* the short causal convolution over the last ``d_conv`` inputs of each channel (the
  previous ``d_conv - 1`` held in the conv state row ``[channel, tap]``), then SiLU
  (:func:`conv1d_step`);
* q and k L2-normed per head (ggml: ``rms_norm(x, eps / n) / sqrt(n)``, :func:`l2_norm_numpy`);
* the gated delta rule on the state ``S`` of each value head (``[S_v, S_k]``, key heads
  broadcast tiled: value head ``h`` reads key head ``h % H_k`` as ggml does; qwen3next's
  value heads come grouped by key head, ``h`` reading ``h // (H_v / H_k)``):
  ``S *= exp(g)``, ``d = (v - S k) * beta``, ``S += d k^T``, ``o = S q / sqrt(S_v)``
  (:func:`delta_rule_step`);
* the gated RMS norm ``rms_norm(o) * ssm_norm * silu(z)`` per head and ``ssm_out``.
"""

from __future__ import annotations

import numpy as np

from ..ops.norm import rms_norm_numpy

_F32 = np.float32


def sigmoid_numpy(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, _F32)
    return (_F32(1.0) / (_F32(1.0) + np.exp(-x))).astype(_F32)


def softplus_numpy(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, _F32)
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20)))).astype(_F32)


def l2_norm_numpy(x: np.ndarray, eps: float) -> np.ndarray:
    """ggml's ``rms_norm(x, eps / n) * (1 / sqrt(n))`` over the last axis."""
    n = x.shape[-1]
    y = rms_norm_numpy(x, np.ones(n, _F32), _F32(eps) / _F32(n))
    return (y * (_F32(1.0) / np.sqrt(_F32(n)))).astype(_F32)


def conv1d_step(state: np.ndarray, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """One token through the causal convolution: ``state`` [channels, d_conv - 1] (updated
    in place), ``x`` [channels], ``w`` [channels, d_conv]; returns the channels' sums."""
    window = np.concatenate([state, x[:, None]], axis=1).astype(_F32)
    out = np.zeros(len(x), _F32)
    for i in range(w.shape[1]):  # ggml sums the taps in order, in float
        out = (out + window[:, i] * w[:, i]).astype(_F32)
    state[:] = window[:, 1:]
    return out


def delta_rule_step(S, q, k, v, g, beta, grouped: bool = False) -> np.ndarray:
    """One token of the gated delta rule on the states ``S`` [H_v, S_v, S_k] (updated in
    place): ``q``/``k`` [H_k, S_k], ``v`` [H_v, S_v], ``g``/``beta`` [H_v]; returns the
    output [H_v, S_v]. ``grouped`` (qwen3next): value head ``h`` reads key head ``h //
    (H_v / H_k)`` (llama.cpp repeats each key head over its value heads) instead of ``h %
    H_k``."""
    h_v, s_v, _ = S.shape
    h_k = q.shape[0]
    heads = np.arange(h_v)
    kh = heads // (h_v // h_k) if grouped else heads % h_k  # which key head each reads
    qq, kk = q[kh], k[kh]
    S *= np.exp(g.astype(_F32))[:, None, None]
    d = (v - np.einsum("hji,hi->hj", S, kk, dtype=_F32)) * beta[:, None]
    S += d[:, :, None] * kk[:, None, :]
    scale = _F32(1.0) / np.sqrt(_F32(s_v))
    return (np.einsum("hji,hi->hj", S, qq, dtype=_F32) * scale).astype(_F32)
