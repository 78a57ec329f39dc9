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
raises :class:`QuantError` naming the row and values.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from llamacpy.quants._helpers import F0, F1, F32, fp32_to_fp16, store_f16
from llamacpy.quants._iq2quant import (
    FLT_MAX,
    nearest_candidate,
    run,
    scale_code,
    sigma2_of,
)
from llamacpy.quants._iqgrid import QK
from llamacpy.simd import f32x16, vload_f32, vselect_gt, vsplat_f32, vzero_f32

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
_LANES = 16
_IOTA = np.arange(_LANES, dtype=np.float32)
# IQ1_M's level-square differences x[0]^2 - x[1]^2, x[1]^2 - x[2]^2 (+ and - shifts)
_CP1, _CP2 = X_P[0] * X_P[0] - X_P[1] * X_P[1], X_P[1] * X_P[1] - X_P[2] * X_P[2]
_CM1, _CM2 = X_M[0] * X_M[0] - X_M[1] * X_M[1], X_M[1] * X_M[1] - X_M[2] * X_M[2]


@intrinsic
def _vlt_eq(typingctx, v, s):
    """``(lanes < s, lanes == s)`` of an ``f32x16`` as bit masks (ordered: NaN never)."""
    if v != f32x16 or s != types.float32:
        return None

    def cg(context, builder, sig, args):
        vs = builder.insert_element(ir.Constant(args[0].type, None), args[1], ir.IntType(32)(0))
        zeros = ir.Constant(ir.VectorType(ir.IntType(32), _LANES), [0] * _LANES)
        vs = builder.shuffle_vector(vs, vs, zeros)

        def bits(op):
            m = builder.bitcast(builder.fcmp_ordered(op, args[0], vs), ir.IntType(_LANES))
            return builder.zext(m, ir.IntType(64))

        return cgutils.make_anonymous_struct(builder, [bits("<"), bits("==")])

    return types.Tuple((types.int64, types.int64))(v, s), cg


@intrinsic
def _popcount(typingctx, m):
    """The number of set bits of an int64."""
    if m != types.int64:
        return None

    def cg(context, builder, sig, args):
        i64 = ir.IntType(64)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(i64, [i64]), "llvm.ctpop.i64"
        )
        return builder.call(fn, [args[0]])

    return types.int64(m), cg


@njit(cache=True, error_model="numpy")
def _merge_order(x, o, n, idx):
    """glibc's merge sort (top-down; ``n`` a power of two, so merging runs of 1, 2, 4, ...
    is the same) of ``x[o:o + n]`` by ggml's comparator, NaN equal to everything."""
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
def sort_order(x, o, n, idx):
    """``idx``: the indices of ``x[o:o + n]`` in ascending order as glibc's ``qsort`` leaves
    them with ggml's comparator: a stable sort (glibc's merge sort), so without a NaN each
    index goes to its rank (the smaller elements and the equal ones before it, counted 16
    at a time)."""
    nan = False
    for j in range(n):
        nan |= x[o + j] != x[o + j]
    if nan:
        _merge_order(x, o, n, idx)
        return
    for i in range(n):
        xi = x[o + i]
        r = 0
        for h in range(n // _LANES):  # 16 elements j at a time
            lt, eq = _vlt_eq(vload_f32(x, o + _LANES * h), xi)
            before = (1 << max(0, min(_LANES, i - _LANES * h))) - 1
            r += _popcount(lt) + _popcount(eq & before)
        idx[r] = i


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


@intrinsic
def _vmask_gt2(typingctx, a, b, c, d):
    """The lanes (bit ``j``: lane ``j``) with ``a > b`` and ``c > d`` (ordered: NaN never),
    ``f32x16``."""
    if not all(t == f32x16 for t in (a, b, c, d)):
        return None

    def cg(context, builder, sig, args):
        m = builder.and_(
            builder.fcmp_ordered(">", args[0], args[1]), builder.fcmp_ordered(">", args[2], args[3])
        )
        return builder.zext(builder.bitcast(m, ir.IntType(_LANES)), ir.IntType(64))

    return types.int64(a, b, c, d), cg


@intrinsic
def _ctz(typingctx, m):
    """The index of the lowest set bit of a non-zero int64."""
    if m != types.int64:
        return None

    def cg(context, builder, sig, args):
        i64 = ir.IntType(64)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(i64, [i64, ir.IntType(1)]), "llvm.cttz.i64"
        )
        return builder.call(fn, [args[0], ir.IntType(1)(1)])

    return types.int64(m), cg


@njit(cache=True, inline="always")
def _fits(qx, q2, best, valid):
    """The lanes below ``valid`` with C's ``sumq2 > 0 && sumqx^2 > best * sumq2``."""
    zero = vzero_f32()
    q2 = vselect_gt(vsplat_f32(valid), vload_f32(_IOTA, 0), q2, zero)  # padding: never
    return _vmask_gt2(q2, zero, qx * qx, vsplat_f32(best) * q2)


@njit(cache=True, inline="always")
def _cand_s(sumx, sumw, i1, i2, xx):
    """C's ``sumqx``, ``sumq2`` of the split ``(i1, i2)`` with levels ``xx``."""
    a, b, c = sumx[i1] - sumx[0], sumx[i2] - sumx[i1], sumx[32] - sumx[i2]
    wa, wb, wc = sumw[i1] - sumw[0], sumw[i2] - sumw[i1], sumw[32] - sumw[i2]
    sumqx = a * xx[0] + b * xx[1] + c * xx[2]
    sumq2 = wa * xx[0] * xx[0] + wb * xx[1] * xx[1] + wc * xx[2] * xx[2]
    return sumqx, sumq2


@njit(cache=True, inline="always")
def _vcand_s(sumx, sumw, i1, s, xx):
    """:func:`_cand_s` of the splits ``(i1, s + lane)``, one per lane (the same arithmetic)."""
    a, wa = vsplat_f32(sumx[i1] - sumx[0]), vsplat_f32(sumw[i1] - sumw[0])
    x2, w2 = vload_f32(sumx, s), vload_f32(sumw, s)
    b, wb = x2 - vsplat_f32(sumx[i1]), w2 - vsplat_f32(sumw[i1])
    c, wc = vsplat_f32(sumx[32]) - x2, vsplat_f32(sumw[32]) - w2
    p0, p1, p2 = vsplat_f32(xx[0]), vsplat_f32(xx[1]), vsplat_f32(xx[2])
    return a * p0 + b * p1 + c * p2, wa * p0 * p0 + wb * p1 * p1 + wc * p2 * p2


@njit(cache=True, error_model="numpy")
def _split_s(x, o, weight, idx):
    """IQ1_S's exhaustive split search over the 32 sorted weights: ``(scale, i1, i2,
    shift)``, ``shift`` 0 where no split fits. The candidates are scored 16 at a time; a
    run of 16 none of which could beat the best so far (the test C makes, against the same
    best) is passed over; of the others, each lane that could is taken in C's order."""
    sumx = np.zeros(33 + _LANES, np.float32)
    sumw = np.zeros(33 + _LANES, np.float32)
    for j in range(32):
        i = idx[j]
        sumx[j + 1] = sumx[j] + weight[i] * x[o + i]
        sumw[j + 1] = sumw[j] + weight[i]
    best = -FLT_MAX
    scale = F0
    b1 = b2 = -1
    shift = 0
    for i1 in range(33):
        for s in range(i1, 33, _LANES):
            valid = F32(33 - s)
            qxp, q2p = _vcand_s(sumx, sumw, i1, s, X_P)
            qxm, q2m = _vcand_s(sumx, sumw, i1, s, X_M)
            lo = 0
            while True:  # the next lane that could beat the best so far, in C's order
                m = (_fits(qxp, q2p, best, valid) | _fits(qxm, q2m, best, valid)) >> lo << lo
                if m == 0:
                    break
                lane = _ctz(m)
                lo = lane + 1
                i2 = s + lane
                for sh in (1, -1):
                    sumqx, sumq2 = _cand_s(sumx, sumw, i1, i2, X_P if sh == 1 else X_M)
                    if sumq2 > F0 and sumqx * sumqx > best * sumq2:
                        scale = sumqx / sumq2
                        best = scale * sumqx
                        b1, b2, shift = i1, i2, sh
    return scale, b1, b2, shift


@njit(cache=True, inline="always")
def _halves_m(px, pw, i1, i2, h):
    """IQ1_M's per-half ``(sumqx +, sumqx -, sumq2 +, sumq2 -)`` of the split ``(i1, i2)``."""
    sx = px[h, i1] + px[h, i2]
    t, w = px[h, 16], pw[h, 16]
    qxp = t * X_P[2] - sx
    qxm = t * X_M[2] - sx
    q2p = w * X_P[2] * X_P[2] + pw[h, i1] * _CP1 + pw[h, i2] * _CP2
    q2m = w * X_M[2] * X_M[2] + pw[h, i1] * _CM1 + pw[h, i2] * _CM2
    return qxp, qxm, q2p, q2m


@njit(cache=True, inline="always")
def _vhalves_m(px, pw, i1, s, h):
    """:func:`_halves_m` of the splits ``(i1, s + lane)``, one per lane."""
    sx = vsplat_f32(px[h, i1]) + vload_f32(px[h], s)
    t, w = px[h, 16], pw[h, 16]
    qxp = vsplat_f32(t * X_P[2]) - sx
    qxm = vsplat_f32(t * X_M[2]) - sx
    p2 = vload_f32(pw[h], s)
    q2p = vsplat_f32(w * X_P[2] * X_P[2] + pw[h, i1] * _CP1) + p2 * vsplat_f32(_CP2)
    q2m = vsplat_f32(w * X_M[2] * X_M[2] + pw[h, i1] * _CM1) + p2 * vsplat_f32(_CM2)
    return qxp, qxm, q2p, q2m


@njit(cache=True, error_model="numpy")
def _split_m(x, o, weight, idx):
    """IQ1_M's split search over the 16 sorted weights, one shift per half: ``(scale, i1,
    i2, k)`` with ``k`` = 2 * (first half shifted down) + (second half shifted down), -1
    where no split fits. Scored 16 candidates at a time as in :func:`_split_s`."""
    px = np.zeros((2, 17 + _LANES), np.float32)
    pw = np.zeros((2, 17 + _LANES), np.float32)
    for j in range(16):
        i = idx[j]
        h = 0 if i < 8 else 1
        px[h, j + 1] = px[h, j] + weight[i] * x[o + i]
        px[1 - h, j + 1] = px[1 - h, j]
        pw[h, j + 1] = pw[h, j] + weight[i]
        pw[1 - h, j + 1] = pw[1 - h, j]
    best = -FLT_MAX
    scale = F0
    b1 = b2 = bk = -1
    for i1 in range(17):
        for s in range(i1, 17, _LANES):
            valid = F32(17 - s)
            xp0, xm0, qp0, qm0 = _vhalves_m(px, pw, i1, s, 0)
            xp1, xm1, qp1, qm1 = _vhalves_m(px, pw, i1, s, 1)
            xpp, qpp, xpm, qpm = xp0 + xp1, qp0 + qp1, xp0 + xm1, qp0 + qm1
            xmp, qmp, xmm, qmm = xm0 + xp1, qm0 + qp1, xm0 + xm1, qm0 + qm1
            lo = 0
            while True:  # the next lane that could beat the best so far, in C's order
                m = _fits(xpp, qpp, best, valid) | _fits(xpm, qpm, best, valid)
                m = (m | _fits(xmp, qmp, best, valid) | _fits(xmm, qmm, best, valid)) >> lo << lo
                if m == 0:
                    break
                lane = _ctz(m)
                lo = lane + 1
                i2 = s + lane
                xp0, xm0, qp0, qm0 = _halves_m(px, pw, i1, i2, 0)
                xp1, xm1, qp1, qm1 = _halves_m(px, pw, i1, i2, 1)
                for k in range(4):  # (+, +), (+, -), (-, +), (-, -)
                    sqx = (xm0 if k >= 2 else xp0) + (xm1 if k & 1 else xp1)
                    sq2 = (qm0 if k >= 2 else qp0) + (qm1 if k & 1 else qp1)
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
