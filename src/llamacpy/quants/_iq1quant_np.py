"""Vectorized numpy twins of the IQ1_S and IQ1_M quantizers of :mod:`._iq1quant`: the same
float32 arithmetic in the same order over every group of a call at once (loops run over a
group's elements and the candidate splits, never over groups; only the rare groups holding
a NaN are sorted, or scanned against the whole grid, one at a time).
"""

from __future__ import annotations

import numpy as np

from llamacpy.quants._errors import QuantError
from llamacpy.quants._helpers import (
    F0,
    F1,
    F32,
    as_imatrix,
    as_rows,
    fp32_to_fp16_np,
    nearest_int_np,
    out_shape,
)
from llamacpy.quants._iq1quant import X_M, X_P
from llamacpy.quants._iq2quant_np import (
    FLT_MAX,
    best_neighbour_np,
    codes_np,
    neighbour_lists,
    raise_aborted,
)
from llamacpy.quants._iqgrid import QK
from llamacpy.quants._search_np import seqsum

_XX = np.stack([X_P, X_M])  # row 1: delta < 0
_HALF = F32(0.5)
_15 = F32(15.0)
_NGRID = 2048


def _merge_order(v: np.ndarray) -> np.ndarray:
    """glibc's merge sort of ``v`` (a power-of-two length) by ggml's comparator, NaN equal
    to everything: the indices in sorted order."""
    idx = list(range(v.size))
    width = 1
    while width < v.size:
        merged = []
        for lo in range(0, v.size, 2 * width):
            a, b = idx[lo : lo + width], idx[lo + width : lo + 2 * width]
            while a and b:
                merged.append(b.pop(0) if v[a[0]] > v[b[0]] else a.pop(0))
            merged += a + b
        idx = merged
        width *= 2
    return np.array(idx, np.int64)


def sort_order_np(x: np.ndarray) -> np.ndarray:
    """Per row of ``x`` (G, n): the indices as glibc's ``qsort`` orders them (a stable sort:
    numpy's where there is no NaN)."""
    order = np.argsort(x, axis=1, kind="stable")
    for r in np.flatnonzero(np.isnan(x).any(axis=1)):
        order[r] = _merge_order(x[r])
    return order


def _weights_np(x, qw, sigma2):
    """The weights of groups ``x`` (G, n) and their largest ``|x|`` (C's ``MAX`` order)."""
    weight = x * x if qw is None else qw * np.sqrt(sigma2[:, None] + x * x)
    ax = np.abs(x)
    mx = ax[:, 0]
    for i in range(1, x.shape[1]):
        mx = np.where(mx > ax[:, i], mx, ax[:, i])
    return weight, mx


def _prefix(t: np.ndarray, take: np.ndarray | None = None) -> np.ndarray:
    """``s[:, j + 1] = s[:, j] + t[:, j]`` (only where ``take``), ``s[:, 0] = 0``."""
    s = np.zeros((t.shape[0], t.shape[1] + 1), np.float32)
    for j in range(t.shape[1]):
        s[:, j + 1] = (
            s[:, j] + t[:, j] if take is None else np.where(take[:, j], s[:, j] + t[:, j], s[:, j])
        )
    return s


def _pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    i1, i2 = np.triu_indices(n + 1)
    return i1, i2


def _select(sqx: list, sq2: list, shape) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The sequential best of the candidates (C's ``sumqx^2 > best * sumq2``): ``(scale,
    candidate, found)``; ``sqx[c]``, ``sq2[c]`` are (G,) arrays in C's order."""
    best = np.full(shape, -FLT_MAX, np.float32)
    scale = np.zeros(shape, np.float32)
    pick = np.full(shape, -1, np.int64)
    for c, (qx, q2) in enumerate(zip(sqx, sq2, strict=True)):
        upd = (q2 > F0) & (qx * qx > best * q2)
        fit = qx / q2
        scale = np.where(upd, fit, scale)
        best = np.where(upd, fit * qx, best)
        pick = np.where(upd, c, pick)
    return scale, pick, pick >= 0


def _split_s_np(x, weight, order):
    """IQ1_S's split search: ``(scale, i1, i2, shift, found)`` per group of 32."""
    wx = np.take_along_axis(weight * x, order, axis=1)
    sumx, sumw = _prefix(wx), _prefix(np.take_along_axis(weight, order, axis=1))
    i1, i2 = _pairs(32)
    a, b, c = sumx[:, i1] - sumx[:, :1], sumx[:, i2] - sumx[:, i1], sumx[:, 32:] - sumx[:, i2]
    wa, wb, wc = sumw[:, i1] - sumw[:, :1], sumw[:, i2] - sumw[:, i1], sumw[:, 32:] - sumw[:, i2]
    sqx, sq2 = [], []
    for xx in (X_P, X_M):
        sqx.append(a * xx[0] + b * xx[1] + c * xx[2])
        sq2.append(wa * xx[0] * xx[0] + wb * xx[1] * xx[1] + wc * xx[2] * xx[2])
    n = i1.size  # candidates in C's order: pair 0 (+), pair 0 (-), pair 1 (+), ...
    cand_x = [sqx[s][:, p] for p in range(n) for s in (0, 1)]
    cand_2 = [sq2[s][:, p] for p in range(n) for s in (0, 1)]
    scale, pick, found = _select(cand_x, cand_2, x.shape[0])
    p = np.maximum(pick, 0) // 2
    return scale, i1[p], i2[p], np.where(pick % 2 == 0, 1, -1), found


def _split_m_np(x, weight, order):
    """IQ1_M's split search: ``(scale, i1, i2, k, found)`` per group of 16 (``k``: 2 * (first
    half shifted down) + (second half shifted down))."""
    wx = np.take_along_axis(weight * x, order, axis=1)
    ws = np.take_along_axis(weight, order, axis=1)
    second = order >= 8
    px = [_prefix(wx, ~second), _prefix(wx, second)]
    pw = [_prefix(ws, ~second), _prefix(ws, second)]
    p2, m2 = X_P[2], X_M[2]
    cp1, cp2 = X_P[0] * X_P[0] - X_P[1] * X_P[1], X_P[1] * X_P[1] - X_P[2] * X_P[2]
    cm1, cm2 = X_M[0] * X_M[0] - X_M[1] * X_M[1], X_M[1] * X_M[1] - X_M[2] * X_M[2]
    i1, i2 = _pairs(16)
    qx, q2 = [], []  # per half: [plus, minus]
    for h in range(2):
        sx = px[h][:, i1] + px[h][:, i2]
        t, w = px[h][:, 16:], pw[h][:, 16:]
        qx.append((t * p2 - sx, t * m2 - sx))
        q2.append((
            w * p2 * p2 + pw[h][:, i1] * cp1 + pw[h][:, i2] * cp2,
            w * m2 * m2 + pw[h][:, i1] * cm1 + pw[h][:, i2] * cm2,
        ))  # fmt: skip
    cand_x, cand_2 = [], []
    for p in range(i1.size):
        for k in range(4):
            cand_x.append(qx[0][k >> 1][:, p] + qx[1][k & 1][:, p])
            cand_2.append(q2[0][k >> 1][:, p] + q2[1][k & 1][:, p])
    scale, pick, found = _select(cand_x, cand_2, x.shape[0])
    p = np.maximum(pick, 0) // 4
    return scale, i1[p], i2[p], np.maximum(pick, 0) % 4, found


def _fallback(xflat, o, w, scale, xx, levels):
    """ggml's full-grid scan of ``iq1_find_best_neighbour2`` for one group at ``xflat[o:]``
    (each point compared with one element ``xflat[o + point]``); -1 where nothing fits or
    the scan reads past the input."""
    if o + _NGRID > xflat.size:
        return -1
    q = xx[levels]  # (2048, 8)
    d2 = np.zeros(_NGRID, np.float32)
    for i in range(8):
        diff = scale * q[:, i] - xflat[o : o + _NGRID]
        d2 = d2 + w[i] * diff * diff
    ok = d2 < FLT_MAX
    return int(np.argmin(np.where(ok, d2, np.inf))) if ok.any() else -1


def _to_grid_np(tab, xflat, go, x, weight, scale, down, L):
    """Grid indices (G, n / 8) of the levels (neighbours where off the grid), the refitted
    scale and the groups ggml aborts on; ``down`` (G, n / 8): the group uses ``X_M``;
    ``go``: the groups' offsets in ``xflat``."""
    levels, kmap = tab[0], tab[2]
    G, n = x.shape
    x8, w8 = x.reshape(G, -1, 8), weight.reshape(G, -1, 8)
    u = codes_np(L.reshape(G, -1, 8))
    g = kmap[u]
    off = g < 0
    sidx = np.broadcast_to(down, u.shape)[off].astype(np.int64)
    s = np.broadcast_to(scale[:, None], u.shape)[off]
    gi = best_neighbour_np(tab, u[off], x8[off], w8[off], s,
                           lambda p: _XX[sidx[:, None, None], levels[p]])  # fmt: skip
    goff = (go[:, None] + 8 * np.arange(n // 8))[off]
    for j in np.flatnonzero(gi < 0):
        gi[j] = _fallback(xflat, goff[j], w8[off][j], s[j], _XX[sidx[j]], levels)
    g[off] = gi
    bad = (g < 0).any(axis=1)
    idx = np.maximum(g, 0)
    q = _XX[down[..., None].astype(np.int64), levels[idx]].reshape(G, n)
    sumqx, sumq2 = seqsum(weight * q * x), seqsum(weight * q * q)
    refit = off.any(axis=1) & (sumqx > F0) & (sumq2 > F0)
    return idx, np.where(refit, sumqx / sumq2, scale), bad


def _groups(kind, tab, xflat, go, x, qw, sigma2):
    """Every group: ``(scale, index, shift, skip, bad)`` (IQ1_S: ``shift`` -1/1; IQ1_M: 0..3)."""
    n = x.shape[1]
    weight, mx = _weights_np(x, qw, sigma2)
    order = sort_order_np(x)
    if kind == 0:
        scale, i1, i2, shift, found = _split_s_np(x, weight, order)
    else:
        scale, i1, i2, shift, found = _split_m_np(x, weight, order)
    skip = (mx < (F32(1e-12) if kind == 0 else F32(1e-7))) | ~found
    j = np.arange(n)
    Ls = (j >= i1[:, None]).astype(np.int64) + (j >= i2[:, None])
    L = np.empty_like(Ls)
    np.put_along_axis(L, order, Ls, axis=1)
    neg = scale < F0
    L = np.where(neg[:, None], 2 - L, L)
    scale = np.where(neg, -scale, scale)
    if kind == 0:
        shift = np.where(neg, -shift, shift)
        down = np.broadcast_to((shift == -1)[:, None], (x.shape[0], 4))
    else:
        shift = np.where(neg, 3 - shift, shift)
        down = np.stack([shift >= 2, shift % 2 == 1], axis=1)
    index, scale, bad = _to_grid_np(tab, xflat, go, x, weight, scale, down, L)
    bad |= ~(scale >= F0)
    return scale, index, shift, skip, ~skip & bad, weight


def _blocks_np(kind, xflat, nrows, n_per_row, qw):
    """All super-blocks of the rows ``xflat`` -> (bytes (nb, type size), aborted (nb))."""
    tab = neighbour_lists("iq1s_grid")
    x = xflat.reshape(-1, QK)
    nb = x.shape[0]
    n = 32 if kind == 0 else 16
    sigma2 = F32(2.0) * seqsum(x * x) / F32(QK)
    g = x.reshape(-1, n)
    w = None if qw is None else qw.reshape(-1, n)
    go = np.arange(g.shape[0]) * n
    scale, index, shift, skip, bad, weight = _groups(
        kind, tab, xflat, go, g, w, np.repeat(sigma2, QK // n)
    )
    scale = np.where(skip, F0, scale).reshape(nb, -1)
    index = np.where(skip[:, None], 0, index).reshape(nb, -1)
    shift = np.where(skip, 1 if kind == 0 else 0, shift).reshape(nb, -1)
    max_scale = np.zeros(nb, np.float32)
    for ib in range(scale.shape[1]):
        max_scale = np.where(max_scale > scale[:, ib], max_scale, scale[:, ib])
    d = max_scale / _15
    live = max_scale != F0
    ls = np.clip(nearest_int_np(_HALF * ((F1 / d)[:, None] * scale - F1)), 0, 7).astype(np.int64)
    if kind == 0:
        out = _assemble_s(nb, d, index, shift, ls, live)
    else:
        out = _assemble_m(tab, x, weight.reshape(nb, QK), d, index, shift, ls, live)
    return out, bad.reshape(nb, -1).any(axis=1)


def _assemble_s(nb, d, index, shift, ls, live):
    dbits = np.where(live, fp32_to_fp16_np(d * F32(1.125)), 0).astype(np.int64)
    h = ((index >> 8) << (3 * (np.arange(32) % 4))).reshape(nb, 8, 4).sum(axis=2)
    h = h | np.where(live[:, None], (ls | np.where(shift == -1, 8, 0)) << 12, 0)
    qh = h.astype("<u2").view(np.uint8).reshape(nb, 16)
    return np.concatenate([np.stack([dbits & 255, dbits >> 8], 1), index & 255, qh], axis=1).astype(
        np.uint8
    )


def _assemble_m(tab, x, weight, d, index, shift, ls, live):
    """IQ1_M's bytes, with the super-block ``d`` refitted over its 256 weights."""
    nb = x.shape[0]
    levels = tab[0]
    qh = (index[:, 0::2] >> 8) | ((index[:, 1::2] >> 8) << 4)  # (nb, 16)
    mask = np.where(shift & 1, 0x80, 0) | np.where(shift & 2, 0x08, 0)
    qh = np.where(live[:, None], qh | mask, qh)
    down = np.stack([shift >= 2, shift % 2 == 1], axis=2).reshape(nb, 32)
    q = _XX[down[..., None].astype(np.int64), levels[index]].reshape(nb, 16, 16)
    q = (q * (2 * ls + 1).astype(np.float32)[..., None]).reshape(nb, QK)
    sumqx, sumq2 = seqsum(weight * q * x), seqsum(weight * q * q)
    d = np.where(sumq2 > F0, sumqx / sumq2, d)
    s = fp32_to_fp16_np(d * F32(1.1125)).astype(np.int64)
    sc = (ls << (3 * (np.arange(16) % 4))).reshape(nb, 4, 4).sum(axis=2)
    sc = sc | (((s[:, None] >> (4 * np.arange(4))) & 0xF) << 12)
    sc = np.where(live[:, None], sc, 0).astype("<u2").view(np.uint8).reshape(nb, 8)
    return np.concatenate([index & 255, qh, sc], axis=1).astype(np.uint8)


def quantize_np(kind: int, x, imatrix, name: str, type_size: int) -> np.ndarray:
    """Vectorized twin of :func:`._iq1quant.quantize`."""
    rows = np.array(as_rows(x, QK, name))
    if imatrix is None and kind == 0:
        raise QuantError(f"{name}: quantizing needs an importance matrix (imatrix)")
    qw = None
    if imatrix is not None:
        v, per = as_imatrix(imatrix, rows, name)
        qw = np.repeat(v, per, axis=0).reshape(-1)
    with np.errstate(all="ignore"):  # inf/NaN intermediates are part of ggml's arithmetic
        out, bad = _blocks_np(kind, rows.reshape(-1), *rows.shape, qw)
    raise_aborted(bad, rows.shape[1], name)
    return out.reshape(out_shape(np.shape(x), QK, type_size))
