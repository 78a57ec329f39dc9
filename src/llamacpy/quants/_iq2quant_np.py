"""Vectorized numpy twins of the IQ2_XXS, IQ2_XS and IQ2_S quantizers of
:mod:`._iq2quant`: the same float32 arithmetic in the same order, over every group of a call
at once (loops run over a group's elements and the trial scales, never over groups).
"""

from __future__ import annotations

from functools import cache

import numpy as np

from llamacpy.quants._errors import QuantError
from llamacpy.quants._helpers import (
    F0,
    F1,
    F32,
    GROUP_MAX_EPS,
    as_imatrix,
    as_rows,
    fp32_to_fp16_np,
    nearest_int_np,
    out_shape,
)
from llamacpy.quants._iq2quant import NCODES, NO_LIST, aborts_error, tables
from llamacpy.quants._iqgrid import QK
from llamacpy.quants._search_np import make_qp_quants_np, seqsum

FLT_MAX = F32(np.finfo(np.float32).max)
_HALF = F32(0.5)
_TENTH = F32(0.1)
_5 = F32(5.0)
_31 = F32(31.0)
_MAP_SIZE = 43692
_SHIFT8 = 2 * np.arange(8)


@cache
def neighbour_lists(name: str):
    """``(levels, values, kmap, row, lists, count)``: :func:`._iq2quant.tables` with the
    neighbour lists as rows of a matrix (``-1`` padded); ``row[u]`` is code ``u``'s row."""
    levels, values, kmap, neigh = tables(name)
    codes = np.flatnonzero((kmap < 0) & (kmap != NO_LIST))
    offs = -kmap[codes].astype(np.int64) - 1
    count = neigh[offs].astype(np.int64)
    lists = np.full((codes.size, int(count.max())), -1, np.int64)
    for r, (o, c) in enumerate(zip(offs, count, strict=True)):
        lists[r, :c] = neigh[o + 1 : o + 1 + c]
    row = np.full(NCODES, -1, np.int64)
    row[codes] = np.arange(codes.size)
    return levels.astype(np.int64), values, kmap.astype(np.int64), row, lists, count


def codes_np(L: np.ndarray) -> np.ndarray:
    """The uint16 codes of ``L[..., 8]`` (signed levels) as C builds them."""
    return np.bitwise_or.reduce(L.astype(np.int64) << _SHIFT8, axis=-1) & 0xFFFF


def best_neighbour_np(tab, u, xval, w, scale, q_of):
    """For codes ``u`` (M) off the grid, of 8 weights ``xval`` / ``w`` (M, 8) each: the
    neighbour with the least ``sum w * (scale * q - x)**2`` below FLT_MAX (first of equals),
    -1 where none; ``q_of(points)`` gives the candidates' values ``q``."""
    row, lists, count = tab[3], tab[4], tab[5]
    r = row[u]
    m = int(count[r].max()) if r.size else 0
    cand = lists[r, :m]
    valid = cand >= 0
    q = q_of(np.where(valid, cand, 0))  # (M, m, 8)
    d2 = np.zeros(cand.shape, np.float32)
    for i in range(8):
        diff = scale[:, None] * q[:, :, i] - xval[:, None, i]
        d2 = d2 + w[:, None, i] * diff * diff
    ok = valid & (d2 < FLT_MAX)
    j = np.argmin(np.where(ok, d2, np.inf), axis=1) if m else np.zeros(0, np.int64)
    pick = np.arange(u.size), j
    return np.where(ok[pick], cand[pick], -1) if m else np.full(u.size, -1)


def _round_np(tab, idv, scale, xval, waux, L_prev, on_prev, only_off):
    """:func:`._iq2quant._round` for every group: ``(L, on, bad)``."""
    levels, values, kmap = tab[0], tab[1], tab[2]
    G, n = xval.shape
    L = np.clip(nearest_int_np(_HALF * (idv[:, None] * xval - F1)), 0, 2).astype(np.int64)
    L = L.reshape(G, n // 8, 8)
    u = codes_np(L)
    g = kmap[u]
    active = ~on_prev if only_off else np.ones(u.shape, bool)
    off = active & (g < 0)
    s = np.broadcast_to(scale[:, None], u.shape)[off]
    gi = best_neighbour_np(
        tab, u[off], xval.reshape(G, -1, 8)[off], waux.reshape(G, -1, 8)[off], s,
        lambda p: values[p],
    )  # fmt: skip
    L[off] = np.where(gi[:, None] >= 0, levels[np.maximum(gi, 0)], L[off])
    bad = np.zeros(u.shape, bool)
    bad[off] = gi < 0
    if only_off:
        L = np.where(active[..., None], L, L_prev.reshape(L.shape))
        return L.reshape(G, n), on_prev, bad.any(axis=1)
    return L.reshape(G, n), g >= 0, bad.any(axis=1)


def _sums_np(weight, xval, L):
    q = (2 * L + 1).astype(np.float32)
    return seqsum(weight * xval * q), seqsum(weight * q * q)


def _search_np(tab, scale, first, last, base, weight, xval, waux, L, on):
    """:func:`._iq2quant._search` for every group: ``(scale, L, on, bad)``."""
    best = np.zeros(scale.shape, np.float32)
    bad = np.zeros(scale.shape, bool)
    for s in range(first, last + 1):
        idv = (_5 + F32(s) * _TENTH) / base
        Laux, on_aux, b = _round_np(tab, idv, F1 / idv, xval, waux, L, on, False)
        bad |= b
        sumqx, sumq2 = _sums_np(weight, xval, Laux)
        upd = (sumq2 > F0) & (sumqx * sumqx > best * sumq2)
        fit = sumqx / sumq2
        scale = np.where(upd, fit, scale)
        best = np.where(upd, fit * sumqx, best)
        L = np.where(upd[:, None], Laux, L)
        on = np.where(upd[:, None], on_aux, on)
    return scale, L, on, bad


def _prepare_np(x, qw, sigma2, iq2s):
    """Weights, their roots, magnitudes, sign fields (G, n / 8) and the largest magnitude of
    groups ``x`` (G, n); ``qw`` None: IQ2_S's weights without an importance matrix."""
    if qw is None:
        weight = F32(0.25) * sigma2[:, None] + x * x
    else:
        weight = qw * np.sqrt(sigma2[:, None] + x * x)
    neg = ~(x >= F0)
    xval = np.where(neg, -x, x)
    G, n = x.shape
    neg8 = neg.reshape(G, -1, 8)
    if not iq2s:  # an even number of signs per 8: flip the least important weight
        wxx = (weight * x * x).reshape(G, -1, 8)
        imin = np.zeros(neg8.shape[:2], np.int64)
        mn = wxx[..., 0]
        for i in range(1, 8):
            upd = wxx[..., i] < mn
            mn = np.where(upd, wxx[..., i], mn)
            imin = np.where(upd, i, imin)
        odd = neg8.sum(axis=2) % 2 == 1
        flip = odd[..., None] & (np.arange(8) == imin[..., None])
        xval = np.where(flip.reshape(G, n), -xval, xval)
        neg8 = neg8 ^ flip
    signs = (neg8.astype(np.int64) << np.arange(8)).sum(axis=2)
    mx = xval[:, 0]
    for i in range(1, n):
        mx = np.where(mx > xval[:, i], mx, xval[:, i])
    return weight, np.sqrt(weight), xval, signs if iq2s else signs & 127, mx


def _pack_np(tab, L, scale):
    """Grid indices of the levels (G, n / 8) and the groups ggml aborts on (off-grid codes,
    a NaN scale)."""
    u = codes_np(L.reshape(L.shape[0], -1, 8))
    g = np.where(u < _MAP_SIZE, tab[2][u], -1)
    return np.maximum(g, 0), (g < 0).any(axis=1) | ~(scale >= F0)


def _groups_xxs(tab, x, qw, sigma2):
    """Every group of 32: ``(scale, codes, signs, zero, bad)``."""
    weight, waux, xval, signs, mx = _prepare_np(x, qw, sigma2, False)
    zero = mx < GROUP_MAX_EPS
    scale, Lu = make_qp_quants_np(4, xval, weight)
    eff_max = scale * F32(3.0)
    zero |= eff_max <= F0
    L = np.where(Lu >= 128, Lu - 256, Lu)  # the uint8_t stores read as int8_t
    on = np.ones((x.shape[0], 4), bool)
    scale, L, on, bad = _search_np(tab, scale, -6, 6, eff_max, weight, xval, waux, L, on)
    pos = scale > F0
    L2, _, b2 = _round_np(tab, F1 / scale, scale, xval, waux, L, on, False)
    sumqx, sumq2 = _sums_np(weight, xval, L2)
    scale = np.where(pos, np.where(sumq2 > F0, sumqx / sumq2, scale), scale)
    L = np.where(pos[:, None], L2, L)
    bad |= pos & b2
    neg = scale < F0
    scale = np.where(neg, -scale, scale)
    signs = np.where(neg[:, None], ~signs & 127, signs)
    codes, b3 = _pack_np(tab, L, scale)
    return scale, codes, signs, zero, ~zero & (bad | b3)


def _groups16(tab, x, qw, sigma2, iq2s):
    """Every group of 16 (IQ2_XS, IQ2_S): ``(scale, codes, signs, zero, bad)``."""
    weight, waux, xval, signs, mx = _prepare_np(x, qw, sigma2, iq2s)
    zero = mx < (F32(1e-8) if iq2s else GROUP_MAX_EPS)
    L = np.zeros(x.shape, np.int64)
    on = np.ones((x.shape[0], 2), bool)
    scale, L, on, bad = _search_np(tab, mx / _5, -9, 9, mx, weight, xval, waux, L, on)
    need = ~on.all(axis=1) & (scale > F0)
    L2, _, b2 = _round_np(tab, F1 / scale, scale, xval, waux, L, on, True)
    sumqx, sumq2 = _sums_np(weight, xval, L2)
    scale = np.where(need, np.where(sumq2 > F0, sumqx / sumq2, scale), scale)
    L = np.where(need[:, None], L2, L)
    bad |= need & b2
    neg = scale < F0
    scale = np.where(neg, -scale, scale)
    signs = np.where(neg[:, None], ~signs & (255 if iq2s else 127), signs)
    codes, b3 = _pack_np(tab, L, scale)
    return scale, codes, signs, zero, ~zero & (bad | b3)


def _blocks_np(kind: int, x: np.ndarray, qw: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Super-blocks ``x`` (nb, 256) -> (bytes (nb, type size), aborted (nb))."""
    tab = neighbour_lists(("iq2xxs_grid", "iq2xs_grid", "iq2s_grid")[kind])
    nb = x.shape[0]
    n = 32 if kind == 0 else 16
    sumx2 = seqsum(x * x)
    sigma2 = (F32(2.0) * sumx2 if kind == 2 else sumx2) / F32(QK)
    rep = np.repeat(sigma2, QK // n)
    g = x.reshape(-1, n)
    w = None if qw is None else qw.reshape(-1, n)
    if kind == 0:
        scale, codes, signs, zero, bad = _groups_xxs(tab, g, w, rep)
    else:
        scale, codes, signs, zero, bad = _groups16(tab, g, w, rep, kind == 2)
    scale = np.where(zero, F0, scale).reshape(nb, -1)
    codes = np.where(zero[:, None], 0, codes).reshape(nb, -1)
    signs = np.where(zero[:, None], 0, signs).reshape(nb, -1)
    max_scale = np.zeros(nb, np.float32)
    for ib in range(scale.shape[1]):
        max_scale = np.where(max_scale > scale[:, ib], max_scale, scale[:, ib])
    d = max_scale / _31
    ls = np.clip(nearest_int_np(_HALF * ((F1 / d)[:, None] * scale - F1)), 0, 15)
    live = max_scale != F0
    ls = np.where(live[:, None], ls, 0).astype(np.int64)
    dbits = np.where(live, fp32_to_fp16_np(d * F32(0.9875) if kind == 2 else d), 0)
    out = _assemble(kind, nb, dbits, codes, signs, ls, live)
    return out, bad.reshape(nb, -1).any(axis=1)


def _assemble(kind, nb, dbits, codes, signs, ls, live):
    """The blocks' bytes from their fields (IQ2_S keeps its indices where ``live`` is not)."""
    if kind == 0:
        q2 = np.zeros((nb, 16), np.int64)
        k4 = np.arange(32) % 4
        q2[:, 0::2] = (codes << (8 * k4)).reshape(nb, 8, 4).sum(axis=2)
        q2[:, 1::2] = (signs << (7 * k4)).reshape(nb, 8, 4).sum(axis=2) | (ls << 28)
        q2 = np.where(live[:, None], q2, 0)
        body = q2.astype("<u4").view(np.uint8).reshape(nb, -1)
    elif kind == 1:
        qs = np.where(live[:, None], codes | (signs << 9), 0).astype("<u2")
        sc = ls[:, 0::2] | (ls[:, 1::2] << 4)
        body = np.concatenate([qs.view(np.uint8).reshape(nb, -1), sc], axis=1)
    else:
        qh = ((codes >> 8) << (2 * (np.arange(32) % 4))).reshape(nb, 8, 4).sum(axis=2)
        sc = ls[:, 0::2] | (ls[:, 1::2] << 4)
        body = np.concatenate([codes & 255, signs, qh, sc], axis=1)
    d = np.asarray(dbits, np.int64)
    return np.concatenate([np.stack([d & 255, d >> 8], axis=1), body], axis=1).astype(np.uint8)


def quantize_np(kind: int, x, imatrix, name: str, type_size: int) -> np.ndarray:
    """Vectorized twin of :func:`._iq2quant.quantize`."""
    rows = np.array(as_rows(x, QK, name))
    if imatrix is None and kind != 2:
        raise QuantError(f"{name}: quantizing needs an importance matrix (imatrix)")
    qw = None
    if imatrix is not None:
        v, per = as_imatrix(imatrix, rows, name)
        qw = np.repeat(v, per, axis=0).reshape(-1, QK)
    with np.errstate(all="ignore"):  # inf/NaN intermediates are part of ggml's arithmetic
        out, bad = _blocks_np(kind, rows.reshape(-1, QK), qw)
    raise_aborted(bad, rows.shape[1], name)
    return out.reshape(out_shape(np.shape(x), QK, type_size))


def raise_aborted(bad: np.ndarray, n_per_row: int, name: str) -> None:
    """:class:`QuantError` for the first super-block ggml aborts on, as the numba path."""
    if bad.any():
        raise aborts_error(name, int(np.argmax(bad)), n_per_row)
