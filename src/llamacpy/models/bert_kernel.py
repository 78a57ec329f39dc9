"""Compiled pieces of the ``bert`` encoder: embedding-row gathers and a threaded linear layer
over repacked weights (every format of :mod:`llamacpy.ops.matmul`)."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..ops.attention import KV_F16, TILE, attention_rows, attention_tiled, store_row
from ..ops.dequant import get_row
from ..ops.matmul import matmul_sel
from ..ops.threads import split


@njit(cache=True)
def gather_rows(W, off, wtype, ncols, rows, out):
    """``out[i, :ncols] = W[rows[i], :]`` (dequantized rows of a repacked matrix)."""
    for i in range(len(rows)):
        get_row(W, off, wtype, ncols, rows[i], out[i])


@njit(cache=True, parallel=True)
def linear(fset, n_threads, W, desc, A, n, out):
    """``out[:n, :nrows] = act(x) . W^T`` for the matrix ``desc``; the activations ``A`` were
    prepared with :func:`llamacpy.ops.matmul.prepare_acts`. Row groups are split over threads."""
    a0, a1, a2, a3, a4, a5, a6, a7 = A
    ng = (desc[2] + 15) // 16
    for tid in prange(n_threads):
        g0, g1 = split(ng, np.int64(tid), n_threads)
        matmul_sel(fset, W, desc, (a0, a1, a2, a3, a4, a5, a6, a7), 0, n, g0, g1, out, 0, False)


_NO_ORDER = np.zeros(0, np.int32)  # cells in cell order
_NO_SINKS = np.zeros(0, np.float32)  # no attention sinks


@njit(cache=True, parallel=True)
def attention(n_threads, n, n_head, hd, scale, Q, K, V, mask, ATT, kc, vc, TS):
    """Non-causal attention of ``n`` tokens with ggml's flash-attention numerics: K and V go
    through an f16 "cache" of the ubatch itself (``kc``/``vc``: ``[n_head, n, 2*hd]`` bytes,
    flat), then every (token, head) row attends the cells ``mask`` allows (its sequence);
    ubatches of 64 tokens and more take ggml's tiled path. ``TS``: per-thread scratch."""
    qv, qq, vbuf, res, kt, vt, pt, st = TS
    rowb = 2 * hd
    hstride = n * rowb
    for tid in prange(n_threads):
        t0, t1 = split(n, np.int64(tid), n_threads)
        for t in range(t0, t1):
            for h in range(n_head):
                o = h * hstride + t * rowb
                store_row(K[t], h * hd, hd, KV_F16, kc, o)
                store_row(V[t], h * hd, hd, KV_F16, vc, o)
    for tid in prange(n_threads):
        i = np.int64(tid)
        if n < TILE:
            attention_rows(i, n_threads, n, n, n_head, 1, hd, scale, KV_F16, KV_F16, rowb, Q,
                           kc, vc, 0, hstride, mask, _NO_ORDER, ATT, qv[i], qq[i], vbuf[i],
                           res[i], _NO_SINKS)  # fmt: skip
        else:
            attention_tiled(i, n_threads, n, n, n_head, 1, hd, scale, KV_F16, KV_F16, rowb, Q,
                            kc, vc,
                            0, hstride, mask, ATT, kt[i], vt[i], pt[i], st[i],
                            _NO_SINKS)  # fmt: skip
