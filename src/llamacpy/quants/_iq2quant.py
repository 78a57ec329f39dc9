"""Quantization of IQ2_XXS, IQ2_XS and IQ2_S: ggml's ``quantize_row_iq2_xxs_impl``,
``quantize_row_iq2_xs_impl`` and ``quantize_row_iq2_s_impl`` (numba), and the grid tables
that IQ1_S and IQ1_M share with them.

A grid point is 8 levels ``l`` in ``0..2`` (2 bits each: a 16-bit code ``u``); the IQ2 value
of a level is ``2 l + 1``. Per group of 32 (IQ2_XXS) or 16 (IQ2_XS, IQ2_S) weights: the signs
are split off (IQ2_XXS and IQ2_XS keep an even number of them per 8, flipping the least
important weight), then a search over trial scales rounds each 8 magnitudes to levels and,
where that code is no grid point, takes the best of the code's precomputed grid neighbours;
then one pass re-rounds the groups off the grid at the found scale, and the sub-block scale
is the weighted least-squares fit. The super-block ``d`` is the largest sub-block scale over
31 (IQ2_S: times 0.9875), and each sub-block stores a 4-bit multiple ``2 ls + 1`` of it.

The neighbour tables are ggml's ``iq2xs_init_impl``: for every code off the grid, the grid
points at the ``nwant`` smallest squared distances (IQ2_XXS, IQ2_XS: 2, IQ2_S: 1, IQ1: 3),
in (distance, index) order. They are computed from the grids on first use and kept (codes
with a level 3 never reach a search and get no list).

Where ggml's quantizer aborts the process (every neighbour of an off-grid group at a NaN or
overflowing weighted distance, a group whose levels are no grid point when packed, a NaN
sub-block scale: NaN or infinite input, or magnitudes whose squares overflow float32),
:func:`quantize` raises :class:`QuantError` naming the row and values; ggml writes no defined
bytes there. Where ggml gets through such input, the bytes are its bytes.
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
    GROUP_MAX_EPS,
    as_imatrix,
    as_rows,
    nearest_int,
    out_shape,
    quantize_out,
    readonly,
    store_f16,
)
from llamacpy.quants._iqgrid import QK, grid
from llamacpy.quants._iqshared import _vmin_lane, signs_and_max
from llamacpy.quants._search import make_qp_quants
from llamacpy.simd import vcvt, vload_f32, vload_u8, vselect_gt, vsplat_f32, vzero_f32

NCODES = 1 << 16  # a code is a uint16 in ggml; its map covers 43692 of them
_MAP_SIZE = 43692
NO_LIST = -(1 << 30)  # kmap of codes no search reaches (a level 3, or beyond ggml's map)
FLT_MAX = F32(np.finfo(np.float32).max)
_HALF = F32(0.5)
_TENTH = F32(0.1)
_1, _2, _5 = F32(1.0), F32(2.0), F32(5.0)  # IQ2 values 2 l + 1; 5: 2 * kMaxQ - 1
_31 = F32(31.0)
_EPS_S = F32(1e-8)  # GROUP_MAX_EPS_IQ2_S
_FUDGE_S = F32(0.9875)
_LANES = 16
_IOTA = np.arange(_LANES, dtype=np.float32)
_INF = F32(np.inf)
# the grids, their entry count, and nwant of ggml's neighbour search
GRIDS = {"iq2xxs_grid": (8, 2), "iq2xs_grid": (9, 2), "iq2s_grid": (10, 1), "iq1s_grid": (11, 3)}


# ----------------------------------------------------------------------------- tables


@njit(cache=True, inline="always")
def _distances(levels, u, d2):
    """``d2[g]``: the squared distance of grid point ``g`` to the packed code ``u`` (levels
    ``2l + 1``, as ggml measures it)."""
    for g in range(levels.shape[0]):
        s = 0
        for k in range(8):
            diff = 2 * (np.int64(levels[g, k]) - ((u >> (2 * k)) & 3))
            s += diff * diff
        d2[g] = s


@njit(cache=True, error_model="numpy")
def _build_neighbours(levels, nwant):
    """``(kmap, neighbours)`` of a grid of levels (see :func:`tables`)."""
    npoints = levels.shape[0]
    kmap = np.full(NCODES, NO_LIST, np.int32)
    for g in range(npoints):
        u = 0
        for k in range(8):
            u |= np.int64(levels[g, k]) << (2 * k)
        kmap[u] = g
    d2 = np.empty(npoints, np.int64)
    cut = np.empty(NCODES, np.int64)
    total = 0
    for u in range(_MAP_SIZE):
        if kmap[u] >= 0 or any_level3(u):
            continue
        _distances(levels, u, d2)
        last = -1
        for _ in range(nwant):  # the nwant smallest distinct distances
            nxt = -1
            for g in range(npoints):
                if d2[g] > last and (nxt < 0 or d2[g] < nxt):
                    nxt = d2[g]
            if nxt < 0:
                break
            last = nxt
        cut[u] = last
        n = 0
        for g in range(npoints):
            n += d2[g] <= last
        total += 1 + n
    neigh = np.empty(total, np.uint16)
    off = 0
    for u in range(_MAP_SIZE):
        if kmap[u] >= 0 or any_level3(u):
            continue
        _distances(levels, u, d2)
        kmap[u] = -(off + 1)
        start = off
        off += 1
        last = -1
        while True:  # the kept distances in increasing order, each in index order
            nxt = -1
            for g in range(npoints):
                if last < d2[g] <= cut[u] and (nxt < 0 or d2[g] < nxt):
                    nxt = d2[g]
            if nxt < 0:
                break
            for g in range(npoints):
                if d2[g] == nxt:
                    neigh[off] = g
                    off += 1
            last = nxt
        neigh[start] = off - start - 1
    return kmap, neigh


@njit(cache=True, inline="always")
def any_level3(u):
    return ((u & 0x5555) & ((u >> 1) & 0x5555)) != 0


@cache
def tables(name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(levels, values, kmap, neighbours)`` of the grid ``name`` of ``iq_grids.npz``.

    ``levels`` (uint8 [points, 8]) are the grid's levels ``0..2``; ``values`` (float32) are
    ``2 l + 1``; ``kmap[u]`` is the grid index of code ``u``, or ``-(offset + 1)`` for a code
    off the grid whose entry in ``neighbours`` (uint16) is the neighbour count followed by
    the neighbours' indices, or :data:`NO_LIST`.
    """
    bits, nwant = GRIDS[name]
    g = grid(name, bits)
    if name == "iq1s_grid":
        levels = (g.view(np.int8).astype(np.int64) + 1).astype(np.uint8)
    else:  # the IQ2 magnitudes 8, 25, 43
        levels = ((g > 8).astype(np.uint8) + (g > 25)).astype(np.uint8)
    kmap, neigh = _build_neighbours(levels, nwant)
    values = (2 * levels.astype(np.float32) + 1).astype(np.float32)
    return readonly(levels), readonly(values), readonly(kmap), readonly(neigh)


@cache
def lanes(name: str) -> tuple[np.ndarray, np.ndarray]:
    """The neighbour lists of grid ``name`` laid out for 16-lane vectors: ``(base,
    levels)``. Neighbour ``j`` of the list of an off-grid code ``u`` is lane ``j % 16`` of
    chunk ``j // 16``, whose level ``i`` is ``levels[base[u] + 128 * (j // 16) + 16 * i +
    j % 16]``; padding lanes hold 0."""
    levels, _, kmap, neigh = tables(name)
    base = np.full(NCODES, -1, np.int32)
    chunks = []
    at = 0
    for u in np.flatnonzero((kmap < 0) & (kmap != NO_LIST)):
        start = -int(kmap[u]) - 1
        n = int(neigh[start])
        nc = (n + _LANES - 1) // _LANES
        block = np.zeros((nc * _LANES, 8), np.uint8)
        block[:n] = levels[neigh[start + 1 : start + 1 + n]]
        chunks.append(block.reshape(nc, _LANES, 8).transpose(0, 2, 1).reshape(-1))
        base[u] = at
        at += nc * 8 * _LANES
    return readonly(base), readonly(np.concatenate(chunks))


def all_tables(name: str) -> tuple[np.ndarray, ...]:
    """What the kernels take: :func:`tables` then :func:`lanes`."""
    return (*tables(name), *lanes(name))


# ----------------------------------------------------------------------------- numba


@njit(cache=True, inline="always")
def code_of(L, o):
    """The uint16 code of ``L[o:o + 8]`` as C builds it (``u |= L[i] << 2*i`` on a
    ``uint16_t``, ``L`` signed)."""
    u = 0
    for i in range(8):
        u |= np.int64(L[o + i]) << (2 * i)
    return u & 0xFFFF


@njit(cache=True, inline="always")
def grid_index(kmap, u):
    """The grid index of a packed code, or -1 where ggml aborts (off the grid)."""
    g = np.int64(kmap[u])
    return g if g >= 0 and u < _MAP_SIZE else -1


@njit(cache=True, inline="always")
def nearest_candidate(tabs, u, x, xo, w, wo, scale, a, b):
    """Of the neighbours of the off-grid code ``u``: the first with the least
    ``sum_i w[wo + i] * (scale * q_i - x[xo + i])**2`` (``q_i = l_i * a + b`` of its levels
    ``l_i``, exact for the IQ2 and IQ1 values), below FLT_MAX (never a NaN); -1 where none
    qualifies. Sixteen neighbours at a time, one per lane, each sum in C's element order."""
    neigh, base, lv = tabs[3], tabs[4], tabs[5]
    start = -np.int64(tabs[2][u]) - 1
    n = np.int64(neigh[start])
    b0 = np.int64(base[u])
    sv, va, vb = vsplat_f32(scale), vsplat_f32(a), vsplat_f32(b)
    iota = vload_f32(_IOTA, 0)
    inf, fmax = vsplat_f32(_INF), vsplat_f32(FLT_MAX)
    best = FLT_MAX
    gi = -1
    for c in range((n + _LANES - 1) // _LANES):
        o = b0 + 8 * _LANES * c
        d2 = vzero_f32()
        for i in range(8):
            e = sv * (vcvt(vload_u8(lv, o + _LANES * i)) * va + vb) - vsplat_f32(x[xo + i])
            d2 = d2 + vsplat_f32(w[wo + i]) * e * e
        d2 = vselect_gt(fmax, d2, d2, inf)  # NaN and >= FLT_MAX never win
        d2 = vselect_gt(vsplat_f32(F32(n - _LANES * c)), iota, d2, inf)  # padding lanes
        m, lane = _vmin_lane(d2)
        if m < best:
            best = m
            gi = np.int64(neigh[start + 1 + _LANES * c + lane])
    return gi


@njit(cache=True, error_model="numpy")
def best_neighbour(tabs, u, xval, waux, o, scale, L):
    """ggml's ``iq2_find_best_neighbour`` for the off-grid code ``u`` of the 8 weights at
    ``o``: the neighbour with the least ``sum waux * (scale * q - x)**2`` (first of equals,
    below FLT_MAX), its levels to ``L[o:o + 8]``; -1 where none qualifies (ggml asserts)."""
    gi = nearest_candidate(tabs, u, xval, o, waux, o, scale, _2, _1)
    if gi >= 0:
        for i in range(8):
            L[o + i] = tabs[0][gi, i]
    return gi


@njit(cache=True, error_model="numpy")
def _prepare(x, o, n, qw, use_qw, sigma2, iq2s, weight, waux, xval, signs):
    """Weights, magnitudes and sign bytes of the ``n`` weights ``x[o:o + n]``; returns the
    largest magnitude (C's ``MAX`` order). Without ``iq2s`` an even number of signs per 8
    (the least important weight flipped) and 7 stored sign bits."""
    for i in range(n):
        v = x[o + i]
        if use_qw:
            weight[i] = qw[o + i] * np.sqrt(sigma2 + v * v)
        else:  # IQ2_S without an importance matrix
            weight[i] = F32(0.25) * sigma2 + v * v
        waux[i] = np.sqrt(weight[i])
    return signs_and_max(x, o, n, weight, xval, signs, not iq2s)


@njit(cache=True, error_model="numpy")
def _round(idv, scale, n, xval, waux, tabs, L, on, only_off):
    """Levels of the ``n // 8`` groups at ``1 / idv`` (grid neighbours at ``scale`` where off
    the grid) to ``L``; ``on[k]``: whether group ``k`` rounded onto the grid. With
    ``only_off`` the groups on the grid are left as they are. False where ggml aborts."""
    kmap = tabs[2]
    if not only_off:  # every level at once (one vectorizable loop)
        for i in range(n):
            L[i] = max(0, min(2, nearest_int(_HALF * (idv * xval[i] - F1))))
    for k in range(n // 8):
        if only_off:
            if on[k]:
                continue
            for i in range(8 * k, 8 * k + 8):
                L[i] = max(0, min(2, nearest_int(_HALF * (idv * xval[i] - F1))))
        u = code_of(L, 8 * k)
        g = kmap[u]
        if not only_off:
            on[k] = g >= 0
        if g < 0 and best_neighbour(tabs, u, xval, waux, 8 * k, scale, L) < 0:
            return False
    return True


@njit(cache=True, error_model="numpy")
def _sums(n, weight, xval, L):
    sumqx = F0
    sumq2 = F0
    for i in range(n):
        w = weight[i]
        q = F32(2 * np.int64(L[i]) + 1)
        sumqx += w * xval[i] * q
        sumq2 += w * q * q
    return sumqx, sumq2


@njit(cache=True, error_model="numpy")
def _refine(scale, n, weight, xval, waux, tabs, L, on, all_groups):
    """Re-round at the found scale (every group, or only those off the grid) and refit the
    scale. NaN where ggml aborts."""
    if not _round(F1 / scale, scale, n, xval, waux, tabs, L, on, not all_groups):
        return np.float32(np.nan)
    sumqx, sumq2 = _sums(n, weight, xval, L)
    return sumqx / sumq2 if sumq2 > F0 else scale


@njit(cache=True, error_model="numpy")
def _search(scale, first, last, base, n, weight, xval, waux, tabs, L, on):
    """The trial-scale search (``id = (5 + is/10) / base`` for ``is`` in ``first..last``):
    the levels with the best weighted fit to ``L`` and their ``on``; the fitted scale
    (``scale`` where none fits). NaN where ggml aborts."""
    Laux = np.empty(n, np.int8)
    on_aux = np.empty(n // 8, np.bool_)
    best = F0
    for s in range(first, last + 1):
        idv = (_5 + F32(s) * _TENTH) / base
        if not _round(idv, F1 / idv, n, xval, waux, tabs, Laux, on_aux, False):
            return np.float32(np.nan)
        sumqx, sumq2 = _sums(n, weight, xval, Laux)
        if sumq2 > F0 and sumqx * sumqx > best * sumq2:
            scale = sumqx / sumq2
            best = scale * sumqx
            L[:] = Laux
            on[:] = on_aux
    return scale


@njit(cache=True, error_model="numpy")
def _pack_codes(L, n, kmap, codes):
    """The grid indices of the groups' levels to ``codes``; False where one is off the grid
    (ggml aborts)."""
    for k in range(n // 8):
        g = grid_index(kmap, code_of(L, 8 * k))
        if g < 0:
            return False
        codes[k] = g
    return True


# a group's outcome: quantized, all zero (nothing stored, scale 0), or ggml aborts
DONE, ZERO, ABORT = 0, 1, 2


@njit(cache=True, error_model="numpy")
def _sub_xxs(x, o, qw, use_qw, sigma2, tabs, codes, signs):
    """One group of 32 of ``quantize_row_iq2_xxs_impl``: grid indices and sign fields to
    ``codes`` / ``signs``; returns ``(scale, outcome)``."""
    weight = np.empty(32, np.float32)
    waux = np.empty(32, np.float32)
    xval = np.empty(32, np.float32)
    Lu = np.zeros(32, np.uint8)  # make_qp_quants stores uint8_t; the levels are int8_t
    L = Lu.view(np.int8)
    on = np.empty(4, np.bool_)
    mx = _prepare(x, o, 32, qw, use_qw, sigma2, False, weight, waux, xval, signs)
    if mx < GROUP_MAX_EPS:
        return F0, ZERO
    scale = make_qp_quants(32, 4, xval, Lu, weight)
    eff_max = scale * F32(3.0)
    if eff_max <= F0:
        return F0, ZERO
    scale = _search(scale, -6, 6, eff_max, 32, weight, xval, waux, tabs, L, on)
    if scale > F0:
        scale = _refine(scale, 32, weight, xval, waux, tabs, L, on, True)
    if scale < F0:
        scale = -scale
        for k in range(4):
            signs[k] = ~signs[k] & 127
    if not _pack_codes(L, 32, tabs[2], codes) or not scale >= F0:
        return scale, ABORT
    return scale, DONE


@njit(cache=True, error_model="numpy")
def _sub16(x, o, qw, use_qw, sigma2, iq2s, tabs, codes, signs):
    """One group of 16 of ``quantize_row_iq2_xs_impl`` / ``quantize_row_iq2_s_impl``: grid
    indices and sign bytes to ``codes`` / ``signs``; returns ``(scale, outcome)``."""
    weight = np.empty(16, np.float32)
    waux = np.empty(16, np.float32)
    xval = np.empty(16, np.float32)
    L = np.zeros(16, np.int8)
    on = np.ones(2, np.bool_)
    mx = _prepare(x, o, 16, qw, use_qw, sigma2, iq2s, weight, waux, xval, signs)
    if mx < (_EPS_S if iq2s else GROUP_MAX_EPS):
        return F0, ZERO
    scale = _search(mx / _5, -9, 9, mx, 16, weight, xval, waux, tabs, L, on)
    if not (on[0] and on[1]) and scale > F0:
        scale = _refine(scale, 16, weight, xval, waux, tabs, L, on, False)
    if scale < F0:
        scale = -scale
        for k in range(2):
            signs[k] = ~signs[k] & (255 if iq2s else 127)
    if not _pack_codes(L, 16, tabs[2], codes) or not scale >= F0:
        return scale, ABORT
    return scale, DONE


@njit(cache=True, inline="always")
def sigma2_of(x, o, twice):
    """``sumx2 / 256`` (``2 * sumx2 / 256``) of the super-block at ``x[o:]``."""
    sumx2 = F0
    for i in range(QK):
        sumx2 += x[o + i] * x[o + i]
    return (F32(2.0) * sumx2 if twice else sumx2) / F32(QK)


@njit(cache=True, inline="always")
def scale_code(idv, scale, top):
    """``clamp(nearest_int((idv * scale - 1) / 2), 0, top)``: a stored sub-block scale."""
    return max(0, min(top, nearest_int(_HALF * (idv * scale - F1))))


@njit(cache=True, error_model="numpy")
def _block_xxs(x, o, qw, use_qw, tabs, out, ob):
    """One super-block of IQ2_XXS to ``out[ob:]``; False where ggml aborts."""
    sigma2 = sigma2_of(x, o, False)
    q2 = np.zeros(16, np.int64)
    scales = np.zeros(8, np.float32)
    codes = np.zeros(4, np.int64)
    signs = np.zeros(4, np.int64)
    max_scale = F0
    for ib in range(8):
        s, what = _sub_xxs(x, o + 32 * ib, qw, use_qw, sigma2, tabs, codes, signs)
        if what == ABORT:
            return False
        if what == ZERO:
            continue
        for k in range(4):
            q2[2 * ib] |= codes[k] << (8 * k)
            q2[2 * ib + 1] |= signs[k] << (7 * k)
        scales[ib] = s
        max_scale = max_scale if max_scale > s else s
    out[ob : ob + 66] = 0
    if max_scale == F0:
        return True
    d = max_scale / _31
    store_f16(out, ob, d)
    idv = F1 / d
    for ib in range(8):
        q2[2 * ib + 1] |= scale_code(idv, scales[ib], 15) << 28
    for j in range(16):
        for b in range(4):
            out[ob + 2 + 4 * j + b] = (q2[j] >> (8 * b)) & 0xFF
    return True


@njit(cache=True, error_model="numpy")
def _block16(x, o, qw, use_qw, iq2s, tabs, out, ob):
    """One super-block of IQ2_XS (``iq2s`` False) or IQ2_S to ``out[ob:]``; False where
    ggml aborts."""
    sigma2 = sigma2_of(x, o, iq2s)
    scales = np.zeros(16, np.float32)
    codes = np.zeros(2, np.int64)
    signs = np.zeros(2, np.int64)
    size = 82 if iq2s else 74
    out[ob : ob + size] = 0
    max_scale = F0
    for ib in range(16):
        s, what = _sub16(x, o + 16 * ib, qw, use_qw, sigma2, iq2s, tabs, codes, signs)
        if what == ABORT:
            return False
        if what == ZERO:
            continue
        for k in range(2):
            i8 = 2 * ib + k
            if iq2s:  # qs[32] | signs[32] | qh[8] | scales[8]
                out[ob + 2 + i8] = codes[k] & 255
                out[ob + 66 + i8 // 4] |= (codes[k] >> 8) << (2 * (i8 % 4))
                out[ob + 34 + i8] = signs[k]
            else:  # qs: uint16 index | signs << 9; then scales[8]
                v = codes[k] | (signs[k] << 9)
                out[ob + 2 + 2 * i8] = v & 0xFF
                out[ob + 3 + 2 * i8] = v >> 8
        scales[ib] = s
        max_scale = max_scale if max_scale > s else s
    if max_scale == F0:
        if not iq2s:
            out[ob + 2 : ob + 66] = 0
        return True
    d = max_scale / _31
    store_f16(out, ob, d * _FUDGE_S if iq2s else d)
    idv = F1 / d
    osc = ob + (74 if iq2s else 66)
    for ib in range(16):
        l = scale_code(idv, scales[ib], 15)
        if ib % 2 == 0:
            out[osc + ib // 2] = l
        else:
            out[osc + ib // 2] |= l << 4
    return True


@njit(cache=True, parallel=True, error_model="numpy")
def _kernel(t, rows, qw, rows_per_qw, use_qw, tabs, out, bad):
    """Every super-block of ``rows`` (format ``t``: 0 IQ2_XXS, 1 IQ2_XS, 2 IQ2_S) to
    ``out``; ``bad[b]`` set where ggml aborts on super-block ``b``."""
    nrows, n = rows.shape
    nb = n // QK
    size = out.shape[1] // nb
    for b in prange(nrows * nb):
        r, i = b // nb, b % nb
        w = qw[r // rows_per_qw]
        if t == 0:
            ok = _block_xxs(rows[r], i * QK, w, use_qw, tabs, out[r], i * size)
        else:
            ok = _block16(rows[r], i * QK, w, use_qw, t == 2, tabs, out[r], i * size)
        bad[b] = not ok


# ----------------------------------------------------------------------------- driver


def run(kernel, kind: int, grid_name: str, x, imatrix, out, name: str, type_size: int,
        needs_imatrix: bool) -> np.ndarray:  # fmt: skip
    """Validate and quantize ``x`` (rows on the last axis) with ``kernel(kind, rows, qw,
    rows_per_qw, use_qw, tables, out, bad)``; raises :class:`QuantError` where ggml refuses
    (no importance matrix for a format that needs one) or aborts."""
    rows = as_rows(x, QK, name)
    if imatrix is None and needs_imatrix:
        raise QuantError(f"{name}: quantizing needs an importance matrix (imatrix)")
    dst = quantize_out(out, (rows.shape[0], rows.shape[1] // QK * type_size), name)
    if imatrix is None:
        qw, rows_per_qw = readonly(np.zeros((1, rows.shape[1]), np.float32)), rows.shape[0]
    else:
        qw, rows_per_qw = as_imatrix(imatrix, rows, name)
    bad = np.zeros(rows.size // QK, np.bool_)
    kernel(kind, rows, qw, max(rows_per_qw, 1), imatrix is not None, all_tables(grid_name), dst,
           bad)  # fmt: skip
    if bad.any():
        raise aborts_error(name, int(np.argmax(bad)), rows.shape[1])
    return out if out is not None else dst.reshape(out_shape(np.shape(x), QK, type_size))


def aborts_error(name: str, block: int, n_per_row: int) -> QuantError:
    """The error for super-block ``block`` (counted over all rows) of an input."""
    row, col = divmod(block * QK, n_per_row)
    return QuantError(
        f"{name}: llama.cpp's quantizer aborts on row {row}, values {col}..{col + QK - 1}: "
        "NaN or infinite values, or magnitudes whose squares overflow float32"
    )


def quantize(kind: int, x, imatrix, out, name: str, type_size: int) -> np.ndarray:
    """IQ2_XXS (``kind`` 0), IQ2_XS (1) or IQ2_S (2) bytes of ``x``, as ggml's
    ``quantize_iq2_*``; IQ2_XXS and IQ2_XS need ``imatrix``."""
    grid_name = ("iq2xxs_grid", "iq2xs_grid", "iq2s_grid")[kind]
    return run(_kernel, kind, grid_name, x, imatrix, out, name, type_size, kind != 2)
