"""Quantization of IQ1_S and IQ1_M: ggml's ``quantize_row_iq1_s_impl`` and
``quantize_row_iq1_m_impl`` (numba).

Per group of 32 (IQ1_S) or 16 (IQ1_M) weights the values are ``-1, 0, 1`` shifted by
``delta = +-1/8`` (IQ1_M: one sign of ``delta`` per 8 weights). The weights are sorted
(glibc's ``qsort``, a stable merge sort here), and every split of the sorted weights into
three runs is scored with prefix sums: the split and shift with the best weighted
least-squares fit give the levels. Where 8 levels are no point of the 2048-point ternary
grid, the best of the code's grid neighbours (:func:`._iq2quant.tables`) at the fitted
scale replaces them and the scale is refitted. The super-block ``d`` is the largest
sub-block scale over 15 (IQ1_S: times 1.125; IQ1_M: refitted over the whole super-block,
times 1.1125), each sub-block storing a 3-bit multiple ``2 ls + 1`` of it.

Where ggml's quantizer aborts (a NaN sub-block scale, an off-grid group no candidate fits,
its full-grid fallback reading past the input: NaN or infinite input), :func:`quantize`
raises :class:`QuantError` naming the super-block.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from llamacpy.quants._helpers import F0, F1, F32, fp32_to_fp16, store_f16
from llamacpy.quants._iq2quant import (
    FLT_MAX,
    nearest_candidate,
    run,
    scale_code,
    sigma2_of,
)
from llamacpy.quants._iqgrid import QK

_DELTA = F32(0.125)  # IQ1S_DELTA, IQ1M_DELTA
# the shifted levels: x_p (delta > 0), x_m (delta < 0)
X_P = np.array([-F1 + _DELTA, _DELTA, F1 + _DELTA], np.float32)
X_M = np.array([-F1 - _DELTA, -_DELTA, F1 - _DELTA], np.float32)
_EPS_S = F32(1e-12)  # GROUP_MAX_EPS_IQ1_S
_EPS_M = F32(1e-7)  # GROUP_MAX_EPS_IQ1_M
_15 = F32(15.0)
_FUDGE_S = F32(1.125)
_FUDGE_M = F32(1.1125)
_NGRID = 2048


@njit(cache=True, error_model="numpy")
def sort_order(x, o, n, idx):
    """``idx``: the indices of ``x[o:o + n]`` in ascending order as glibc's ``qsort`` leaves
    them with ggml's comparator (a stable top-down merge sort; NaN compares equal to
    everything). ``n`` is a power of two, so merging runs of 1, 2, 4, ... is the same."""
    tmp = np.empty(n, np.int64)
    for j in range(n):
        idx[j] = j
    width = 1
    while width < n:
        for lo in range(0, n, 2 * width):
            a, b, t = lo, lo + width, lo
            while a < lo + width and b < lo + 2 * width:
                if x[o + idx[a]] > x[o + idx[b]]:
                    tmp[t] = idx[b]
                    b += 1
                else:
                    tmp[t] = idx[a]
                    a += 1
                t += 1
            while a < lo + width:
                tmp[t] = idx[a]
                a += 1
                t += 1
            while b < lo + 2 * width:
                tmp[t] = idx[b]
                b += 1
                t += 1
        idx[:] = tmp
        width *= 2


@njit(cache=True, error_model="numpy")
def best_neighbour2(tabs, u, x, o, weight, wo, scale, xx, L, lo):
    """ggml's ``iq1_find_best_neighbour2`` for the off-grid code ``u`` of the 8 weights at
    ``x[o:]``: the candidate with the least ``sum w * (scale * xx[l] - x)**2`` (first of
    equals, below FLT_MAX), its levels to ``L[lo:lo + 8]``. Where no neighbour qualifies,
    ggml scans the whole grid, comparing each point's levels with one element
    ``x[o + point]`` (reading past the group: past the input is undefined, -1 here); -1
    where nothing qualifies (ggml asserts)."""
    levels = tabs[0]
    gi = nearest_candidate(tabs, u, x, o, weight, wo, scale, F1, xx[0])  # xx[l] = l + xx[0]
    if gi < 0:
        best = FLT_MAX
        if o + _NGRID > x.size:
            return -1
        for g in range(_NGRID):
            d2 = F0
            for i in range(8):
                diff = scale * xx[levels[g, i]] - x[o + g]
                d2 += weight[wo + i] * diff * diff
            if d2 < best:
                best = d2
                gi = g
    if gi >= 0:
        for i in range(8):
            L[lo + i] = levels[gi, i]
    return gi


@njit(cache=True, error_model="numpy")
def _weights(x, o, n, qw, qo, use_qw, sigma2, weight):
    """The weights of ``x[o:o + n]`` (importance ``qw[qo:]``); returns the largest ``|x|``
    (C's ``MAX`` order)."""
    for i in range(n):
        v = x[o + i]
        weight[i] = qw[qo + i] * np.sqrt(sigma2 + v * v) if use_qw else v * v
    mx = abs(x[o])
    for i in range(1, n):
        a = abs(x[o + i])
        mx = mx if mx > a else a
    return mx


@njit(cache=True, error_model="numpy")
def _split_s(x, o, weight, idx):
    """IQ1_S's exhaustive split search over the 32 sorted weights: ``(scale, i1, i2,
    shift)``, ``shift`` 0 where no split fits."""
    sumx = np.zeros(33, np.float32)
    sumw = np.zeros(33, np.float32)
    for j in range(32):
        i = idx[j]
        sumx[j + 1] = sumx[j] + weight[i] * x[o + i]
        sumw[j + 1] = sumw[j] + weight[i]
    p0, p1, p2 = X_P[0], X_P[1], X_P[2]
    m0, m1, m2 = X_M[0], X_M[1], X_M[2]
    best = -FLT_MAX
    scale = F0
    b1 = b2 = -1
    shift = 0
    for i1 in range(33):
        for i2 in range(i1, 33):
            a, b, c = sumx[i1] - sumx[0], sumx[i2] - sumx[i1], sumx[32] - sumx[i2]
            wa, wb, wc = sumw[i1] - sumw[0], sumw[i2] - sumw[i1], sumw[32] - sumw[i2]
            sumqx = a * p0 + b * p1 + c * p2
            sumq2 = wa * p0 * p0 + wb * p1 * p1 + wc * p2 * p2
            if sumq2 > F0 and sumqx * sumqx > best * sumq2:
                scale = sumqx / sumq2
                best = scale * sumqx
                b1, b2, shift = i1, i2, 1
            sumqx = a * m0 + b * m1 + c * m2
            sumq2 = wa * m0 * m0 + wb * m1 * m1 + wc * m2 * m2
            if sumq2 > F0 and sumqx * sumqx > best * sumq2:
                scale = sumqx / sumq2
                best = scale * sumqx
                b1, b2, shift = i1, i2, -1
    return scale, b1, b2, shift


@njit(cache=True, error_model="numpy")
def _split_m(x, o, weight, idx):
    """IQ1_M's split search over the 16 sorted weights, one shift per half: ``(scale, i1,
    i2, k)`` with ``k`` = 2 * (first half shifted down) + (second half shifted down), -1
    where no split fits."""
    px = np.zeros((2, 17), np.float32)
    pw = np.zeros((2, 17), np.float32)
    for j in range(16):
        i = idx[j]
        h = 0 if i < 8 else 1
        px[h, j + 1] = px[h, j] + weight[i] * x[o + i]
        px[1 - h, j + 1] = px[1 - h, j]
        pw[h, j + 1] = pw[h, j] + weight[i]
        pw[1 - h, j + 1] = pw[1 - h, j]
    p2, m2 = X_P[2], X_M[2]
    cp1 = X_P[0] * X_P[0] - X_P[1] * X_P[1]
    cp2 = X_P[1] * X_P[1] - X_P[2] * X_P[2]
    cm1 = X_M[0] * X_M[0] - X_M[1] * X_M[1]
    cm2 = X_M[1] * X_M[1] - X_M[2] * X_M[2]
    best = -FLT_MAX
    scale = F0
    b1 = b2 = bk = -1
    t0, t1, w0, w1 = px[0, 16], px[1, 16], pw[0, 16], pw[1, 16]
    for i1 in range(17):
        for i2 in range(i1, 17):
            sx = px[0, i1] + px[0, i2]
            qxp0 = t0 * p2 - sx
            qxm0 = t0 * m2 - sx
            q2p0 = w0 * p2 * p2 + pw[0, i1] * cp1 + pw[0, i2] * cp2
            q2m0 = w0 * m2 * m2 + pw[0, i1] * cm1 + pw[0, i2] * cm2
            sx = px[1, i1] + px[1, i2]
            qxp1 = t1 * p2 - sx
            qxm1 = t1 * m2 - sx
            q2p1 = w1 * p2 * p2 + pw[1, i1] * cp1 + pw[1, i2] * cp2
            q2m1 = w1 * m2 * m2 + pw[1, i1] * cm1 + pw[1, i2] * cm2
            for k in range(4):  # (+, +), (+, -), (-, +), (-, -)
                sqx = (qxm0 if k >= 2 else qxp0) + (qxm1 if k & 1 else qxp1)
                sq2 = (q2m0 if k >= 2 else q2p0) + (q2m1 if k & 1 else q2p1)
                if sq2 > F0 and sqx * sqx > best * sq2:
                    scale = sqx / sq2
                    best = scale * sqx
                    b1, b2, bk = i1, i2, k
    return scale, b1, b2, bk


@njit(cache=True, error_model="numpy")
def _levels(n, idx, b1, b2, L):
    for j in range(n):
        L[idx[j]] = 0 if j < b1 else (1 if j < b2 else 2)


@njit(cache=True, error_model="numpy")
def _to_grid(x, o, n, weight, scale, shifts_of, tabs, L, index):
    """Grid indices of the groups of 8 to ``index`` (neighbours where off the grid) and the
    refitted scale; NaN where ggml aborts. ``shifts_of[k]``: group ``k`` uses ``X_M``."""
    all_on = True
    for k in range(n // 8):
        u = 0
        for j in range(8):
            u |= np.int64(L[8 * k + j]) << (2 * j)
        g = np.int64(tabs[2][u])
        if g < 0:
            all_on = False
            xx = X_M if shifts_of[k] else X_P
            g = best_neighbour2(tabs, u, x, o + 8 * k, weight, 8 * k, scale, xx, L, 8 * k)
            if g < 0:
                return np.float32(np.nan)
        index[k] = g
    if not all_on:
        sumqx = F0
        sumq2 = F0
        for k in range(n // 8):
            xx = X_M if shifts_of[k] else X_P
            for j in range(8):
                w = weight[8 * k + j]
                q = xx[tabs[0][index[k], j]]
                sumqx += w * q * x[o + 8 * k + j]
                sumq2 += w * q * q
        if sumqx > F0 and sumq2 > F0:
            scale = sumqx / sumq2
    return scale


@njit(cache=True, error_model="numpy")
def _block_s(x, o, qw, qo, use_qw, tabs, out, ob):
    """One super-block of IQ1_S to ``out[ob:]`` (d | qs[32] | qh[8] u16); False where ggml
    aborts."""
    sigma2 = sigma2_of(x, o, True)
    out[ob : ob + 50] = 0
    weight = np.empty(32, np.float32)
    idx = np.empty(32, np.int64)
    L = np.empty(32, np.int64)
    index = np.empty(4, np.int64)
    down = np.zeros(4, np.bool_)
    scales = np.zeros(8, np.float32)
    shifts = np.ones(8, np.int64)
    max_scale = F0
    for ib in range(8):
        xo = o + 32 * ib
        mx = _weights(x, xo, 32, qw, qo + 32 * ib, use_qw, sigma2, weight)
        if mx < _EPS_S:
            continue
        sort_order(x, xo, 32, idx)
        scale, b1, b2, shift = _split_s(x, xo, weight, idx)
        if b1 < 0 or b2 < 0 or shift == 0:
            continue
        _levels(32, idx, b1, b2, L)
        if scale < F0:
            for j in range(32):
                L[j] = 2 - L[j]
            scale = -scale
            shift = -shift
        down[:] = shift == -1
        scale = _to_grid(x, xo, 32, weight, scale, down, tabs, L, index)
        if not scale >= F0:
            return False
        h = 0
        for k in range(4):
            out[ob + 2 + 4 * ib + k] = index[k] & 255
            h |= (index[k] >> 8) << (3 * k)
        out[ob + 34 + 2 * ib] = h & 0xFF
        out[ob + 35 + 2 * ib] = h >> 8
        scales[ib] = scale
        shifts[ib] = shift
        max_scale = max_scale if max_scale > scale else scale
    if max_scale == F0:
        return True
    d = max_scale / _15
    store_f16(out, ob, d * _FUDGE_S)
    idv = F1 / d
    for ib in range(8):
        l = scale_code(idv, scales[ib], 7)
        if shifts[ib] == -1:
            l |= 8
        out[ob + 35 + 2 * ib] |= l << 4
    return True


@njit(cache=True, error_model="numpy")
def _block_m(x, o, qw, qo, use_qw, tabs, out, ob):
    """One super-block of IQ1_M to ``out[ob:]`` (qs[32] | qh[16] | four u16 scale words);
    False where ggml aborts."""
    sigma2 = sigma2_of(x, o, True)
    out[ob : ob + 56] = 0
    weight = np.empty(QK, np.float32)
    idx = np.empty(16, np.int64)
    L = np.empty(16, np.int64)
    index = np.empty(2, np.int64)
    down = np.zeros(2, np.bool_)
    scales = np.zeros(16, np.float32)
    shifts = np.zeros(16, np.int64)
    max_scale = F0
    for ib in range(16):
        xo = o + 16 * ib
        w = weight[16 * ib : 16 * ib + 16]
        mx = _weights(x, xo, 16, qw, qo + 16 * ib, use_qw, sigma2, w)
        if mx < _EPS_M:
            continue
        sort_order(x, xo, 16, idx)
        scale, b1, b2, k = _split_m(x, xo, w, idx)
        if b1 < 0 or b2 < 0 or k < 0:
            continue
        _levels(16, idx, b1, b2, L)
        if scale < F0:
            for j in range(16):
                L[j] = 2 - L[j]
            scale = -scale
            k = 3 - k
        down[0] = k >= 2
        down[1] = k % 2 == 1
        scale = _to_grid(x, xo, 16, w, scale, down, tabs, L, index)
        if not scale >= F0:
            return False
        out[ob + 2 * ib] = index[0] & 255
        out[ob + 2 * ib + 1] = index[1] & 255
        out[ob + 32 + ib] = (index[0] >> 8) | ((index[1] >> 8) << 4)
        scales[ib] = scale
        shifts[ib] = k
        max_scale = max_scale if max_scale > scale else scale
    if max_scale == F0:
        return True
    _finish_m(x, o, weight, scales, shifts, max_scale, tabs, out, ob)
    return True


@njit(cache=True, error_model="numpy")
def _finish_m(x, o, weight, scales, shifts, max_scale, tabs, out, ob):
    """IQ1_M's scale codes, delta signs and the refitted super-block ``d``."""
    sc = np.zeros(4, np.int64)
    d = max_scale / _15
    idv = F1 / d
    sumqx = F0
    sumq2 = F0
    for ib in range(16):
        l = scale_code(idv, scales[ib], 7)
        sc[ib // 4] |= l << (3 * (ib % 4))
        k = shifts[ib]
        out[ob + 32 + ib] |= (0x80 if k & 1 else 0) | (0x08 if k & 2 else 0)
        h = np.int64(out[ob + 32 + ib])
        ls = F32(2 * l + 1)
        for g in range(2):
            xx = X_M if (k >= 2 if g == 0 else k % 2 == 1) else X_P
            gi = np.int64(out[ob + 2 * ib + g]) + ((h << (8 - 4 * g)) & 0x700)
            for j in range(8):
                w = weight[16 * ib + 8 * g + j]
                q = xx[tabs[0][gi, j]] * ls
                sumqx += w * q * x[o + 16 * ib + 8 * g + j]
                sumq2 += w * q * q
    if sumq2 > F0:
        d = sumqx / sumq2
    s = fp32_to_fp16(d * _FUDGE_M)
    sc[0] |= (s & 0x000F) << 12
    sc[1] |= (s & 0x00F0) << 8
    sc[2] |= (s & 0x0F00) << 4
    sc[3] |= s & 0xF000
    for j in range(4):
        out[ob + 48 + 2 * j] = sc[j] & 0xFF
        out[ob + 49 + 2 * j] = sc[j] >> 8


@njit(cache=True, parallel=True, error_model="numpy")
def _kernel(t, rows, qw, rows_per_qw, use_qw, tabs, out, bad):
    """Every super-block of ``rows`` (format ``t``: 0 IQ1_S, 1 IQ1_M) to ``out``;
    ``bad[b]`` set where ggml aborts on super-block ``b``."""
    nrows, n = rows.shape
    nb = n // QK
    size = out.shape[1] // nb
    flat = rows.reshape(-1)
    for b in prange(nrows * nb):
        r, i = b // nb, b % nb
        w = qw[r // rows_per_qw]
        o = r * n + i * QK
        if t == 0:
            ok = _block_s(flat, o, w, i * QK, use_qw, tabs, out[r], i * size)
        else:
            ok = _block_m(flat, o, w, i * QK, use_qw, tabs, out[r], i * size)
        bad[b] = not ok


def quantize(kind: int, x, imatrix, out, name: str, type_size: int) -> np.ndarray:
    """IQ1_S (``kind`` 0) or IQ1_M (1) bytes of ``x``, as ggml's ``quantize_iq1_*``; IQ1_S
    needs ``imatrix``."""
    return run(_kernel, kind, "iq1s_grid", x, imatrix, out, name, type_size, kind == 0)
