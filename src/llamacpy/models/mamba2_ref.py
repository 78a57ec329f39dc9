"""The numpy twins of the Mamba-2 layer's steps (llama.cpp's ``build_mamba2_layer`` in
``src/models/mamba-base.cpp`` with ggml's CPU ``ssm_conv`` / ``ssm_scan``), which
:mod:`.reference`'s ``mamba2_*`` stages and the tests of :mod:`llamacpy.ops.ssm` use.

A Mamba-2 layer, per token ``t`` of sequence state row ``r``:

* ``z | xBC | dt = h . ssm_in`` (``d_inner``, ``d_inner + 2 n_group d_state``, ``n_head``);
* the causal depthwise convolution of ``xBC`` over the last ``d_conv`` inputs of each
  channel (the previous ``d_conv - 1`` in the conv state row), plus ``ssm_conv1d.bias``,
  then SiLU; ``x | B | C`` apart (``B``, ``C``: ``d_state`` per group);
* per head ``h`` (group ``h / (n_head / n_group)``): ``dt = softplus(dt + ssm_dt.bias)``,
  ``dA = exp(dt * A)`` (``ssm_a`` = -exp(A_log)), on each row ``i`` of the head's state ``S``
  ``[head_dim, d_state]``: ``S_i = S_i * dA + B * x_i * dt``, ``y_i = S_i . C + x_i * D``
  (:func:`scan_step`);
* ``y = silu(z) * y``, the grouped RMS norm (each ``d_inner / n_group`` slice normalized
  apart) times ``ssm_norm``, then ``ssm_out``.
"""

from __future__ import annotations

import numpy as np

_F32 = np.float32


def _fma(a, b, c):
    """``a * b + c`` rounded once (float64 holds the float32 product exactly)."""
    return (np.asarray(a, np.float64) * b + c).astype(_F32)


def softplus_ggml(x: np.ndarray) -> np.ndarray:
    """ggml's ``x > 20 ? x : logf(1 + expf(x))``."""
    x = np.asarray(x, _F32)
    with np.errstate(over="ignore"):
        sp = np.log((_F32(1.0) + np.exp(x)).astype(_F32)).astype(_F32)
    return np.where(x > _F32(20.0), x, sp).astype(_F32)


def conv_bias_step(state: np.ndarray, x: np.ndarray, w: np.ndarray, b: np.ndarray):
    """One token through the causal convolution and its bias: ``state`` [channels, d_conv -
    1] (updated in place), ``x`` [channels], ``w`` [channels, d_conv], ``b`` [channels]."""
    window = np.concatenate([state, x[:, None]], axis=1).astype(_F32)
    out = np.zeros(len(x), _F32)
    for i in range(w.shape[1]):  # ggml sums the taps in order, in float
        out = (out + window[:, i] * w[:, i]).astype(_F32)
    state[:] = window[:, 1:]
    return (out + b).astype(_F32)


def _row_dots(s: np.ndarray, c: np.ndarray) -> np.ndarray:
    """``s . c`` of every row of ``s`` [rows, n] as ggml's AVX-512 loop: lane ``l`` of
    accumulator ``j`` takes ``fma(s, c, acc)`` over elements ``64 k + 16 j + l``; the four
    accumulators added (0+2, 1+3, then 0+1), the lanes summed as a tree (halves); the
    leftovers past ``n & ~63`` added one by one."""
    rows, n = s.shape
    m = n & ~63
    total = np.zeros(rows, _F32)
    if m:
        acc = np.zeros((rows, 4, 16), _F32)
        for k in range(0, m, 64):
            blk = (slice(None), slice(k, k + 64))
            acc = _fma(s[blk].reshape(rows, 4, 16), c[k : k + 64].reshape(4, 16), acc)
        v = ((acc[:, 0] + acc[:, 2]).astype(_F32) + (acc[:, 1] + acc[:, 3])).astype(_F32)
        while v.shape[1] > 1:
            h = v.shape[1] // 2
            v = (v[:, :h] + v[:, h:]).astype(_F32)
        total = v[:, 0]
    for i in range(m, n):
        total = (total + s[:, i] * c[i]).astype(_F32)
    return total


def scan_step(S, x, dt, a, b, c, d) -> np.ndarray:
    """One token of the selective scan on the states ``S`` [n_head, head_dim, d_state]
    (updated in place): ``x`` [n_head, head_dim], ``dt`` (biased, before softplus), ``a``,
    ``d`` [n_head], ``b`` / ``c`` [n_group, d_state]; returns ``y`` [n_head, head_dim]."""
    n_head = S.shape[0]
    sp = softplus_ggml(dt)
    da = np.exp((sp * np.asarray(a, _F32)).astype(_F32)).astype(_F32)
    y = np.zeros(x.shape, _F32)
    per_group = n_head // len(b)
    for h in range(n_head):
        g = h // per_group
        xdt = (x[h] * sp[h]).astype(_F32)
        S[h] = ((S[h] * da[h]).astype(_F32) + (b[g][None, :] * xdt[:, None])).astype(_F32)
        y[h] = (_row_dots(S[h], c[g]) + (x[h] * d[h]).astype(_F32)).astype(_F32)
    return y
