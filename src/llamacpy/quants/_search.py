"""Scale searches of ggml's K-quants and non-linear quants (numba).

Faithful float32 ports of ``make_qx_quants``, ``make_qkx2_quants`` / ``make_qkx3_quants``,
``make_qp_quants`` and ``best_index_int8`` from ggml-quants.c (``make_q3_quants`` exists only
16 groups at a time, in ``_lanes.py``). The
arithmetic order and the integer widths of the C code are kept on purpose (``(w*l)*l``, not
``w*(l*l)``; ``uint8_t``/``int8_t`` stores wrap) so that the results are bit-identical. The
vectorized numpy twins are in ``_search_np.py``.

Arrays passed in are 1-D slices; ``L``/``Laux`` output arrays must have the C element type
(int8 for ``make_qx_quants``, uint8 for the others).
"""

from __future__ import annotations

from numba import njit

from llamacpy.quants._helpers import F0, F1, F32, GROUP_MAX_EPS, nearest_int

_TENTH = F32(0.1)


@njit(cache=True, error_model="numpy")
def make_qx_quants(n, nmax, x, L, w):
    """Symmetric quants ``L[i] in [0, 2*nmax)`` (offset by nmax) and the float scale.

    ggml's ``make_qx_quants`` with ``rmse_type == 1``; ``w`` holds the weights (``x*x`` when
    ggml is given no quant weights).
    """
    mx = F0
    amax = F0
    for i in range(n):
        ax = abs(x[i])
        if ax > amax:
            amax = ax
            mx = x[i]
    if amax < GROUP_MAX_EPS:
        for i in range(n):
            L[i] = 0
        return F0
    iscale = F32(-nmax) / mx
    sumlx = F0
    suml2 = F0
    for i in range(n):
        l = max(-nmax, min(nmax - 1, nearest_int(iscale * x[i])))
        L[i] = l + nmax
        fl = F32(l)
        sumlx += w[i] * x[i] * fl
        suml2 += w[i] * fl * fl
    scale = sumlx / suml2 if suml2 != F0 else F0
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        iscale = -(F32(nmax) + _TENTH * F32(step)) / mx
        sumlx = F0
        suml2 = F0
        for i in range(n):
            fl = F32(max(-nmax, min(nmax - 1, nearest_int(iscale * x[i]))))
            sumlx += w[i] * x[i] * fl
            suml2 += w[i] * fl * fl
        if suml2 > F0 and sumlx * sumlx > best * suml2:
            for i in range(n):
                L[i] = nmax + max(-nmax, min(nmax - 1, nearest_int(iscale * x[i])))
            scale = sumlx / suml2
            best = scale * sumlx
    return scale


@njit(cache=True, error_model="numpy")
def make_qkx_quants(n, nmax, x, w, L, Laux, rmin, rdelta, nstep, use_mad):
    """Asymmetric quants ``L[i] in [0, nmax]``; returns ``(scale, the_min)`` with
    ``x ~= scale*L - the_min``.

    This is ggml's ``make_qkx2_quants`` and, with explicit weights, ``make_qkx3_quants`` (the
    two differ only in ``max == min`` vs ``max <= min``, which agree for non-NaN data).
    """
    mn = x[0]
    mx = x[0]
    sum_w = w[0]
    sum_x = sum_w * x[0]
    for i in range(1, n):
        if x[i] < mn:
            mn = x[i]
        if x[i] > mx:
            mx = x[i]
        sum_w += w[i]
        sum_x += w[i] * x[i]
    if mn > F0:
        mn = F0
    if mx <= mn:
        for i in range(n):
            L[i] = 0
        return F0, -mn
    iscale = F32(nmax) / (mx - mn)
    scale = F1 / iscale
    best_error = F0
    for i in range(n):
        l = max(0, min(nmax, nearest_int(iscale * (x[i] - mn))))
        L[i] = l
        diff = scale * F32(l) + mn - x[i]
        diff = abs(diff) if use_mad else diff * diff
        best_error += w[i] * diff
    if nstep < 1:
        return scale, -mn
    for step in range(nstep + 1):
        iscale = (rmin + rdelta * F32(step) + F32(nmax)) / (mx - mn)
        sum_l = F0
        sum_l2 = F0
        sum_xl = F0
        for i in range(n):
            l = max(0, min(nmax, nearest_int(iscale * (x[i] - mn))))
            Laux[i] = l
            fl = F32(l)
            sum_l += w[i] * fl
            sum_l2 += w[i] * fl * fl
            sum_xl += w[i] * fl * x[i]
        D = sum_w * sum_l2 - sum_l * sum_l
        if D > F0:
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            if this_min > F0:
                this_min = F0
                this_scale = sum_xl / sum_l2
            cur_error = F0
            for i in range(n):
                diff = this_scale * F32(Laux[i]) + this_min - x[i]
                diff = abs(diff) if use_mad else diff * diff
                cur_error += w[i] * diff
            if cur_error < best_error:
                for i in range(n):
                    L[i] = Laux[i]
                best_error = cur_error
                scale = this_scale
                mn = this_min
    return scale, -mn


@njit(cache=True, error_model="numpy")
def make_qp_quants(n, nmax, x, L, qw):
    """ggml's ``make_qp_quants``: quantize non-negative ``x`` (sub-block scales) to
    ``[0, nmax]`` with weights ``qw``; returns the scale."""
    mx = F0
    for i in range(n):
        mx = mx if mx > x[i] else x[i]
    if mx < GROUP_MAX_EPS:
        for i in range(n):
            L[i] = 0
        return F0
    iscale = F32(nmax) / mx
    for i in range(n):
        L[i] = nearest_int(iscale * x[i])
    scale = F1 / iscale
    best_mse = F0
    for i in range(n):
        diff = x[i] - scale * F32(L[i])
        best_mse += qw[i] * diff * diff
    for step in range(-4, 5):
        if step == 0:
            continue
        iscale_is = (_TENTH * F32(step) + F32(nmax)) / mx
        scale_is = F1 / iscale_is
        mse = F0
        for i in range(n):
            l = min(nmax, nearest_int(iscale_is * x[i]))
            diff = x[i] - scale_is * F32(l)
            mse += qw[i] * diff * diff
        if mse < best_mse:
            best_mse = mse
            iscale = iscale_is
    sumlx = F0
    suml2 = F0
    for i in range(n):
        l = min(nmax, nearest_int(iscale * x[i]))
        L[i] = l
        sumlx += qw[i] * x[i] * F32(l)
        suml2 += qw[i] * F32(l) * F32(l)
    for _ in range(5):
        n_changed = 0
        for i in range(n):
            w = qw[i]
            li = F32(L[i])
            slx = sumlx - w * x[i] * li
            sl2 = suml2 - w * li * li
            if slx > F0 and sl2 > F0:
                new_l = min(nmax, nearest_int(x[i] * sl2 / slx))
                if new_l != L[i]:
                    slx += w * x[i] * F32(new_l)
                    sl2 += w * F32(new_l) * F32(new_l)
                    if slx * slx * suml2 > sumlx * sumlx * sl2:
                        L[i] = new_l
                        sumlx = slx
                        suml2 = sl2
                        n_changed += 1
        if n_changed == 0:
            break
    return sumlx / suml2 if suml2 > F0 else F0


@njit(cache=True, error_model="numpy")
def best_index_int8(values, x):
    """Index of the entry of the sorted table ``values`` nearest to float32 ``x``.

    ``values`` is ggml's int8 table as float32 (C compares the promoted values). ggml
    bisects; the bracket it ends with is ``values[mu-1] <= x < values[mu]``, i.e. ``mu`` is
    the number of entries ``<= x``, which is counted here without branches (same result,
    NaN included).
    """
    n = values.size
    if x <= values[0]:
        return 0
    if x >= values[n - 1] or x != x:
        return n - 1
    mu = 0
    for k in range(n):
        mu += values[k] <= x
    return mu - 1 if x - values[mu - 1] < values[mu] - x else mu


@njit(cache=True, error_model="numpy")
def get_scale_min_k4(j, q, o):
    """6-bit scale and min of sub-block ``j`` from the 12 packed bytes at ``q[o:]``."""
    if j < 4:
        return q[o + j] & 63, q[o + j + 4] & 63
    d = (q[o + j + 4] & 0xF) | ((q[o + j - 4] >> 6) << 4)
    m = (q[o + j + 4] >> 4) | ((q[o + j] >> 6) << 4)
    return d, m


@njit(cache=True, error_model="numpy")
def put_scale_min_k4(j, q, o, ls, lm):
    """Pack 6-bit scale ``ls`` and min ``lm`` of sub-block ``j`` (call for j = 0..7 in order,
    with ``q[o:o+12]`` zeroed first)."""
    if j < 4:
        q[o + j] = ls
        q[o + j + 4] = lm
    else:
        q[o + j + 4] = (ls & 0xF) | ((lm & 0xF) << 4)
        q[o + j - 4] |= (ls >> 4) << 6
        q[o + j] |= (lm >> 4) << 6
