"""Scale searches run on 16 groups at once, one group per SIMD lane (numba).

The searches of ``_search.py`` are sequences of float32 sums whose order must stay as in
ggml-quants.c, so a single search cannot be vectorized. The K-quants run the same search on
many independent groups (the 8 or 16 sub-blocks of a super-block), so here each lane of a
16-lane vector (:data:`llamacpy.simd.f32x16`) carries one group through exactly the
scalar code's operations in the scalar code's order: same bits, 16 groups per instruction.
Branches become per-lane selects.

Group data is passed transposed: element ``i`` of group ``g`` at ``[16*i + g]``.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from llamacpy.quants._helpers import F0, F1, F32, GROUP_MAX_EPS
from llamacpy.simd import (
    VecType,
    f32x16,
    i32x16,
    vabs,
    vcvt,
    vload_f32,
    vload_i32,
    vsplat_f32,
    vsplat_i32,
    vstore_f32,
    vstore_i32,
)

LANES = 16
_TENTH = F32(0.1)
_I1 = ir.IntType(1)
_I32 = ir.IntType(32)
_V16I = ir.VectorType(_I32, LANES)
_V16F = ir.VectorType(ir.FloatType(), LANES)
_V16B = ir.VectorType(_I1, LANES)


def _vconst(c):
    return ir.Constant(_V16I, [c] * LANES)


def _cmp(op, ordered=True):
    """A lane-wise float comparison as C evaluates it (``!=`` is true for NaN, the others
    false), as an ``i32x16`` mask (-1 true, 0 false)."""

    def make(typingctx, a, b):
        if not (a == f32x16 and b == f32x16):
            return None

        def cg(context, builder, sig, args):
            fcmp = builder.fcmp_ordered if ordered else builder.fcmp_unordered
            return builder.sext(fcmp(op, args[0], args[1]), _V16I)

        return i32x16(a, b), cg

    return intrinsic(make)


vlt, vle, vgt, vne = _cmp("<"), _cmp("<="), _cmp(">"), _cmp("!=", ordered=False)


@intrinsic
def vneg(typingctx, a):
    """Each lane negated (the sign bit flipped, as C's unary minus)."""
    if a != f32x16:
        return None

    def cg(context, builder, sig, args):
        bits = builder.xor(builder.bitcast(args[0], _V16I), _vconst(-0x80000000))
        return builder.bitcast(bits, _V16F)

    return f32x16(a), cg


@intrinsic
def vblend(typingctx, m, x, y):
    """``x`` in the lanes where the mask ``m`` is set, else ``y`` (``f32x16`` or ``i32x16``)."""
    if not (m == i32x16 and isinstance(x, VecType) and x == y):
        return None

    def cg(context, builder, sig, args):
        c = builder.icmp_signed("!=", args[0], _vconst(0))
        return builder.select(c, args[1], args[2])

    return x(m, x, y), cg


@intrinsic
def vany(typingctx, m):
    """Whether any lane of the mask ``m`` is set."""
    if m != i32x16:
        return None

    def cg(context, builder, sig, args):
        c = builder.icmp_signed("!=", args[0], _vconst(0))
        bits = builder.bitcast(c, ir.IntType(LANES))
        return builder.icmp_unsigned("!=", bits, ir.Constant(ir.IntType(LANES), 0))

    return types.boolean(m), cg


@intrinsic
def vnearest(typingctx, v, lo, hi):
    """ggml's ``nearest_int`` of each lane (the 1.5*2**23 trick, garbage for huge values
    exactly as in C), clamped to ``[lo, hi]``, as ``i32x16``."""
    if v != f32x16:
        return None

    def cg(context, builder, sig, args):
        magic = ir.Constant(_V16F, [12582912.0] * LANES)
        bits = builder.bitcast(builder.fadd(args[0], magic), _V16I)
        r = builder.sub(builder.and_(bits, _vconst(0x007FFFFF)), _vconst(0x00400000))
        lo_v = builder.insert_element(
            ir.Constant(_V16I, None),
            context.cast(builder, args[1], sig.args[1], types.int32),
            ir.Constant(_I32, 0),
        )
        lo_v = builder.shuffle_vector(lo_v, lo_v, ir.Constant(_V16I, [0] * LANES))
        hi_v = builder.insert_element(
            ir.Constant(_V16I, None),
            context.cast(builder, args[2], sig.args[2], types.int32),
            ir.Constant(_I32, 0),
        )
        hi_v = builder.shuffle_vector(hi_v, hi_v, ir.Constant(_V16I, [0] * LANES))
        r = builder.select(builder.icmp_signed(">", r, hi_v), hi_v, r)
        return builder.select(builder.icmp_signed("<", r, lo_v), lo_v, r)

    return i32x16(v, lo, hi), cg


# ----------------------------------------------------------------------------- searches


@njit(cache=True, error_model="numpy")
def make_qkx_quants_x16(n, nmax, xt, wt, Lt, Lauxt, rmin, rdelta, nstep, use_mad, res):
    """:func:`~llamacpy.quants._search.make_qkx_quants` on 16 groups of ``n``: quants to
    ``Lt`` (int32, transposed), scales to ``res[0:16]`` and ``-min`` to ``res[16:32]``
    (``Lauxt`` is scratch like ``Lt``)."""
    zero = vsplat_f32(F0)
    mn = vload_f32(xt, 0)
    mx = mn
    sum_w = vload_f32(wt, 0)
    sum_x = sum_w * mn
    for i in range(1, n):
        x = vload_f32(xt, LANES * i)
        w = vload_f32(wt, LANES * i)
        mn = vblend(vlt(x, mn), x, mn)
        mx = vblend(vgt(x, mx), x, mx)
        sum_w = sum_w + w
        sum_x = sum_x + w * x
    mn = vblend(vgt(mn, zero), zero, mn)
    flat = vle(mx, mn)  # these groups are constant: L = 0, scale 0
    flat_mn = mn
    iscale = vsplat_f32(F32(nmax)) / (mx - mn)
    scale = vsplat_f32(F1) / iscale
    best_error = zero
    for i in range(n):
        x = vload_f32(xt, LANES * i)
        li = vnearest(iscale * (x - mn), 0, nmax)
        vstore_i32(Lt, LANES * i, li)
        diff = scale * vcvt(li) + mn - x
        diff = vabs(diff) if use_mad else diff * diff
        best_error = best_error + vload_f32(wt, LANES * i) * diff
    if nstep >= 1:
        for step in range(nstep + 1):
            iscale = vsplat_f32(rmin + rdelta * F32(step) + F32(nmax)) / (mx - mn)
            sum_l = zero
            sum_l2 = zero
            sum_xl = zero
            for i in range(n):
                x = vload_f32(xt, LANES * i)
                li = vnearest(iscale * (x - mn), 0, nmax)
                vstore_i32(Lauxt, LANES * i, li)
                fl = vcvt(li)
                wl = vload_f32(wt, LANES * i) * fl
                sum_l = sum_l + wl
                sum_l2 = sum_l2 + wl * fl
                sum_xl = sum_xl + wl * x
            D = sum_w * sum_l2 - sum_l * sum_l
            ok = vgt(D, zero)
            if not vany(ok):
                continue
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            pos = vgt(this_min, zero)
            this_min = vblend(pos, zero, this_min)
            this_scale = vblend(pos, sum_xl / sum_l2, this_scale)
            cur_error = zero
            for i in range(n):
                x = vload_f32(xt, LANES * i)
                diff = this_scale * vcvt(vload_i32(Lauxt, LANES * i)) + this_min - x
                diff = vabs(diff) if use_mad else diff * diff
                cur_error = cur_error + vload_f32(wt, LANES * i) * diff
            better = ok & vlt(cur_error, best_error)
            if not vany(better):
                continue
            for i in range(n):
                old = vload_i32(Lt, LANES * i)
                vstore_i32(Lt, LANES * i, vblend(better, vload_i32(Lauxt, LANES * i), old))
            best_error = vblend(better, cur_error, best_error)
            scale = vblend(better, this_scale, scale)
            mn = vblend(better, this_min, mn)
    if vany(flat):
        z = vsplat_i32(0)
        for i in range(n):
            vstore_i32(Lt, LANES * i, vblend(flat, z, vload_i32(Lt, LANES * i)))
        scale = vblend(flat, zero, scale)
        mn = vblend(flat, flat_mn, mn)
    vstore_f32(res, 0, scale)
    vstore_f32(res, LANES, vneg(mn))


@njit(cache=True, error_model="numpy")
def _qx_pass(n, nmax, iscale, xt, wt, Lt):
    """One candidate scale of :func:`make_qx_quants_x16`: quants ``l`` to ``Lt`` and the
    sums ``(sum w*x*l, sum w*l*l)``."""
    sumlx = vsplat_f32(F0)
    suml2 = vsplat_f32(F0)
    for i in range(n):
        x = vload_f32(xt, LANES * i)
        li = vnearest(iscale * x, -nmax, nmax - 1)
        vstore_i32(Lt, LANES * i, li)
        fl = vcvt(li)
        w = vload_f32(wt, LANES * i)
        sumlx = sumlx + w * x * fl
        suml2 = suml2 + w * fl * fl
    return sumlx, suml2


@njit(cache=True, inline="always")
def _signed_absmax_x16(n, xt):
    """Per lane: the largest ``|x|`` of the group and the value it came from (the first one
    on ties, as ggml's loop keeps it)."""
    amax = mx = vsplat_f32(F0)
    for i in range(n):
        x = vload_f32(xt, LANES * i)
        ax = vabs(x)
        up = vgt(ax, amax)
        amax = vblend(up, ax, amax)
        mx = vblend(up, x, mx)
    return amax, mx


@njit(cache=True, error_model="numpy")
def make_qx_quants_x16(n, nmax, xt, wt, Lt, Lauxt, res):
    """:func:`~llamacpy.quants._search.make_qx_quants` on 16 groups of ``n``: quants
    ``l + nmax`` to ``Lt`` (int32, transposed) and the scales to ``res[0:16]``."""
    zero = vsplat_f32(F0)
    amax, mx = _signed_absmax_x16(n, xt)
    tiny = vlt(amax, vsplat_f32(GROUP_MAX_EPS))
    sumlx, suml2 = _qx_pass(n, nmax, vsplat_f32(F32(-nmax)) / mx, xt, wt, Lt)
    scale = vblend(vne(suml2, zero), sumlx / suml2, zero)
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        iscale = vsplat_f32(-(F32(nmax) + _TENTH * F32(step))) / mx
        sumlx, suml2 = _qx_pass(n, nmax, iscale, xt, wt, Lauxt)
        better = vgt(suml2, zero) & vgt(sumlx * sumlx, best * suml2)
        if not vany(better):
            continue
        for i in range(n):
            old = vload_i32(Lt, LANES * i)
            vstore_i32(Lt, LANES * i, vblend(better, vload_i32(Lauxt, LANES * i), old))
        scale = vblend(better, sumlx / suml2, scale)
        best = vblend(better, scale * sumlx, best)
    off = vsplat_i32(nmax)
    z = vsplat_i32(0)
    for i in range(n):
        vstore_i32(Lt, LANES * i, vblend(tiny, z, vload_i32(Lt, LANES * i) + off))
    vstore_f32(res, 0, vblend(tiny, zero, scale))


@njit(cache=True, error_model="numpy")
def make_q3_quants_x16(n, nmax, xt, Lt, res):
    """ggml's ``make_q3_quants`` (``do_rmse``; numpy twin in ``_search_np``) on 16 groups of
    ``n``: quants ``l + nmax`` to ``Lt`` (int32, transposed) and the scales to ``res[0:16]``.

    A lane whose pass changes nothing keeps its state, so running further passes (while
    other lanes still change) leaves it as ggml's early exit does."""
    zero = vsplat_f32(F0)
    amax, mx = _signed_absmax_x16(n, xt)
    live = vle(vsplat_f32(GROUP_MAX_EPS), amax)  # amax is never NaN: not (amax < eps)
    iscale = vsplat_f32(F32(-nmax)) / mx
    sumlx = zero
    suml2 = zero
    for i in range(n):
        x = vload_f32(xt, LANES * i)
        li = vnearest(iscale * x, -nmax, nmax - 1)
        vstore_i32(Lt, LANES * i, li)
        fl = vcvt(li)
        w = x * x
        sumlx = sumlx + w * x * fl
        suml2 = suml2 + w * fl * fl
    for _ in range(5):
        changed = vsplat_i32(0)
        for i in range(n):
            x = vload_f32(xt, LANES * i)
            w = x * x
            li = vload_i32(Lt, LANES * i)
            fl = vcvt(li)
            slx = sumlx - w * x * fl
            sl2 = suml2 - w * fl * fl
            new_l = vnearest(x * sl2 / slx, -nmax, nmax - 1)
            fn = vcvt(new_l)
            slx_n = slx + w * x * fn
            sl2_n = sl2 + w * fn * fn
            take = vgt(slx, zero) & vne(fn, fl) & vgt(sl2_n, zero)
            take = take & vgt(slx_n * slx_n * suml2, sumlx * sumlx * sl2_n)
            vstore_i32(Lt, LANES * i, vblend(take, new_l, li))
            sumlx = vblend(take, slx_n, sumlx)
            suml2 = vblend(take, sl2_n, suml2)
            changed = changed | take
        if not vany(changed & live):
            break
    off = vsplat_i32(nmax)
    z = vsplat_i32(0)
    for i in range(n):
        vstore_i32(Lt, LANES * i, vblend(live, vload_i32(Lt, LANES * i) + off, z))
    scale = vblend(vgt(suml2, zero), sumlx / suml2, zero)
    vstore_f32(res, 0, vblend(live, scale, zero))


@njit(cache=True, error_model="numpy")
def make_qkx_quants_groups(ng, n, nmax, x, w, L, rmin, rdelta, nstep, use_mad, scales, mins):
    """:func:`make_qkx_quants_x16` on the ``ng`` (at most 16) consecutive groups of ``n``
    values of ``x`` (weights ``w``): quants to ``L`` (same layout as ``x``), and group
    ``g``'s ``(scale, -min)`` to ``scales[g], mins[g]``."""
    xt = np.zeros(n * LANES, dtype=np.float32)
    wt = np.zeros(n * LANES, dtype=np.float32)
    Lt = np.empty(n * LANES, dtype=np.int32)
    Lauxt = np.empty(n * LANES, dtype=np.int32)
    res = np.empty(2 * LANES, dtype=np.float32)
    for g in range(ng):
        for k in range(n):
            xt[LANES * k + g] = x[n * g + k]
            wt[LANES * k + g] = w[n * g + k]
    make_qkx_quants_x16(n, nmax, xt, wt, Lt, Lauxt, rmin, rdelta, nstep, use_mad, res)
    for g in range(ng):
        scales[g] = res[g]
        mins[g] = res[LANES + g]
        for k in range(n):
            L[n * g + k] = Lt[LANES * k + g]
