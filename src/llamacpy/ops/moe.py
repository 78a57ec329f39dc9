"""The router of a mixture-of-experts FFN with ggml's CPU numerics (llama.cpp's
``build_moe_ffn``): a softmax of the router logits in float32, the most probable experts,
their weights.

* :func:`softmax_ggml`: ``ggml_compute_forward_soft_max_f32`` on one row: the maximum, then
  ``ggml_vec_soft_max_f32`` (16 lanes at a time through ggml's vector ``exp``, each 16-lane
  sum added in double; the last ``n % 16`` values through ``expf``, added in double), then
  the row multiplied by ``(float) (1 / sum)``.
* :func:`top_k`: the ``k`` largest, largest first (``ggml_argsort`` descending, then the
  first ``k``; equal values: the lower index first).
* :func:`expert_weights`: llama.cpp's weight normalization: the sum of the selected
  probabilities in double rounded to float (``ggml_sum_rows``), clamped below at f16's
  smallest normal, each weight divided by it; then an optional scale.
* :func:`shared_gate`: a shared expert's gate ``sigmoid(h . w)`` with ``w`` a float32
  vector (qwen35moe's ``ffn_gate_inp_shexp``): the dot product as ggml's F32 matmul computes
  it on AVX-512 (llamafile's ``tinyBLAS``: one 16-lane fused multiply-add accumulator over
  the columns, reduced as ``_mm512_reduce_add_ps``), then ``1 / (1 + expf(-s))``. (Read
  from ``sgemm.cpp``; the tiny qwen35moe's logits do not tell it from ``ggml_vec_dot_f32``'s
  four accumulators.)

Each has a numpy twin (``*_numpy``) for :mod:`llamacpy.models.reference`.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..simd import vfma, vhsum, vload_f32, vsplat_f32, vstore_f32, vzero_f32
from .activations import exp_ggml_numpy, sigmoid, vexp_ggml

_F32 = np.float32
SUM_MIN = _F32(6.103515625e-5)  # the clamp of the weights' sum (smallest normal f16)


@njit(cache=True)
def softmax_ggml(x, n):
    """``x[:n] = softmax(x[:n])`` in place (see the module docstring)."""
    mx = _F32(-np.inf)
    for i in range(n):
        mx = max(mx, x[i])
    total = 0.0
    i = 0
    mv = vsplat_f32(mx)
    while i + 16 <= n:
        e = vexp_ggml(vload_f32(x, i) - mv)
        vstore_f32(x, i, e)
        total += np.float64(vhsum(e))
        i += 16
    while i < n:
        v = np.exp(x[i] - mx)
        x[i] = v
        total += np.float64(v)
        i += 1
    inv = _F32(1.0 / total)
    for i in range(n):
        x[i] = x[i] * inv


@njit(cache=True)
def top_k(p, n, k, sel, w):
    """``sel[:k]``: the indices of the ``k`` largest of ``p[:n]``, largest first (ties:
    lower index first); ``w[:k]``: their values."""
    for j in range(k):
        best = -1
        for i in range(n):
            taken = False
            for jj in range(j):
                if sel[jj] == i:
                    taken = True
            if not taken and (best < 0 or p[i] > p[best]):
                best = i
        sel[j] = best
        w[j] = p[best]


@njit(cache=True)
def expert_weights(w, k, norm, scale):
    """``w[:k] /= max(sum(w), SUM_MIN)`` when ``norm``; then ``w *= scale`` unless 0 or 1."""
    if norm != 0:
        total = 0.0
        for j in range(k):
            total += np.float64(w[j])
        s = max(_F32(total), SUM_MIN)
        for j in range(k):
            w[j] = w[j] / s
    if scale != 0.0 and scale != 1.0:
        for j in range(k):
            w[j] = w[j] * scale


@njit(cache=True)
def shared_gate(h, w, n):
    """``sigmoid(h[:n] . w[:n])`` (see the module docstring; ``n`` a multiple of 16)."""
    acc = vzero_f32()
    for i in range(0, n, 16):
        acc = vfma(vload_f32(w, i), vload_f32(h, i), acc)
    return sigmoid(vhsum(acc))


def shared_gate_numpy(h: np.ndarray, w: np.ndarray) -> np.ndarray:
    """:func:`shared_gate` of each row of ``h``: 16 lanes of fused multiply-adds (each
    product exact in float64, the sum rounded once to float32), then added in halves."""
    h, w = np.asarray(h, np.float64), np.asarray(w, np.float64)
    lanes = np.zeros((len(h), 16), _F32)
    for i in range(0, h.shape[1], 16):
        lanes = (lanes + h[:, i : i + 16] * w[i : i + 16]).astype(_F32)
    while lanes.shape[-1] > 1:
        half = lanes.shape[-1] // 2
        lanes = (lanes[..., :half] + lanes[..., half:]).astype(_F32)
    one = _F32(1.0)
    return (one / (one + np.exp(-lanes[..., 0]))).astype(_F32)


def softmax_ggml_numpy(x: np.ndarray) -> np.ndarray:
    """Rows of ``x`` through :func:`softmax_ggml`'s numerics."""
    x = np.asarray(x, _F32)
    n = x.shape[-1]
    d = (x - x.max(-1, keepdims=True)).astype(_F32)
    v = n // 16 * 16
    e = np.empty_like(d)
    e[..., :v] = exp_ggml_numpy(d[..., :v])
    e[..., v:] = np.exp(d[..., v:].astype(np.float64)).astype(_F32)  # expf, rounded
    total = np.zeros(x.shape[:-1], np.float64)
    for i in range(0, v, 16):
        s = e[..., i : i + 16]
        while s.shape[-1] > 1:  # the 16 lanes added in halves, in float32
            h = s.shape[-1] // 2
            s = (s[..., :h] + s[..., h:]).astype(_F32)
        total += s[..., 0].astype(np.float64)
    for i in range(v, n):
        total += e[..., i].astype(np.float64)
    return (e * (1.0 / total).astype(_F32)[..., None]).astype(_F32)


def route_numpy(probs: np.ndarray, k: int, norm: bool, scale: float):
    """(selected experts ``[n, k]``, largest first; their weights) of probability rows."""
    sel = np.argsort(-probs, axis=-1, kind="stable")[..., :k]
    w = np.take_along_axis(probs, sel, -1).astype(_F32)
    if norm:
        s = np.maximum(w.sum(-1, dtype=np.float64).astype(_F32), SUM_MIN)
        w = (w / s[..., None]).astype(_F32)
    if scale not in (0.0, 1.0):
        w = (w * _F32(scale)).astype(_F32)
    return sel, w
