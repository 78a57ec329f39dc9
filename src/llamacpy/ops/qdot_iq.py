"""Block kernels of the grid formats (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S)
and the ternary ones (TQ1_0, TQ2_0) x q8_K.

Weights are repacked to their integer form (the ``IQV`` field of :mod:`.formats`): per row
and super-block of 256 the f16 ``d``, the integer scale of every 16 weights and the 256 signed
values (grid magnitude with its sign) as 4-bit codes of the format's at most 16 values, so a
kernel never looks a grid up: one ``vpshufb`` of 64 codes through the block's table gives
64 values + 128 (:func:`_u`). What the file stores in 1.56-3.44 bits per weight takes 4.69
here: the price of loads a vector kernel can use directly.

llama.cpp multiplies these formats two ways on x86, and the kernels follow both:

* under 8 tokens, ggml's AVX2 ``vec_dot``: 8 int32 lanes per super-block, lane ``j`` = the
  scaled products of elements ``4j..4j+3`` of every 32; ggml's product ``|v| * (sign(v)
  x)`` (the sign applied to the activation byte) is ``v x`` as q8_K bytes lie in
  -127..127; each lane then ``fma(d_w * d_x, float(lane), acc_j)`` and the result
  ``f * hsum_float_8`` (``f``: 1/8 for IQ2, 1/4 for IQ3_XXS, 1 for IQ3_S): ``iq_v1`` /
  ``iq_v2`` with ``drive_lanes``;
* from 8 tokens, the tiled K-quant kernels (``ggml-cpu/tiled``): the super-block as one
  exact int32 ``s = sum_k scale_k * sum v x`` (``(v + 128) . x`` less 128 times the
  activation sums of 16, as ggml's tiles), then ``acc = fma(float(s) * (d_w * f), d_x, acc)``:
  ``*_tiled_t1`` / ``*_tiled_t4`` with ``drive``.

So, as for Q6_K, a token's result depends on how many tokens its matmul has, as llama.cpp's.
The formats' layouts, matmul kernels, row decoders, numpy twins and traits records close the
file.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..gguf.constants import GGMLType
from ..quants import _iqcodes
from ..simd import (
    vand_k,
    vbcast4,
    vcvt,
    vdpbusd,
    vfma,
    vload_f16,
    vload_i32,
    vload_u8,
    vshuffle_bytes,
    vsll,
    vsplat_f32,
    vsplat_i32,
    vsrl,
    vzero_i32,
)
from .drive import drive, drive_lanes
from .formats import iq_module
from .qdot_k import TILED_MIN_TOKENS, _xk
from .qdot_legacy import _hsum8, chunk_byte, f16_at, f16_np, zero, zero18
from .traits import ACT_Q8K, IQV, IQV_SC, IQV_TAB, IQV_V, FormatTraits, Layout, register

_ONES = 0x01010101


@njit(cache=True, inline="always")
def _u2(w, o, c):
    """Values ``4c..4c+3`` and ``4(c+32)..4(c+32)+3`` (+128, u8) of 16 rows (``c`` < 32):
    the low and the high nibbles of code vector ``c`` through the block's table."""
    tab = vload_i32(w, o + IQV_TAB)
    x = vload_i32(w, o + IQV_V + 64 * c)
    lo = vshuffle_bytes(tab, vand_k(x, 0x0F0F0F0F))
    return lo, vshuffle_bytes(tab, vand_k(vsrl(x, 4), 0x0F0F0F0F))


@njit(cache=True, inline="always")
def _sc(w, o, k):
    """The integer scale of weights ``16k..16k+15`` of 16 rows."""
    return vload_u8(w, o + IQV_SC + 16 * k)


# ----------------------------------------------------------------------------- vec_dot
@njit(cache=True, inline="always")
def _vlane(w, o, xq, xi, j):
    """ggml's lane ``j`` (elements 4j..4j+3 of every 32) of one super-block, one token.

    ggml multiplies ``|v|`` by the activation byte with ``v``'s sign; as q8_K bytes lie in
    -127..127 that is ``v x`` exactly, taken here as ``(v + 128) . x`` started at
    ``-128 * (x_0 + .. + x_3)``."""
    tot = vzero_i32()
    for s in range(4):  # (the sums are exact: their order does not matter)
        lo, hi = _u2(w, o, 8 * s + j)
        tot = tot + _vpart(w, o, xq, xi, j, s, lo) + _vpart(w, o, xq, xi, j, s + 4, hi)
    return tot


@njit(cache=True, inline="always")
def _vpart(w, o, xq, xi, j, s, u):
    """Lane ``j``'s scaled products in the ``s``-th 32 of a super-block (values ``u``)."""
    z = vzero_i32()
    x = vbcast4(xq, xi + 32 * s + 4 * j)
    p0 = z - vsll(vdpbusd(z, vsplat_i32(_ONES), x), 7)
    return _sc(w, o, 2 * s + j // 4) * vdpbusd(p0, u, x)


@njit(cache=True, inline="always")
def _vstep(w, o, A, t, b, a):
    xq = A[4]
    xi = _xk(A, t, b)
    d = vload_f16(w, o) * vsplat_f32(A[5][t, b])
    a0, a1, a2, a3, a4, a5, a6, a7, sm = a
    a0 = vfma(d, vcvt(_vlane(w, o, xq, xi, 0)), a0)
    a1 = vfma(d, vcvt(_vlane(w, o, xq, xi, 1)), a1)
    a2 = vfma(d, vcvt(_vlane(w, o, xq, xi, 2)), a2)
    a3 = vfma(d, vcvt(_vlane(w, o, xq, xi, 3)), a3)
    a4 = vfma(d, vcvt(_vlane(w, o, xq, xi, 4)), a4)
    a5 = vfma(d, vcvt(_vlane(w, o, xq, xi, 5)), a5)
    a6 = vfma(d, vcvt(_vlane(w, o, xq, xi, 6)), a6)
    a7 = vfma(d, vcvt(_vlane(w, o, xq, xi, 7)), a7)
    return (a0, a1, a2, a3, a4, a5, a6, a7, sm)


@njit(cache=True, inline="always")
def iq_v1(w, o, A, t, b, nb, a):
    """One token, ggml's ``vec_dot`` lanes (``qdot_legacy.zero``, the format's ``fin``)."""
    return _vstep(w, o, A, t, b, a)


@njit(cache=True, inline="always")
def iq_v2(w, o, A, t, b, nb, a, c):
    return _vstep(w, o, A, t, b, a), _vstep(w, o, A, t + 1, b, c)


@njit(cache=True, inline="always")
def fin_8th(a):
    return vsplat_f32(0.125) * _hsum8(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7])


@njit(cache=True, inline="always")
def fin_4th(a):
    return vsplat_f32(0.25) * _hsum8(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7])


@njit(cache=True, inline="always")
def fin_1(a):
    return _hsum8(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7])


# ----------------------------------------------------------------------------- IQ1 vec_dot
# IQ1_S / IQ1_M values are v = 8 g + delta (g in -1..1, delta = +-1, as the tiled kernels
# and :mod:`llamacpy.quants.iq1_s` hold them); ggml's vec_dot keeps the grid products
# (lanes as above) and the delta products apart: IQ1_S adds the latter up as one int per
# super-block (``fma(d, float(sumi1), acc1)``, the result ``hsum + acc1 / 8``), IQ1_M in 8
# lanes of their own (``hsum(acc1) + hsum(acc2) / 8``).
_M116 = 0x74747474  # 116 in each byte: u - 116 = 8 (g + 1) + delta + 4 >= 3


@njit(cache=True, inline="always")
def _gp(u):
    """``g + 1`` (0, 1, 2) in each byte of stored IQ1 values ``u = v + 128``."""
    return vand_k(vsrl(u - vsplat_i32(_M116), 3), 0x1F1F1F1F)


@njit(cache=True, inline="always")
def _v1lane(w, o, xq, xi, j):
    """IQ1 lane ``j``: the scaled sums of ``g x`` and of ``delta x`` over elements
    4j..4j+3 of every 32 (exact: ``sum v x = pu - 128 sx``, ``sum g x = pg - sx``)."""
    tg = td = vzero_i32()
    for s in range(4):  # (exact sums, in any order)
        lo, hi = _u2(w, o, 8 * s + j)
        g0, d0 = _v1part(w, o, xq, xi, j, s, lo)
        g1, d1 = _v1part(w, o, xq, xi, j, s + 4, hi)
        tg, td = tg + g0 + g1, td + d0 + d1
    return tg, td


@njit(cache=True, inline="always")
def _v1part(w, o, xq, xi, j, s, u):
    """:func:`_v1lane`'s two sums in the ``s``-th 32 of a super-block (values ``u``)."""
    z = vzero_i32()
    x = vbcast4(xq, xi + 32 * s + 4 * j)
    pu = vdpbusd(z, u, x)
    pg = vdpbusd(z, _gp(u), x)
    sx = vdpbusd(z, vsplat_i32(_ONES), x)
    sc = _sc(w, o, 2 * s + j // 4)
    return sc * (pg - sx), sc * (pu - vsll(pg, 3) - sx * vsplat_i32(120))


@njit(cache=True, inline="always")
def _v1s_step(w, o, A, t, b, a):
    xq = A[4]
    xi = _xk(A, t, b)
    d = vload_f16(w, o) * vsplat_f32(A[5][t, b])
    a0, a1, a2, a3, a4, a5, a6, a7, sm = a
    g, e = _v1lane(w, o, xq, xi, 0)
    a0 = vfma(d, vcvt(g), a0)
    g, e1 = _v1lane(w, o, xq, xi, 1)
    a1 = vfma(d, vcvt(g), a1)
    g, e2 = _v1lane(w, o, xq, xi, 2)
    a2 = vfma(d, vcvt(g), a2)
    g, e3 = _v1lane(w, o, xq, xi, 3)
    a3 = vfma(d, vcvt(g), a3)
    g, e4 = _v1lane(w, o, xq, xi, 4)
    a4 = vfma(d, vcvt(g), a4)
    g, e5 = _v1lane(w, o, xq, xi, 5)
    a5 = vfma(d, vcvt(g), a5)
    g, e6 = _v1lane(w, o, xq, xi, 6)
    a6 = vfma(d, vcvt(g), a6)
    g, e7 = _v1lane(w, o, xq, xi, 7)
    a7 = vfma(d, vcvt(g), a7)
    sm = vfma(d, vcvt(e + e1 + e2 + e3 + e4 + e5 + e6 + e7), sm)
    return (a0, a1, a2, a3, a4, a5, a6, a7, sm)


@njit(cache=True, inline="always")
def iq1_s_v1(w, o, A, t, b, nb, a):
    return _v1s_step(w, o, A, t, b, a)


@njit(cache=True, inline="always")
def iq1_s_v2(w, o, A, t, b, nb, a, c):
    return _v1s_step(w, o, A, t, b, a), _v1s_step(w, o, A, t + 1, b, c)


@njit(cache=True, inline="always")
def fin_iq1_s(a):
    h = _hsum8(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7])
    return h + vsplat_f32(0.125) * a[8]


@njit(cache=True, inline="always")
def _v1m_step(w, o, A, t, b, a):
    xq = A[4]
    xi = _xk(A, t, b)
    d = vload_f16(w, o) * vsplat_f32(A[5][t, b])
    g0, e0 = _v1lane(w, o, xq, xi, 0)
    g1, e1 = _v1lane(w, o, xq, xi, 1)
    g2, e2 = _v1lane(w, o, xq, xi, 2)
    g3, e3 = _v1lane(w, o, xq, xi, 3)
    g4, e4 = _v1lane(w, o, xq, xi, 4)
    g5, e5 = _v1lane(w, o, xq, xi, 5)
    g6, e6 = _v1lane(w, o, xq, xi, 6)
    g7, e7 = _v1lane(w, o, xq, xi, 7)
    return (
        vfma(d, vcvt(g0), a[0]),
        vfma(d, vcvt(g1), a[1]),
        vfma(d, vcvt(g2), a[2]),
        vfma(d, vcvt(g3), a[3]),
        vfma(d, vcvt(g4), a[4]),
        vfma(d, vcvt(g5), a[5]),
        vfma(d, vcvt(g6), a[6]),
        vfma(d, vcvt(g7), a[7]),
        vfma(d, vcvt(e0), a[8]),
        vfma(d, vcvt(e1), a[9]),
        vfma(d, vcvt(e2), a[10]),
        vfma(d, vcvt(e3), a[11]),
        vfma(d, vcvt(e4), a[12]),
        vfma(d, vcvt(e5), a[13]),
        vfma(d, vcvt(e6), a[14]),
        vfma(d, vcvt(e7), a[15]),
        a[16],
        a[17],
    )


@njit(cache=True, inline="always")
def iq1_m_v1(w, o, A, t, b, nb, a):
    return _v1m_step(w, o, A, t, b, a)


@njit(cache=True, inline="always")
def iq1_m_v2(w, o, A, t, b, nb, a, c):
    return _v1m_step(w, o, A, t, b, a), _v1m_step(w, o, A, t + 1, b, c)


@njit(cache=True, inline="always")
def fin_iq1_m(a):
    h1 = _hsum8(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7])
    h2 = _hsum8(a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15])
    return h1 + vsplat_f32(0.125) * h2


# ----------------------------------------------------------------------------- TQ1_0 / TQ2_0
# The ternary formats (values q - 1, q in 0..2, no sub-block scales) have no tiled kernel in
# llama.cpp: every token count goes through vec_dot, whose lane ``j`` is the products
# ``q x`` of elements 4j..4j+3 of every 32 less the activation sums of 16 number 2j and
# 2j+1 (its 16-bit lanes take ``bsums`` as they lie), then ``fma(float(lane), d_x * d_w,
# acc_j)`` and ``hsum_float_8``.
_M127 = 0x7F7F7F7F  # stored u = q - 1 + 128: u - 127 = q


@njit(cache=True, inline="always")
def _tq_lane(w, o, A, t, b, xi, j):
    xq = A[4]
    p = vzero_i32()
    for c in range(4):  # (exact sums, in any order)
        lo, hi = _u2(w, o, 8 * c + j)
        p = vdpbusd(p, lo - vsplat_i32(_M127), vbcast4(xq, xi + 32 * c + 4 * j))
        p = vdpbusd(p, hi - vsplat_i32(_M127), vbcast4(xq, xi + 32 * (c + 4) + 4 * j))
    return p - vsplat_i32(A[6][t, b * 16 + 2 * j] + A[6][t, b * 16 + 2 * j + 1])


@njit(cache=True, inline="always")
def _tq_step(w, o, A, t, b, a):
    xi = _xk(A, t, b)
    d = vload_f16(w, o) * vsplat_f32(A[5][t, b])
    a0, a1, a2, a3, a4, a5, a6, a7, sm = a
    a0 = vfma(vcvt(_tq_lane(w, o, A, t, b, xi, 0)), d, a0)
    a1 = vfma(vcvt(_tq_lane(w, o, A, t, b, xi, 1)), d, a1)
    a2 = vfma(vcvt(_tq_lane(w, o, A, t, b, xi, 2)), d, a2)
    a3 = vfma(vcvt(_tq_lane(w, o, A, t, b, xi, 3)), d, a3)
    a4 = vfma(vcvt(_tq_lane(w, o, A, t, b, xi, 4)), d, a4)
    a5 = vfma(vcvt(_tq_lane(w, o, A, t, b, xi, 5)), d, a5)
    a6 = vfma(vcvt(_tq_lane(w, o, A, t, b, xi, 6)), d, a6)
    a7 = vfma(vcvt(_tq_lane(w, o, A, t, b, xi, 7)), d, a7)
    return (a0, a1, a2, a3, a4, a5, a6, a7, sm)


@njit(cache=True, inline="always")
def tq_v1(w, o, A, t, b, nb, a):
    return _tq_step(w, o, A, t, b, a)


@njit(cache=True, inline="always")
def tq_v2(w, o, A, t, b, nb, a, c):
    return _tq_step(w, o, A, t, b, a), _tq_step(w, o, A, t + 1, b, c)


# ----------------------------------------------------------------------------- tiled
@njit(cache=True, inline="always")
def _start(A, t, b, k):
    """``-128 * (sum of token t's activations k of 16)``: a dot product of stored values
    ``u = v + 128`` with the activations started here is ``sum v x``, exactly."""
    return vsplat_i32(-128 * A[6][t, b * 16 + k])


@njit(cache=True, inline="always")
def _tsum1(w, o, A, t, b):
    """The exact int32 ``sum_k scale_k * sum v x`` of one super-block, one token."""
    xq = A[4]
    xi = _xk(A, t, b)
    tot = vzero_i32()
    for k in range(8):  # sub-blocks k and k + 8 share their code vectors (exact sums)
        p = _start(A, t, b, k)
        q = _start(A, t, b, k + 8)
        for c in range(4):
            lo, hi = _u2(w, o, 4 * k + c)
            p = vdpbusd(p, lo, vbcast4(xq, xi + 16 * k + 4 * c))
            q = vdpbusd(q, hi, vbcast4(xq, xi + 16 * (k + 8) + 4 * c))
        tot = tot + _sc(w, o, k) * p + _sc(w, o, k + 8) * q
    return tot


@njit(cache=True, inline="always")
def _dp4(p, u, xq, e, n):
    """``p[i] += u . x`` for the four tokens' activations at ``e + i n``."""
    p0, p1, p2, p3 = p
    return (
        vdpbusd(p0, u, vbcast4(xq, e)),
        vdpbusd(p1, u, vbcast4(xq, e + n)),
        vdpbusd(p2, u, vbcast4(xq, e + 2 * n)),
        vdpbusd(p3, u, vbcast4(xq, e + 3 * n)),
    )


@njit(cache=True, inline="always")
def _start4(A, t, b, k):
    return (_start(A, t, b, k), _start(A, t + 1, b, k), _start(A, t + 2, b, k),
            _start(A, t + 3, b, k))  # fmt: skip


@njit(cache=True, inline="always")
def _tsum4(w, o, A, t, b):
    """:func:`_tsum1` for tokens ``t..t+3``, the weights loaded once."""
    xq = A[4]
    x0 = _xk(A, t, b)
    n = xq.shape[1]
    t0 = t1 = t2 = t3 = vzero_i32()
    for k in range(8):  # sub-blocks k and k + 8 share their code vectors (exact sums)
        p = _start4(A, t, b, k)
        q = _start4(A, t, b, k + 8)
        for c in range(4):
            lo, hi = _u2(w, o, 4 * k + c)
            p = _dp4(p, lo, xq, x0 + 16 * k + 4 * c, n)
            q = _dp4(q, hi, xq, x0 + 16 * (k + 8) + 4 * c, n)
        s, r = _sc(w, o, k), _sc(w, o, k + 8)
        t0, t1 = t0 + s * p[0] + r * q[0], t1 + s * p[1] + r * q[1]
        t2, t3 = t2 + s * p[2] + r * q[2], t3 + s * p[3] + r * q[3]
    return t0, t1, t2, t3


@njit(cache=True, inline="always")
def _tfin(acc, dw, A, t, b, s):
    return vfma(vcvt(s) * dw, vsplat_f32(A[5][t, b]), acc)


@njit(cache=True, inline="always")
def _tiled_t1(w, o, A, t, b, acc, f):
    dw = vload_f16(w, o) * vsplat_f32(f)
    return _tfin(acc, dw, A, t, b, _tsum1(w, o, A, t, b))


@njit(cache=True, inline="always")
def _tiled_t4(w, o, A, t, b, a0, a1, a2, a3, f):
    dw = vload_f16(w, o) * vsplat_f32(f)
    s0, s1, s2, s3 = _tsum4(w, o, A, t, b)
    a0 = _tfin(a0, dw, A, t, b, s0)
    a1 = _tfin(a1, dw, A, t + 1, b, s1)
    a2 = _tfin(a2, dw, A, t + 2, b, s2)
    a3 = _tfin(a3, dw, A, t + 3, b, s3)
    return a0, a1, a2, a3


@njit(cache=True, inline="always")
def tiled_8th_t1(w, o, A, t, b, acc):
    return _tiled_t1(w, o, A, t, b, acc, 0.125)


@njit(cache=True, inline="always")
def tiled_8th_t4(w, o, A, t, b, a0, a1, a2, a3):
    return _tiled_t4(w, o, A, t, b, a0, a1, a2, a3, 0.125)


@njit(cache=True, inline="always")
def tiled_4th_t1(w, o, A, t, b, acc):
    return _tiled_t1(w, o, A, t, b, acc, 0.25)


@njit(cache=True, inline="always")
def tiled_4th_t4(w, o, A, t, b, a0, a1, a2, a3):
    return _tiled_t4(w, o, A, t, b, a0, a1, a2, a3, 0.25)


@njit(cache=True, inline="always")
def tiled_1_t1(w, o, A, t, b, acc):
    return _tiled_t1(w, o, A, t, b, acc, 1.0)


@njit(cache=True, inline="always")
def tiled_1_t4(w, o, A, t, b, a0, a1, a2, a3):
    return _tiled_t4(w, o, A, t, b, a0, a1, a2, a3, 1.0)


# ----------------------------------------------------------------------------- the formats
_QK = 256


def _layout(t: GGMLType) -> Layout:
    return Layout.of(t, _QK, ACT_Q8K, (IQV, 0, iq_module(t).TYPE_SIZE, int(t)))


LAYOUT_IQ2_XXS = _layout(GGMLType.IQ2_XXS)
LAYOUT_IQ2_XS = _layout(GGMLType.IQ2_XS)
LAYOUT_IQ2_S = _layout(GGMLType.IQ2_S)
LAYOUT_IQ3_XXS = _layout(GGMLType.IQ3_XXS)
LAYOUT_IQ3_S = _layout(GGMLType.IQ3_S)
LAYOUT_IQ1_S = _layout(GGMLType.IQ1_S)
LAYOUT_IQ1_M = _layout(GGMLType.IQ1_M)
LAYOUT_TQ1_0 = _layout(GGMLType.TQ1_0)
LAYOUT_TQ2_0 = _layout(GGMLType.TQ2_0)
_BB = LAYOUT_IQ2_XXS.dst_bytes  # the same for every IQV format


@njit(cache=True, inline="always")
def _mm(v_fin, k1, k4, w, desc, A, t0, t1, g0, g1, out, ot, add):
    nblk = desc[3] // _QK
    if t1 - t0 >= TILED_MIN_TOKENS:  # llama.cpp's tiled kernels (see above)
        drive(k1, k4, w, desc[1], nblk, _BB, g0, g1, A, t0, t1, out, ot, add)
    else:
        drive_lanes(
            zero, v_fin, iq_v1, iq_v2, w, desc[1], nblk, _BB, g0, g1, A, t0, t1, out, ot, add
        )


@njit(cache=True)
def mm_iq_8th(w, desc, A, t0, t1, g0, g1, out, ot, add):
    """IQ2_XXS, IQ2_XS, IQ2_S."""
    _mm(fin_8th, tiled_8th_t1, tiled_8th_t4, w, desc, A, t0, t1, g0, g1, out, ot, add)


@njit(cache=True)
def mm_iq_4th(w, desc, A, t0, t1, g0, g1, out, ot, add):
    """IQ3_XXS."""
    _mm(fin_4th, tiled_4th_t1, tiled_4th_t4, w, desc, A, t0, t1, g0, g1, out, ot, add)


@njit(cache=True)
def mm_iq_1(w, desc, A, t0, t1, g0, g1, out, ot, add):
    """IQ3_S."""
    _mm(fin_1, tiled_1_t1, tiled_1_t4, w, desc, A, t0, t1, g0, g1, out, ot, add)


@njit(cache=True)
def mm_iq1_s(w, desc, A, t0, t1, g0, g1, out, ot, add):
    nblk = desc[3] // _QK
    if t1 - t0 >= TILED_MIN_TOKENS:
        drive(tiled_8th_t1, tiled_8th_t4, w, desc[1], nblk, _BB, g0, g1, A, t0, t1, out, ot, add)
    else:
        mm_iq1_s_vec(w, desc, A, t0, t1, g0, g1, out, ot, add)


@njit(cache=True)
def mm_iq1_s_vec(w, desc, A, t0, t1, g0, g1, out, ot, add):
    nblk, k1, k2 = desc[3] // _QK, iq1_s_v1, iq1_s_v2
    drive_lanes(zero, fin_iq1_s, k1, k2, w, desc[1], nblk, _BB, g0, g1, A, t0, t1, out, ot, add)


@njit(cache=True)
def mm_iq1_m(w, desc, A, t0, t1, g0, g1, out, ot, add):
    nblk = desc[3] // _QK
    if t1 - t0 >= TILED_MIN_TOKENS:
        drive(tiled_8th_t1, tiled_8th_t4, w, desc[1], nblk, _BB, g0, g1, A, t0, t1, out, ot, add)
    else:
        mm_iq1_m_vec(w, desc, A, t0, t1, g0, g1, out, ot, add)


@njit(cache=True)
def mm_iq1_m_vec(w, desc, A, t0, t1, g0, g1, out, ot, add):
    nblk, k1, k2 = desc[3] // _QK, iq1_m_v1, iq1_m_v2
    drive_lanes(zero18, fin_iq1_m, k1, k2, w, desc[1], nblk, _BB, g0, g1, A, t0, t1, out, ot, add)


@njit(cache=True)
def mm_tq(w, desc, A, t0, t1, g0, g1, out, ot, add):
    """TQ1_0, TQ2_0 (vec_dot for every token count)."""
    nblk = desc[3] // _QK
    drive_lanes(zero, fin_1, tq_v1, tq_v2, w, desc[1], nblk, _BB, g0, g1, A, t0, t1, out, ot, add)


# the batch-invariant kernels (ggml's vec_dot for every token count)
@njit(cache=True)
def mm_iq_8th_vec(w, desc, A, t0, t1, g0, g1, out, ot, add):
    nblk = desc[3] // _QK
    drive_lanes(zero, fin_8th, iq_v1, iq_v2, w, desc[1], nblk, _BB, g0, g1, A, t0, t1, out, ot, add)


@njit(cache=True)
def mm_iq_4th_vec(w, desc, A, t0, t1, g0, g1, out, ot, add):
    nblk = desc[3] // _QK
    drive_lanes(zero, fin_4th, iq_v1, iq_v2, w, desc[1], nblk, _BB, g0, g1, A, t0, t1, out, ot, add)


@njit(cache=True)
def mm_iq_1_vec(w, desc, A, t0, t1, g0, g1, out, ot, add):
    nblk = desc[3] // _QK
    drive_lanes(zero, fin_1, iq_v1, iq_v2, w, desc[1], nblk, _BB, g0, g1, A, t0, t1, out, ot, add)


# --- row decoders: ``mult(d, scale) * value`` as ggml's ``dequantize_row_*``
@njit(cache=True, inline="always")
def _row(t, w, o, r, out, y0):
    d = f16_at(w, o, r)
    c = _iqcodes.C[t]
    for k in range(16):
        m = _iqcodes.mult(t, d, np.int64(w[o + IQV_SC + 16 * k + r]))
        for i in range(16):
            e = 16 * k + i
            b = chunk_byte(w, o + IQV_V, r, e % 128)
            u = w[o + IQV_TAB + ((b >> 4) if e >= 128 else (b & 15))]
            out[y0 + e] = m * (np.float32(np.int64(u) - 128) * c)


_T_IQ2_XXS, _T_IQ2_XS, _T_IQ2_S = int(GGMLType.IQ2_XXS), int(GGMLType.IQ2_XS), int(GGMLType.IQ2_S)
_T_IQ3_XXS, _T_IQ3_S = int(GGMLType.IQ3_XXS), int(GGMLType.IQ3_S)
_T_IQ1_S, _T_IQ1_M = int(GGMLType.IQ1_S), int(GGMLType.IQ1_M)
_T_TQ1_0, _T_TQ2_0 = int(GGMLType.TQ1_0), int(GGMLType.TQ2_0)


@njit(cache=True, inline="always")
def row_tq1_0(w, o, r, out, y0):
    _row(_T_TQ1_0, w, o, r, out, y0)


@njit(cache=True, inline="always")
def row_tq2_0(w, o, r, out, y0):
    _row(_T_TQ2_0, w, o, r, out, y0)


@njit(cache=True, inline="always")
def row_iq1_s(w, o, r, out, y0):
    _row(_T_IQ1_S, w, o, r, out, y0)


@njit(cache=True, inline="always")
def row_iq1_m(w, o, r, out, y0):
    _row(_T_IQ1_M, w, o, r, out, y0)


@njit(cache=True, inline="always")
def row_iq2_xxs(w, o, r, out, y0):
    _row(_T_IQ2_XXS, w, o, r, out, y0)


@njit(cache=True, inline="always")
def row_iq2_xs(w, o, r, out, y0):
    _row(_T_IQ2_XS, w, o, r, out, y0)


@njit(cache=True, inline="always")
def row_iq2_s(w, o, r, out, y0):
    _row(_T_IQ2_S, w, o, r, out, y0)


@njit(cache=True, inline="always")
def row_iq3_xxs(w, o, r, out, y0):
    _row(_T_IQ3_XXS, w, o, r, out, y0)


@njit(cache=True, inline="always")
def row_iq3_s(w, o, r, out, y0):
    _row(_T_IQ3_S, w, o, r, out, y0)


# --- numpy twin: fields of .formats.unpack_fields -> float32 [rows, blocks, 256]
def _numpy_of(t: GGMLType):
    mod = iq_module(t)

    def dequant(f: dict) -> np.ndarray:
        d = f16_np(
            np.ascontiguousarray(f["d"]).astype("<u2").view(np.uint8).reshape(*f["d"].shape, 2)
        )
        with np.errstate(all="ignore"):
            m = mod.mult_numpy(d[..., None], f["sc"].astype(np.float32))  # [r, b, 16]
            v = f["v"].astype(np.float32) * np.float32(mod.C)
            y = np.repeat(m, 16, axis=-1) * v
        return y.astype(np.float32)

    dequant.__name__ = f"{t.name.lower()}_numpy"
    return dequant


register(
    FormatTraits(
        LAYOUT_IQ2_XXS,
        mm_iq_8th,
        row_iq2_xxs,
        _numpy_of(GGMLType.IQ2_XXS),
        matmul_invariant=mm_iq_8th_vec,
    )
)
register(
    FormatTraits(
        LAYOUT_IQ2_XS,
        mm_iq_8th,
        row_iq2_xs,
        _numpy_of(GGMLType.IQ2_XS),
        matmul_invariant=mm_iq_8th_vec,
    )
)
register(
    FormatTraits(
        LAYOUT_IQ2_S,
        mm_iq_8th,
        row_iq2_s,
        _numpy_of(GGMLType.IQ2_S),
        matmul_invariant=mm_iq_8th_vec,
    )
)
register(
    FormatTraits(
        LAYOUT_IQ3_XXS,
        mm_iq_4th,
        row_iq3_xxs,
        _numpy_of(GGMLType.IQ3_XXS),
        matmul_invariant=mm_iq_4th_vec,
    )
)
register(
    FormatTraits(
        LAYOUT_IQ3_S, mm_iq_1, row_iq3_s, _numpy_of(GGMLType.IQ3_S), matmul_invariant=mm_iq_1_vec
    )
)
register(
    FormatTraits(
        LAYOUT_IQ1_S, mm_iq1_s, row_iq1_s, _numpy_of(GGMLType.IQ1_S), matmul_invariant=mm_iq1_s_vec
    )
)
register(
    FormatTraits(
        LAYOUT_IQ1_M, mm_iq1_m, row_iq1_m, _numpy_of(GGMLType.IQ1_M), matmul_invariant=mm_iq1_m_vec
    )
)
register(FormatTraits(LAYOUT_TQ1_0, mm_tq, row_tq1_0, _numpy_of(GGMLType.TQ1_0)))
register(FormatTraits(LAYOUT_TQ2_0, mm_tq, row_tq2_0, _numpy_of(GGMLType.TQ2_0)))
