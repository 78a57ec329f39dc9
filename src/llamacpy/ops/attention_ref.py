"""Numpy twins of :mod:`.attention`: cache rows and ggml's flash-attention numerics."""

from __future__ import annotations

import ctypes
import ctypes.util

import numpy as np

from .activations import exp_ggml_numpy
from .attention import KV_F16, KV_F32, TILE, k_rotation, v_rotation

_F32 = np.float32
MODE_ROWS, MODE_TILED, MODE_SPLIT = 0, 1, 2


def _hsum16(x: np.ndarray) -> np.float32:
    """16 lanes summed in _mm512_reduce_add_ps order."""
    a = (x[:8] + x[8:]).astype(_F32)
    b = (a[:4] + a[4:]).astype(_F32)
    c = (b[:2] + b[2:]).astype(_F32)
    return _F32(c[0] + c[1])


def fwht_numpy(x: np.ndarray, n: int) -> np.ndarray:
    """Twin of :func:`.attention.fwht`: the last axis in chunks of ``n``, rotated."""
    y = x.astype(_F32).reshape(-1, n) * (_F32(1.0) / np.sqrt(_F32(n)))
    w = 1
    while w < n:
        z = y.reshape(len(y), n // (2 * w), 2, w)
        u, v = z[:, :, 0].copy(), z[:, :, 1].copy()
        z[:, :, 0], z[:, :, 1] = u + v, u - v
        w *= 2
    return y.reshape(x.shape)


def rotations(k_type: int, v_type: int, d: int) -> tuple[int, int]:
    """(k rotation, v rotation) of heads of ``d`` in caches of these types (0: none)."""
    return int(k_rotation(k_type, d)), int(v_rotation(v_type, d))


def store_row_numpy(row: np.ndarray, x: np.ndarray, t: int) -> None:
    if t == KV_F32:
        row[: 4 * len(x)] = x.astype(_F32).view(np.uint8)
    elif t == KV_F16:
        row[: 2 * len(x)] = x.astype(np.float16).view(np.uint8)
    else:
        blocks = x.astype(_F32).reshape(-1, 32)
        amax = np.abs(blocks).max(-1)
        with np.errstate(divide="ignore"):
            inv = np.where(amax != 0, _F32(127.0) / amax, _F32(0.0)).astype(_F32)
        q = np.rint(blocks * inv[:, None]).astype(np.int8)
        out = np.zeros((len(blocks), 34), np.uint8)
        out[:, :2] = (amax / _F32(127.0)).astype(np.float16).view(np.uint8).reshape(-1, 2)
        out[:, 2:] = q.view(np.uint8)
        row[: out.size] = out.reshape(-1)


def load_rows_numpy(rows: np.ndarray, d: int, t: int) -> np.ndarray:
    if t == KV_F32:
        return np.ascontiguousarray(rows[:, : 4 * d]).view(_F32)
    if t == KV_F16:
        return np.ascontiguousarray(rows[:, : 2 * d]).view(np.float16).astype(_F32)
    b = np.ascontiguousarray(rows[:, : d // 32 * 34]).reshape(len(rows), d // 32, 34)
    scale = b[..., :2].copy().view(np.float16).astype(_F32)
    return (b[..., 2:].view(np.int8).astype(_F32) * scale).reshape(len(rows), d)


def _ggml_dot(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    """q [..., d] . k [..., d] in ggml_vec_dot_f16/f32's order (4 x 16 lanes per 64, tree
    reduction; leftovers summed in double)."""
    d = q.shape[-1]
    n64 = d - d % 64
    acc = np.zeros((*np.broadcast_shapes(q.shape, k.shape)[:-1], 4, 16), np.float64)
    for i in range(0, n64, 64):
        p = (q[..., i : i + 64].astype(np.float64) * k[..., i : i + 64]).reshape(*acc.shape)
        acc = (acc + p).astype(_F32).astype(np.float64)  # fma rounding
    lanes = (
        (acc[..., 0, :] + acc[..., 2, :]).astype(_F32)
        + (acc[..., 1, :] + acc[..., 3, :]).astype(_F32)
    ).astype(_F32)
    a = (lanes[..., :8] + lanes[..., 8:]).astype(_F32)
    b = (a[..., :4] + a[..., 4:]).astype(_F32)
    c = (b[..., :2] + b[..., 2:]).astype(_F32)
    s = (c[..., 0] + c[..., 1]).astype(_F32).astype(np.float64)
    for i in range(n64, d):
        s = s + (q[..., i] * k[..., i]).astype(_F32)
    return s.astype(_F32)


def attention_numpy(
    q, keys, vals, mask, k_type, v_type, mode, n_threads, scale, sinks=None, softcap=0.0
):
    """Twin of the attention drivers: ``q`` [n, nh, d], ``keys``/``vals`` [nkv, n_kv, d] (the
    cache rows as f32), ``mask`` [n, n_kv]; ``mode`` 0 rows, 1 tiled, 2 decode split in
    ``n_threads`` chunks; ``sinks``: per-head attention sinks (None: none); ``softcap`` != 0:
    scores ``softcap * tanh(s * (scale / softcap))``."""
    n, nh, d = q.shape
    cap = _F32(softcap)
    if cap != 0:
        scale = _F32(scale) / cap
    g = nh // keys.shape[0]
    if k_type == KV_F32:  # an f32 cache is cast to f16 before flash attention
        keys, k_type = keys.astype(np.float16).astype(_F32), KV_F16
    if v_type == KV_F32:
        vals, v_type = vals.astype(np.float16).astype(_F32), KV_F16
    out = np.zeros((n, nh, d), _F32)
    if mode == MODE_TILED:
        for t in range(n):
            for h in range(nh):
                m, s, acc = _tiled_row(q[t, h], keys[h // g], vals[h // g], mask[t], scale, cap)
                m, s, acc = _sink(sinks, h, m, s, acc)
                out[t, h] = acc * (_F32(1.0) / s if s != 0 else _F32(0.0))
        return out
    if k_type == KV_F16:
        qd = q.astype(np.float16).astype(_F32)
    else:  # the query quantized to q8_0 (ggml's K dot type for a q8_0 cache)
        b = q.astype(_F32).reshape(*q.shape[:-1], -1, 32)
        amax = np.abs(b).max(-1, keepdims=True)
        with np.errstate(divide="ignore"):
            inv = np.where(amax != 0, _F32(127.0) / amax, _F32(0.0)).astype(_F32)
        d = (amax / _F32(127.0)).astype(np.float16).astype(_F32)
        qd = (np.rint(b * inv) * d).astype(_F32).reshape(q.shape)
    n_kv = mask.shape[1]
    chunks = [(0, n_kv)]
    if mode == MODE_SPLIT:
        cs = -(-n_kv // n_threads)
        chunks = [(min(i * cs, n_kv), min((i + 1) * cs, n_kv)) for i in range(n_threads)]
    for t in range(n):
        for h in range(nh):
            parts = [
                _row(qd[t, h], keys[h // g], vals[h // g], mask[t], a, b, scale, v_type, cap)
                for a, b in chunks
            ]
            parts[0] = _sink(sinks, h, *parts[0])
            if len(parts) == 1:
                _m, s, acc = parts[0]
                out[t, h] = acc * (_F32(1.0) / s if s != 0 else _F32(0.0))
            else:
                out[t, h] = _merge(parts, d)
    return out


_LIBM = ctypes.CDLL(ctypes.util.find_library("m"))
_LIBM.tanhf.restype, _LIBM.tanhf.argtypes = ctypes.c_float, [ctypes.c_float]
# the C library's tanhf, as ggml and the compiled kernels call it (numpy's float32 tanh may
# differ by an ulp, and an ulp decides which branch of the online softmax a score takes)
_tanhf = np.frompyfunc(lambda x: _F32(_LIBM.tanhf(float(x))), 1, 1)


def _capped(s, cap):
    """``cap * tanhf(s)`` in float32 (``s`` as is without a cap)."""
    if cap == 0:
        return s
    return (np.asarray(_tanhf(s), _F32) * cap).astype(_F32)


def _row(q, keys, vals, mask, a, b, scale, v_type, cap):
    m, s, acc = _F32(-np.inf), _F32(0.0), np.zeros(q.shape[-1], _F32)
    for c in range(a, b):
        if not mask[c]:
            continue
        sc = _F32(_capped(_ggml_dot(q, keys[c]) * scale, cap))
        ms, vs = _F32(1.0), _F32(1.0)
        if sc > m:
            ms = _F32(np.exp(np.float64(m - sc)))
            m = sc
            acc = acc * ms
            if v_type == KV_F16:
                acc = acc.astype(np.float16).astype(_F32)
        else:
            vs = _F32(np.exp(np.float64(sc - m)))
        acc = (vals[c].astype(np.float64) * vs + acc).astype(_F32)
        if v_type == KV_F16:
            acc = acc.astype(np.float16).astype(_F32)
        s = _F32(np.float64(s) * ms + vs)
    return m, s, acc


def _sink(sinks, h, m, s, acc):
    """(M, S, acc) with head ``h``'s sink as one more score of no value (ggml's order)."""
    if sinks is None:
        return m, s, acc
    sink = _F32(sinks[h])
    if sink > m:
        ms = _F32(np.exp(np.float64(m - sink)))
        return sink, _F32(np.float64(s) * ms + 1.0), (acc * ms).astype(_F32)
    return m, _F32(np.float64(s) + np.float64(_F32(np.exp(np.float64(sink - m))))), acc


def _merge(parts, d):
    m_f, s_f, acc = _F32(-np.inf), _F32(0.0), np.zeros(d, _F32)
    for m, s, a in parts:
        if s == 0:
            continue
        mn = max(m_f, m)
        so, sn = _F32(np.exp(np.float64(m_f - mn))), _F32(np.exp(np.float64(m - mn)))
        acc = (acc.astype(np.float64) * so + (a * sn).astype(_F32)).astype(_F32)
        s_f, m_f = _F32(np.float64(s_f) * so + _F32(s * sn)), mn
    return acc * (_F32(1.0) / s_f)


def _tiled_row(q, keys, vals, mask, scale, cap):
    m, s, acc = _F32(-np.inf), _F32(0.0), np.zeros(q.shape[-1], _F32)
    for c0 in range(0, mask.shape[0], TILE):
        c1 = min(c0 + TILE, mask.shape[0])
        if not mask[c0:c1].any():
            continue
        kq = (keys[c0:c1].astype(np.float64) @ q.astype(np.float64)).astype(_F32) * scale
        kq = _capped(kq, cap)
        kq = np.where(mask[c0:c1] != 0, kq, _F32(-np.inf))
        mn = max(m, kq.max())
        if mn > m:
            ms = _F32(np.exp(np.float64(m - mn)))
            acc, s = acc * ms, s * ms
        m = mn
        e = exp_ggml_numpy(np.pad(kq - m, (0, TILE - (c1 - c0)), constant_values=-np.inf))
        s = _F32(
            np.float64(s) + sum(np.float64(_hsum16(e[i : i + 16])) for i in range(0, TILE, 16))
        )
        acc = (acc + e[: c1 - c0].astype(np.float64) @ vals[c0:c1]).astype(_F32)
    return m, s, acc
