"""Vectorized numpy twins of the scale searches in ``_search.py``.

Each function works on many groups at once: ``x`` and the weights have shape
``(groups, n)``. Loops run over the ``n`` elements and the search steps (in ggml's order, so
float32 sums accumulate exactly as in C), never over groups. Results are bit-identical to the
numba versions, which the tests check. ``L`` arrays are returned as int64 holding the value
C would have stored (``uint8_t`` stores wrap modulo 256).
"""

from __future__ import annotations

import numpy as np

from llamacpy.quants._helpers import F0, F1, F32, GROUP_MAX_EPS, nearest_int_np

_TENTH = F32(0.1)


def seqsum(t: np.ndarray) -> np.ndarray:
    """Left-to-right float32 sum along axis 1 (C's ``s += t[i]`` loop, not pairwise)."""
    s = np.zeros(t.shape[0], dtype=np.float32)
    for i in range(t.shape[1]):
        s += t[:, i]
    return s


def absmax_np(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per group: the largest |x| and the first element having it (ggml's ``ax > amax``)."""
    amax = np.zeros(x.shape[0], dtype=np.float32)
    mx = np.zeros(x.shape[0], dtype=np.float32)
    for i in range(x.shape[1]):
        ax = np.abs(x[:, i])
        upd = ax > amax
        amax = np.where(upd, ax, amax)
        mx = np.where(upd, x[:, i], mx)
    return amax, mx


def make_qx_quants_np(nmax: int, x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``make_qx_quants`` (rmse_type 1, weights ``w``): returns (scale, L + nmax)."""
    amax, mx = absmax_np(x)
    zero = amax < GROUP_MAX_EPS
    with np.errstate(all="ignore"):
        iscale = F32(-nmax) / mx
        l = np.clip(nearest_int_np(iscale[:, None] * x), -nmax, nmax - 1)
        fl = l.astype(np.float32)
        sumlx = seqsum(w * x * fl)
        suml2 = seqsum(w * fl * fl)
        scale = np.where(suml2 != F0, sumlx / suml2, F0)
        best = scale * sumlx
        L = l + nmax
        for step in range(-9, 10):
            if step == 0:
                continue
            iscale = -(F32(nmax) + _TENTH * F32(step)) / mx
            l = np.clip(nearest_int_np(iscale[:, None] * x), -nmax, nmax - 1)
            fl = l.astype(np.float32)
            sumlx = seqsum(w * x * fl)
            suml2 = seqsum(w * fl * fl)
            upd = (suml2 > F0) & (sumlx * sumlx > best * suml2)
            L = np.where(upd[:, None], l + nmax, L)
            scale = np.where(upd, sumlx / suml2, scale)
            best = np.where(upd, scale * sumlx, best)
    return np.where(zero, F0, scale), np.where(zero[:, None], 0, L).astype(np.int64)


def make_q3_quants_np(nmax: int, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``make_q3_quants`` with ``do_rmse``: returns (scale, L + nmax)."""
    amax, mx = absmax_np(x)
    zero = amax < GROUP_MAX_EPS
    w = x * x
    with np.errstate(all="ignore"):
        iscale = F32(-nmax) / mx
        L = np.clip(nearest_int_np(iscale[:, None] * x), -nmax, nmax - 1).astype(np.int64)
        fl = L.astype(np.float32)
        sumlx = seqsum(w * x * fl)
        suml2 = seqsum(w * fl * fl)
        # ggml stops after a pass without change; such a pass leaves the state unchanged, so
        # running all five passes gives the same result
        for _ in range(5):
            for i in range(x.shape[1]):
                wi, xi, li = w[:, i], x[:, i], L[:, i].astype(np.float32)
                slx = sumlx - wi * xi * li
                sl2 = suml2 - wi * li * li
                new_l = np.clip(nearest_int_np(xi * sl2 / slx), -nmax, nmax - 1)
                fl = new_l.astype(np.float32)
                slx2 = slx + wi * xi * fl
                sl22 = sl2 + wi * fl * fl
                upd = (slx > F0) & (new_l != L[:, i]) & (sl22 > F0)
                upd &= slx2 * slx2 * suml2 > sumlx * sumlx * sl22
                L[:, i] = np.where(upd, new_l, L[:, i])
                sumlx = np.where(upd, slx2, sumlx)
                suml2 = np.where(upd, sl22, suml2)
        scale = np.where(suml2 > F0, sumlx / suml2, F0)
    return np.where(zero, F0, scale), np.where(zero[:, None], 0, L + nmax)


def make_qkx_quants_np(
    nmax: int,
    x: np.ndarray,
    w: np.ndarray,
    rmin: np.float32,
    rdelta: np.float32,
    nstep: int,
    use_mad: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``make_qkx2_quants`` / ``make_qkx3_quants``: returns (scale, the_min, L)."""
    mn, mx = minmax_np(x)
    sum_w = seqsum(w)
    sum_x = seqsum(w * x)
    mn = np.where(mn > F0, F0, mn)
    flat = mx <= mn

    def error(scale, mn, L):
        diff = scale[:, None] * L.astype(np.float32) + mn[:, None] - x
        return seqsum(w * (np.abs(diff) if use_mad else diff * diff))

    with np.errstate(all="ignore"):
        iscale = F32(nmax) / (mx - mn)
        scale = F1 / iscale
        L = np.clip(nearest_int_np(iscale[:, None] * (x - mn[:, None])), 0, nmax)
        best = error(scale, mn, L)
        for step in range(nstep + 1 if nstep >= 1 else 0):
            iscale = (rmin + rdelta * F32(step) + F32(nmax)) / (mx - mn)
            laux = np.clip(nearest_int_np(iscale[:, None] * (x - mn[:, None])), 0, nmax)
            fl = laux.astype(np.float32)
            sum_l = seqsum(w * fl)
            sum_l2 = seqsum(w * fl * fl)
            sum_xl = seqsum(w * fl * x)
            D = sum_w * sum_l2 - sum_l * sum_l
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            pos = this_min > F0
            this_min = np.where(pos, F0, this_min)
            this_scale = np.where(pos, sum_xl / sum_l2, this_scale)
            cur = error(this_scale, this_min, laux)
            upd = (D > F0) & (cur < best)
            L = np.where(upd[:, None], laux, L)
            best = np.where(upd, cur, best)
            scale = np.where(upd, this_scale, scale)
            mn = np.where(upd, this_min, mn)
    scale = np.where(flat, F0, scale)
    L = np.where(flat[:, None], 0, L).astype(np.int64)
    return scale, -mn, L


def make_qp_quants_np(nmax: int, x: np.ndarray, qw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``make_qp_quants``: returns (scale, L) with L as the uint8 values C stores."""
    mx = np.zeros(x.shape[0], dtype=np.float32)
    for i in range(x.shape[1]):
        mx = np.where(mx > x[:, i], mx, x[:, i])
    zero = mx < GROUP_MAX_EPS
    with np.errstate(all="ignore"):
        iscale = F32(nmax) / mx
        L = nearest_int_np(iscale[:, None] * x).astype(np.int64) & 0xFF
        scale = F1 / iscale
        diff = x - scale[:, None] * L.astype(np.float32)
        best = seqsum(qw * diff * diff)
        for step in range(-4, 5):
            if step == 0:
                continue
            iscale_is = (_TENTH * F32(step) + F32(nmax)) / mx
            scale_is = F1 / iscale_is
            l = np.minimum(nmax, nearest_int_np(iscale_is[:, None] * x))
            diff = x - scale_is[:, None] * l.astype(np.float32)
            mse = seqsum(qw * diff * diff)
            upd = mse < best
            best = np.where(upd, mse, best)
            iscale = np.where(upd, iscale_is, iscale)
        l = np.minimum(nmax, nearest_int_np(iscale[:, None] * x)).astype(np.int64)
        fl = l.astype(np.float32)
        L = l & 0xFF
        sumlx = seqsum(qw * x * fl)
        suml2 = seqsum(qw * fl * fl)
        for _ in range(5):  # see make_q3_quants_np about the early exit
            for i in range(x.shape[1]):
                wi, xi, li = qw[:, i], x[:, i], L[:, i].astype(np.float32)
                slx = sumlx - wi * xi * li
                sl2 = suml2 - wi * li * li
                new_l = np.minimum(nmax, nearest_int_np(xi * sl2 / slx)).astype(np.int64)
                fl = new_l.astype(np.float32)
                slx2 = slx + wi * xi * fl
                sl22 = sl2 + wi * fl * fl
                upd = (slx > F0) & (sl2 > F0) & (new_l != L[:, i])
                upd &= slx2 * slx2 * suml2 > sumlx * sumlx * sl22
                L[:, i] = np.where(upd, new_l & 0xFF, L[:, i])
                sumlx = np.where(upd, slx2, sumlx)
                suml2 = np.where(upd, sl22, suml2)
        scale = np.where(suml2 > F0, sumlx / suml2, F0)
    return np.where(zero, F0, scale), np.where(zero[:, None], 0, L)


def best_index_int8_np(values: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Vectorized ``best_index_int8`` (``values`` sorted int8, ``x`` float32, no NaNs)."""
    v = values.astype(np.float32)
    mu = np.clip(np.searchsorted(v, x, side="right"), 1, v.size - 1)
    lo, hi = v[mu - 1], v[mu]
    idx = np.where(x - lo < hi - x, mu - 1, mu)
    idx = np.where(x <= v[0], 0, idx)
    return np.where(x >= v[-1], v.size - 1, idx)


def minmax_np(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per group min and max found as C's ``if (v < min)`` / ``if (v > max)`` scan does (the
    first of equal values wins, which fixes the sign of a zero)."""
    mn = x[:, 0].copy()
    mx = x[:, 0].copy()
    for i in range(1, x.shape[1]):
        mn = np.where(x[:, i] < mn, x[:, i], mn)
        mx = np.where(x[:, i] > mx, x[:, i], mx)
    return mn, mx
