"""Quantization shared by IQ3_XXS and IQ3_S: ggml's ``quantize_row_iq3_xxs_impl`` (256-point
grid) and ``quantize_row_iq3_s_impl`` (512-point grid), numba kernels and numpy twins.

Per 32 weights: signs split off (IQ3_XXS keeps an even number of them, flipping the least
important weight), a search over trial scales (31 for IQ3_XXS, 19 for IQ3_S) that rounds
each group of four magnitudes to levels ``0..7`` and, where that is no grid point, takes the
best of the point's precomputed grid neighbours; then one refinement pass and the sub-block
scale. The super-block ``d`` is the largest sub-block scale over 31 (times ggml's fudge
factor), and each sub-block stores a 4-bit multiple of it.

The neighbour tables are ggml's ``iq3xs_init_impl``: for each of the 4096 level codes (3 bits
per magnitude) off the grid, every grid point at the two (256-point grid) or three
(512-point grid) smallest squared distances, in (distance, index) order. They are computed
from the grids on first use and kept.

Where ggml's quantizer aborts the process (an off-grid group whose every neighbour has a NaN
or overflowing weighted distance, or a NaN sub-block scale: NaN or infinite input, or
magnitudes from about 1e12 on, whose cubes overflow float32), :func:`quantize` raises
:class:`QuantError` naming the row and the super-block (ggml writes no file there). Where
ggml gets through non-finite input, the bytes are its bytes.
"""

from __future__ import annotations

from functools import cache

import numpy as np
from numba import njit, prange

from llamacpy.quants._errors import QuantError
from llamacpy.quants._helpers import (
    F0,
    F1,
    F32,
    as_imatrix,
    as_rows,
    fp32_to_fp16_np,
    nearest_int,
    nearest_int_np,
    out_shape,
    quantize_out,
    readonly,
    run_quantize_np,
    store_f16,
)
from llamacpy.quants._iqgrid import QK
from llamacpy.quants._iqshared import _vmin_lane, signs_and_max
from llamacpy.quants._search_np import seqsum
from llamacpy.simd import vload_f32, vselect_gt, vsplat_f32, vzero_f32

KMAX = 8  # magnitude levels 0..7, value 2*l + 1
_NCODES = 1 << 12
_LANES = 16
_IOTA = np.arange(_LANES, dtype=np.float32)
_INF = F32(np.inf)
_HALF = F32(0.5)
_15 = F32(2 * KMAX - 1)
_31 = F32(31.0)
_FIFTH = F32(0.2)
_FLT_MAX = F32(np.finfo(np.float32).max)
_EPS_XXS = F32(1e-8)  # GROUP_MAX_EPS_IQ3_XXS
_FUDGE_XXS = F32(1.0125)
_FUDGE_S = F32(1.033)
# block byte offsets: IQ3_XXS d | qs[64] | 8 x u32 (signs, scale); IQ3_S d | qs[64] | qh[8]
# | signs[32] | scales[4]
_QS, _XXS_SAS, _S_QH, _S_SIGNS, _S_SC = 2, 66, 66, 74, 106


@cache
def tables(grid: bytes, npoints: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(points, kmap, neighbours)`` for a grid given as the bytes of its ``uint8
    [npoints, 4]`` magnitudes (8 distinct values, in level order).

    ``points[g]`` (int8 [npoints, 4]) are the grid's levels as ``2 l + 1``; ``kmap[code]`` is
    the grid index of a level code, or ``-(offset + 1)`` for one off the grid, whose entry in
    ``neighbours`` (int32) is the neighbour count followed by the neighbours' indices.
    """
    g = np.frombuffer(grid, np.uint8).reshape(npoints, 4)
    values = np.unique(g)
    assert values.size == KMAX, values
    levels = np.searchsorted(values, g).astype(np.int64)
    points = (2 * levels + 1).astype(np.int8)
    codes = (levels << (3 * np.arange(4))).sum(axis=1)
    kmap = np.full(_NCODES, -1, np.int64)
    kmap[codes] = np.arange(npoints)
    nwant = 2 if npoints == 256 else 3
    off = np.flatnonzero(kmap < 0)
    pos = 2 * ((off[:, None] >> (3 * np.arange(4))) & 7) + 1  # [codes, 4]
    d2 = ((points[None].astype(np.int64) - pos[:, None]) ** 2).sum(axis=2)  # [codes, npoints]
    order = np.argsort(d2, axis=1, kind="stable")  # by distance, then index (ggml's qsort)
    flat = []
    for c, row, dist in zip(off, order, np.take_along_axis(d2, order, axis=1), strict=True):
        keep = row[dist <= np.unique(dist)[nwant - 1]]
        kmap[c] = -(len(flat) + 1)
        flat += [len(keep), *keep.tolist()]
    return points, kmap.astype(np.int32), np.array(flat, np.int32)


@cache
def lanes(grid: bytes, npoints: int) -> tuple[np.ndarray, np.ndarray]:
    """The neighbour lists laid out for 16-lane vectors: ``(base, coords)``. Neighbour
    ``j`` of the list of an off-grid code ``u`` is lane ``j % 16`` of chunk ``j // 16``,
    whose coordinate ``i`` (float32 levels ``2 l + 1``) is at
    ``coords[base[u] + 64 * (j // 16) + 16 * i + j % 16]``; padding lanes hold 0."""
    points, kmap, neigh = tables(grid, npoints)
    base = np.full(_NCODES, -1, np.int32)
    chunks = []
    at = 0
    for u in np.flatnonzero(kmap < 0):
        start = -int(kmap[u]) - 1
        n = int(neigh[start])
        nc = (n + _LANES - 1) // _LANES
        block = np.zeros((nc * _LANES, 4), np.float32)
        block[:n] = points[neigh[start + 1 : start + 1 + n]]
        chunks.append(block.reshape(nc, _LANES, 4).transpose(0, 2, 1).reshape(-1))
        base[u] = at
        at += nc * 4 * _LANES
    return base, np.concatenate(chunks)


# ----------------------------------------------------------------------------- numba


@njit(cache=True, inline="always")
def best_neighbour(tabs, u, xval, waux, o, scale, L):
    """ggml's ``iq3_find_best_neighbour`` for the off-grid code ``u`` of the group at ``o``:
    the neighbour with the least ``sum waux * (scale * q - x)**2`` (the first of equals;
    below FLT_MAX, so never a NaN), its levels to ``L[o:o + 4]``; -1 where none qualifies
    (ggml asserts). Sixteen neighbours at a time, one per lane, each distance summed over
    the coordinates in C's order."""
    points, kmap, neigh, base, coords = tabs
    start = -kmap[u] - 1
    n = neigh[start]
    sv = vsplat_f32(scale)
    x0, x1 = vsplat_f32(xval[o]), vsplat_f32(xval[o + 1])
    x2, x3 = vsplat_f32(xval[o + 2]), vsplat_f32(xval[o + 3])
    w0, w1 = vsplat_f32(waux[o]), vsplat_f32(waux[o + 1])
    w2, w3 = vsplat_f32(waux[o + 2]), vsplat_f32(waux[o + 3])
    iota = vload_f32(_IOTA, 0)
    inf = vsplat_f32(_INF)
    fmax = vsplat_f32(_FLT_MAX)
    best_d2 = _FLT_MAX
    gi = -1
    for c in range((n + _LANES - 1) // _LANES):
        b = base[u] + 4 * _LANES * c
        e = sv * vload_f32(coords, b) - x0
        d2 = vzero_f32() + w0 * e * e
        e = sv * vload_f32(coords, b + _LANES) - x1
        d2 = d2 + w1 * e * e
        e = sv * vload_f32(coords, b + 2 * _LANES) - x2
        d2 = d2 + w2 * e * e
        e = sv * vload_f32(coords, b + 3 * _LANES) - x3
        d2 = d2 + w3 * e * e
        d2 = vselect_gt(fmax, d2, d2, inf)  # NaN and >= FLT_MAX never win
        d2 = vselect_gt(vsplat_f32(F32(n - _LANES * c)), iota, d2, inf)  # padding lanes
        m, lane = _vmin_lane(d2)
        if m < best_d2:
            best_d2 = m
            gi = neigh[start + 1 + _LANES * c + lane]
    if gi >= 0:
        for i in range(4):
            L[o + i] = (points[gi, i] - 1) // 2
    return gi


@njit(cache=True, error_model="numpy")
def _prepare(x, o, qw, use_qw, sigma2, xxs, weight, waux, xval, signs):
    """Weights, magnitudes and sign bytes of the sub-block ``x[o:o + 32]``; returns the
    largest magnitude (C's ``MAX`` order)."""
    for i in range(32):
        v = x[o + i]
        weight[i] = qw[o + i] * np.sqrt(sigma2 + v * v) if use_qw else v * v
        waux[i] = np.sqrt(weight[i])
    return signs_and_max(x, o, 32, weight, xval, signs, xxs)


@njit(cache=True, inline="always")
def _round_groups(idv, scale, xval, waux, tabs, L, on, only_off, lv):
    """Levels of the 8 groups at ``1 / idv`` (grid neighbours at ``scale`` where off the
    grid) to ``L``; ``on[k]`` whether group ``k`` rounded onto the grid. With ``only_off``
    the groups already on the grid are left as they are. False where ggml aborts. ``lv``:
    scratch (32 int32)."""
    kmap = tabs[1]
    for i in range(32):  # every level first (a vectorizable loop), then the groups
        lv[i] = max(0, min(KMAX - 1, nearest_int(_HALF * (idv * xval[i] - F1))))
    for k in range(8):
        if only_off and on[k]:
            continue
        u = 0
        for i in range(4):
            L[4 * k + i] = lv[4 * k + i]
            u |= lv[4 * k + i] << (3 * i)
        gi = kmap[u]
        if not only_off:
            on[k] = gi >= 0
        if gi < 0 and best_neighbour(tabs, u, xval, waux, 4 * k, scale, L) < 0:
            return False
    return True


@njit(cache=True, inline="always")
def _sums(weight, xval, L):
    sumqx = F0
    sumq2 = F0
    for i in range(32):
        w = weight[i]
        q = F32(2 * L[i] + 1)
        sumqx += w * xval[i] * q
        sumq2 += w * q * q
    return sumqx, sumq2


@njit(cache=True, error_model="numpy")
def _search(mx, xxs, weight, waux, xval, tabs, L):
    """The sub-block's scale and levels ``L``: the trial-scale search, then the pass that
    re-rounds the groups off the grid at the found scale. NaN where ggml aborts."""
    Laux = np.empty(32, np.int64)
    lv = np.empty(32, np.int32)
    on = np.empty(8, np.bool_)
    on_aux = np.empty(8, np.bool_)
    on[:] = xxs
    best = F0
    scale = mx / _15
    nis = 15 if xxs else 9
    for step in range(-nis, nis + 1):
        idv = (_15 + F32(step) * _FIFTH) / mx
        if not _round_groups(idv, F1 / idv, xval, waux, tabs, Laux, on_aux, False, lv):
            return np.float32(np.nan)
        sumqx, sumq2 = _sums(weight, xval, Laux)
        if sumq2 > F0 and sumqx * sumqx > best * sumq2:
            scale = sumqx / sumq2
            best = scale * sumqx
            L[:] = Laux
            on[:] = on_aux
    if not on.all() and scale > F0:
        if not xxs:
            on[:] = False  # IQ3_S re-rounds every group
        if not _round_groups(F1 / scale, scale, xval, waux, tabs, L, on, True, lv):
            return np.float32(np.nan)
        sumqx, sumq2 = _sums(weight, xval, L)
        if sumq2 > F0:
            scale = sumqx / sumq2
    return scale


@njit(cache=True, error_model="numpy")
def quantize_superblock(x, o, qw, use_qw, xxs, tabs, out, ob):
    """One super-block ``x[o:o + 256]`` to the block at ``out[ob:]`` (weights ``qw[o:]``
    where ``use_qw``). False where ggml aborts."""
    kmap = tabs[1]
    type_size = 98 if xxs else 110
    out[ob : ob + type_size] = 0
    weight = np.empty(32, np.float32)
    waux = np.empty(32, np.float32)
    xval = np.empty(32, np.float32)
    signs = np.empty(4, np.int64)
    L = np.empty(32, np.int64)
    scales = np.empty(8, np.float32)
    sumx2 = F0
    for i in range(QK):
        sumx2 += x[o + i] * x[o + i]
    sigma2 = F32(2.0) * sumx2 / F32(QK)
    max_scale = F0
    nq = 0  # IQ3_S: sub-blocks stored so far (ggml skips the all-zero ones' bytes)
    for ib in range(8):
        e = o + 32 * ib
        mx = _prepare(x, e, qw, use_qw, sigma2, xxs, weight, waux, xval, signs)
        L[:] = 0
        if (xxs and mx < _EPS_XXS) or (not xxs and mx == F0):
            scales[ib] = F0
            continue
        scale = _search(mx, xxs, weight, waux, xval, tabs, L)
        if scale < F0:
            scale = -scale
            for k in range(4):
                signs[k] = (~signs[k]) & (127 if xxs else 255)
        for k in range(8):
            u = 0
            for i in range(4):
                u |= L[4 * k + i] << (3 * i)
            gi = kmap[u]
            if gi < 0:
                return False
            if xxs:
                out[ob + _QS + 8 * ib + k] = gi
            else:
                out[ob + _QS + 8 * nq + k] = gi & 255
                out[ob + _S_QH + ib] |= (gi >> 8) << k
        if xxs:
            sas = signs[0] | (signs[1] << 7) | (signs[2] << 14) | (signs[3] << 21)
            for b in range(4):
                out[ob + _XXS_SAS + 4 * ib + b] = (sas >> (8 * b)) & 255
        else:
            for k in range(4):
                out[ob + _S_SIGNS + 4 * nq + k] = signs[k]
            nq += 1
        if not scale >= F0:
            return False
        scales[ib] = scale
        max_scale = max_scale if max_scale > scale else scale
    if max_scale == F0:
        if xxs:
            out[ob : ob + type_size] = 0
        return True
    d = max_scale / _31
    store_f16(out, ob, d * (_FUDGE_XXS if xxs else _FUDGE_S))
    idv = F1 / d
    for ib in range(8):
        l = max(0, min(15, nearest_int(_HALF * (idv * scales[ib] - F1))))
        if xxs:
            out[ob + _XXS_SAS + 4 * ib + 3] |= l << 4
        else:
            out[ob + _S_SC + ib // 2] |= l << (4 * (ib % 2))
    return True


@njit(cache=True, parallel=True, error_model="numpy")
def _kernel(rows, qw, rows_per_qw, use_qw, xxs, tabs, out, failed):
    """Every super-block of ``rows`` into ``out`` (one super-block per task);
    ``failed[t]`` set for the super-blocks ggml aborts on."""
    nrows, n_per_row = rows.shape
    nb = n_per_row // QK
    type_size = out.shape[1] // nb
    for t in prange(nrows * nb):
        r = t // nb
        i = t - r * nb
        w = qw[r // rows_per_qw]
        ok = quantize_superblock(rows[r], i * QK, w, use_qw, xxs, tabs, out[r], i * type_size)
        failed[t] = not ok


def quantize(x, imatrix, out, xxs: bool, grid: np.ndarray, name: str, type_size: int):
    """``quantize_iq3_xxs`` (``xxs``) or ``quantize_iq3_s`` of rows ``x`` (see the module)."""
    key = (grid.tobytes(), grid.shape[0])
    tabs = (*tables(*key), *lanes(*key))
    rows = as_rows(x, QK, name)
    dst = quantize_out(out, (rows.shape[0], rows.shape[1] // QK * type_size), name)
    if imatrix is None:
        qw, rows_per_qw = readonly(np.zeros((1, rows.shape[1]), np.float32)), rows.shape[0]
    else:
        qw, rows_per_qw = as_imatrix(imatrix, rows, name)
    if rows.size:
        failed = np.zeros(rows.size // QK, np.bool_)
        _kernel(rows, qw, max(rows_per_qw, 1), imatrix is not None, xxs, tabs, dst, failed)
        if failed.any():
            raise aborts_error(name, int(np.argmax(failed)), rows.shape[1])
    return out if out is not None else dst.reshape(out_shape(np.shape(x), QK, type_size))


def aborts_error(name: str, block: int, n_per_row: int) -> QuantError:
    """The error for super-block ``block`` (counted over all rows) of an input."""
    row, col = divmod(block * QK, n_per_row)
    return QuantError(
        f"{name}: llama.cpp's quantizer aborts on row {row}, values {col}..{col + QK - 1}: "
        "NaN or infinite values, or magnitudes too large for its float32 distances (about "
        "1e12 and up)"
    )


# ----------------------------------------------------------------------------- numpy twin


@cache
def _padded(grid: bytes, npoints: int) -> tuple[np.ndarray, np.ndarray]:
    """The neighbour lists as a ``[4096, most]`` index table (-1 padded) and their counts."""
    _, kmap, neigh = tables(grid, npoints)
    start = np.where(kmap < 0, -kmap - 1, 0)
    count = np.where(kmap < 0, neigh[start], 0)
    width = int(count.max())
    j = np.arange(width)
    valid = j < count[:, None]
    table = np.where(valid, neigh[np.where(valid, start[:, None] + 1 + j, 0)], -1)
    return table, count


class _Tabs:
    """A grid's tables, for the twin."""

    def __init__(self, grid: np.ndarray) -> None:
        key = (grid.tobytes(), grid.shape[0])
        self.points, self.kmap, _ = tables(*key)
        self.table, self.count = _padded(*key)


def _round_groups_np(idv, scale, xval, waux, t: _Tabs):
    """``_round_groups`` over ``(G, 32)`` sub-blocks: (levels, on-grid [G, 8], failed [G, 8])."""
    G = xval.shape[0]
    l = np.clip(nearest_int_np(_HALF * (idv[:, None] * xval - F1)), 0, KMAX - 1).astype(np.int64)
    codes = (l.reshape(G, 8, 4) << (3 * np.arange(4))).sum(axis=2)
    on = t.kmap[codes] >= 0
    failed = np.zeros((G, 8), np.bool_)
    g, k = np.nonzero(~on)
    if g.size:
        cand = t.table[codes[g, k]]  # [P, width]
        xq = xval.reshape(G, 8, 4)[g, k]
        wq = waux.reshape(G, 8, 4)[g, k]
        d2 = np.zeros(cand.shape, np.float32)
        for i in range(4):
            diff = scale[g, None] * t.points[cand, i].astype(np.float32) - xq[:, i, None]
            d2 = d2 + wq[:, i, None] * diff * diff
        d2 = np.where((cand >= 0) & (d2 < _FLT_MAX), d2, np.float32(np.inf))
        j = np.argmin(d2, axis=1)
        failed[g, k] = ~(d2[np.arange(g.size), j] < np.inf)
        best = cand[np.arange(g.size), j]
        lq = l.reshape(G, 8, 4)
        lq[g, k] = (t.points[best].astype(np.int64) - 1) // 2
    return l, on, failed


def _sums_np(weight, xval, L):
    q = (2 * L + 1).astype(np.float32)
    return seqsum(weight * xval * q), seqsum(weight * q * q)


def _prepare_np(X, weight, xxs):
    """Magnitudes, sign bytes [G, 4] and the largest magnitude of ``(G, 32)`` sub-blocks."""
    G = X.shape[0]
    neg = ~(X >= F0)  # NaN counts as negative, as in C
    xval = np.where(neg, -X, X)
    bits = neg.reshape(G, 4, 8).astype(np.int64)
    s = (bits << np.arange(8)).sum(axis=2)
    if xxs:
        ax = (weight * X * X).reshape(G, 4, 8)
        mn, imin = ax[:, :, 0], np.zeros((G, 4), np.int64)
        for i in range(1, 8):
            upd = ax[:, :, i] < mn
            mn, imin = np.where(upd, ax[:, :, i], mn), np.where(upd, i, imin)
        odd = bits.sum(axis=2) % 2 == 1
        gi, ki = np.nonzero(odd)
        xv = xval.reshape(G, 4, 8)
        xv[gi, ki, imin[gi, ki]] = -xv[gi, ki, imin[gi, ki]]
        s = np.where(odd, s ^ (1 << imin), s) & 127
    mx = xval[:, 0]
    for i in range(1, 32):
        mx = np.where(mx > xval[:, i], mx, xval[:, i])
    return xval, s, mx


def _search_np(mx, xxs, weight, waux, xval, t: _Tabs):
    """``_search`` over sub-blocks: (scale, levels, failed)."""
    G = xval.shape[0]
    L = np.zeros((G, 32), np.int64)
    on = np.full((G, 8), xxs)
    failed = np.zeros(G, np.bool_)
    best = np.zeros(G, np.float32)
    scale = (mx / _15).astype(np.float32)
    nis = 15 if xxs else 9
    for step in range(-nis, nis + 1):
        idv = ((_15 + F32(step) * _FIFTH) / mx).astype(np.float32)
        Laux, on_aux, f = _round_groups_np(idv, F1 / idv, xval, waux, t)
        failed |= f.any(axis=1)
        sumqx, sumq2 = _sums_np(weight, xval, Laux)
        upd = (sumq2 > F0) & (sumqx * sumqx > best * sumq2)
        scale = np.where(upd, sumqx / sumq2, scale)
        best = np.where(upd, scale * sumqx, best)
        L = np.where(upd[:, None], Laux, L)
        on = np.where(upd[:, None], on_aux, on)
    redo = ~on.all(axis=1) & (scale > F0)
    Lr, _, f = _round_groups_np(F1 / scale, scale, xval, waux, t)
    quads = redo[:, None] & (~on if xxs else np.ones_like(on))
    failed |= (f & quads).any(axis=1)
    L = np.where(np.repeat(quads, 4, axis=1), Lr, L)
    sumqx, sumq2 = _sums_np(weight, xval, L)
    scale = np.where(redo & (sumq2 > F0), sumqx / sumq2, scale)
    return scale, L, failed


def _superblocks_np(xb: np.ndarray, qw: np.ndarray | None, xxs: bool, grid: np.ndarray):
    t = _Tabs(grid)
    nb = xb.shape[0]
    sigma2 = F32(2.0) * seqsum(xb * xb) / F32(QK)
    X = xb.reshape(-1, 32)
    if qw is None:
        weight = X * X
    else:
        weight = qw.reshape(-1, 32) * np.sqrt(np.repeat(sigma2, 8)[:, None] + X * X)
    waux = np.sqrt(weight)
    xval, signs, mx = _prepare_np(X, weight, xxs)
    active = mx >= _EPS_XXS if xxs else mx != F0
    scale, L, failed = _search_np(np.where(active, mx, F1), xxs, weight, waux, xval, t)
    flip = scale < F0
    scale = np.where(flip, -scale, scale)
    signs = np.where(flip[:, None], ~signs & (127 if xxs else 255), signs)
    gi = t.kmap[(L.reshape(-1, 8, 4) << (3 * np.arange(4))).sum(axis=2)].astype(np.int64)
    failed |= (gi < 0).any(axis=1) | ~(scale >= F0)
    failed = (failed & active).reshape(nb, 8).any(axis=1)
    scales = np.where(active, scale, F0).reshape(nb, 8)
    max_scale = np.zeros(nb, np.float32)
    for ib in range(8):
        max_scale = np.where(max_scale > scales[:, ib], max_scale, scales[:, ib])
    d = (max_scale / _31).astype(np.float32)
    with np.errstate(all="ignore"):
        ls = np.clip(nearest_int_np(_HALF * ((F1 / d)[:, None] * scales - F1)), 0, 15)
    has = max_scale != F0
    out = np.zeros((nb, 98 if xxs else 110), np.int64)
    dh = fp32_to_fp16_np(d * (_FUDGE_XXS if xxs else _FUDGE_S)).astype(np.int64)
    out[:, 0], out[:, 1] = np.where(has, dh & 255, 0), np.where(has, dh >> 8, 0)
    act = active.reshape(nb, 8)
    gi, signs = gi.reshape(nb, 8, 8), signs.reshape(nb, 8, 4)
    if xxs:
        out[:, _QS : _QS + 64] = np.where(act[:, :, None], gi, 0).reshape(nb, 64)
        sas = (signs << (7 * np.arange(4))).sum(axis=2) | (np.where(has[:, None], ls, 0) << 28)
        sas = np.where(act, sas, 0)
        out[:, _XXS_SAS:] = ((sas[:, :, None] >> (8 * np.arange(4))) & 255).reshape(nb, 32)
        out[~has] = 0
    else:
        nq = np.cumsum(act, axis=1) - 1  # where each stored sub-block's bytes go
        b, ib = np.nonzero(act)
        pos = nq[b, ib]
        out[b[:, None], _QS + 8 * pos[:, None] + np.arange(8)] = gi[b, ib] & 255
        out[b[:, None], _S_SIGNS + 4 * pos[:, None] + np.arange(4)] = signs[b, ib]
        out[:, _S_QH : _S_QH + 8] = np.where(act, ((gi >> 8) << np.arange(8)).sum(axis=2), 0)
        sc = np.where(has[:, None], ls, 0)
        out[:, _S_SC : _S_SC + 4] = sc[:, 0::2] | (sc[:, 1::2] << 4)
    return out.astype(np.uint8), failed


def quantize_numpy(x, imatrix, xxs: bool, grid: np.ndarray, name: str, type_size: int):
    """Vectorized numpy twin of :func:`quantize` (super-blocks as rows of 256 weights)."""

    def checked(out, failed):
        if failed.any():
            raise aborts_error(name, int(np.argmax(failed)), np.shape(x)[-1])
        return out

    def impl(rows, qw_rows):
        return checked(*_superblocks_np(rows.reshape(-1, QK), qw_rows.reshape(-1, QK), xxs, grid))

    def ref(blocks):
        return checked(*_superblocks_np(blocks, None, xxs, grid))

    return run_quantize_np(ref, impl, x, imatrix, QK, type_size, name)
