"""Block kernels of the 256-weight "K" formats (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) x q8_K.

Same contract as :mod:`.qdot_legacy`: ``<fmt>_t1(w, o, A, t, b, acc)`` and ``<fmt>_t4``
(tokens ``t..t+3``) for one repacked group super-block. As in ggml, the integer dot products
of each sub-block are multiplied by the integer sub-block scales and summed as int32 over the
super-block before the single float multiply by ``d_weight * d_activation``; mins and value
offsets are taken back with the activation sums per 16 (``xbk``).
"""

from __future__ import annotations

from numba import njit

from .qdot_legacy import IQ4NL_TABLE, _nib
from .simd import (
    vand_k,
    vbcast4,
    vcvt,
    vdpbusd,
    vfma,
    vload_f16,
    vload_i8,
    vload_i32,
    vload_u8,
    vshuffle_bytes,
    vsll,
    vsplat_f32,
    vsplat_i32,
    vsrl,
    vzero_i32,
)

_M4 = 0x0F0F0F0F
_M2 = 0x03030303
_M1 = 0x01010101


@njit(cache=True, inline="always")
def _xk(A, t, b):
    """Flat index of token ``t``'s super-block ``b`` in ``xqk``."""
    return t * A[4].shape[1] + b * 256


@njit(cache=True, inline="always")
def _bs(A, t, b, j):
    """Sum of the 16 quantized activations of sub-block ``j`` (of 16) of super-block ``b``."""
    return A[6][t, b * 16 + j]


@njit(cache=True, inline="always")
def _fin(acc, w, od, A, t, b, tot):
    return vfma(vload_f16(w, od) * vsplat_f32(A[5][t, b]), vcvt(tot), acc)


@njit(cache=True, inline="always")
def _fin_min(acc, w, o, A, t, b, tot, msum):
    dx = vsplat_f32(A[5][t, b])
    acc = vfma(vload_f16(w, o) * dx, vcvt(tot), acc)
    return vfma(vload_f16(w, o + 32) * (vsplat_f32(-1.0) * dx), vcvt(msum), acc)


# ----------------------------------------------------------------------------- Q4_K / Q5_K
@njit(cache=True, inline="always")
def _k45_chunk(w, o, q5, jj, cc):
    """Weights (sub-block 2jj, sub-block 2jj+1) of chunk ``cc`` of pair ``jj``."""
    qo = o + (832 if q5 else 320)
    lo, hi = _nib(vload_i32(w, qo + 64 * (8 * jj + cc)))
    if q5:
        h = vload_i32(w, o + 320 + 64 * cc)
        lo = lo | vsll(vand_k(vsrl(h, 2 * jj), _M1), 4)
        hi = hi | vsll(vand_k(vsrl(h, 2 * jj + 1), _M1), 4)
    return lo, hi


@njit(cache=True, inline="always")
def _k45_mins(w, o, A, t, b):
    m = vzero_i32()
    for j in range(8):
        bs = _bs(A, t, b, 2 * j) + _bs(A, t, b, 2 * j + 1)
        m = m + vload_u8(w, o + 192 + 16 * j) * vsplat_i32(bs)
    return m


@njit(cache=True, inline="always")
def _k45_t1(w, o, A, t, b, acc, q5):
    xq = A[4]
    xi = _xk(A, t, b)
    tot = vzero_i32()
    for jj in range(4):
        slo = vzero_i32()
        shi = vzero_i32()
        for cc in range(8):
            lo, hi = _k45_chunk(w, o, q5, jj, cc)
            slo = vdpbusd(slo, lo, vbcast4(xq, xi + 64 * jj + 4 * cc))
            shi = vdpbusd(shi, hi, vbcast4(xq, xi + 64 * jj + 32 + 4 * cc))
        tot = tot + slo * vload_u8(w, o + 64 + 32 * jj) + shi * vload_u8(w, o + 80 + 32 * jj)
    return _fin_min(acc, w, o, A, t, b, tot, _k45_mins(w, o, A, t, b))


@njit(cache=True, inline="always")
def _k45_t4(w, o, A, t, b, a0, a1, a2, a3, q5):
    xq = A[4]
    x0 = _xk(A, t, b)
    k = xq.shape[1]
    x1, x2, x3 = x0 + k, x0 + 2 * k, x0 + 3 * k
    t0 = t1 = t2 = t3 = vzero_i32()
    for jj in range(4):
        l0 = l1 = l2 = l3 = h0 = h1 = h2 = h3 = vzero_i32()
        for cc in range(8):
            lo, hi = _k45_chunk(w, o, q5, jj, cc)
            e = 64 * jj + 4 * cc
            l0 = vdpbusd(l0, lo, vbcast4(xq, x0 + e))
            h0 = vdpbusd(h0, hi, vbcast4(xq, x0 + e + 32))
            l1 = vdpbusd(l1, lo, vbcast4(xq, x1 + e))
            h1 = vdpbusd(h1, hi, vbcast4(xq, x1 + e + 32))
            l2 = vdpbusd(l2, lo, vbcast4(xq, x2 + e))
            h2 = vdpbusd(h2, hi, vbcast4(xq, x2 + e + 32))
            l3 = vdpbusd(l3, lo, vbcast4(xq, x3 + e))
            h3 = vdpbusd(h3, hi, vbcast4(xq, x3 + e + 32))
        sl = vload_u8(w, o + 64 + 32 * jj)
        sh = vload_u8(w, o + 80 + 32 * jj)
        t0 = t0 + l0 * sl + h0 * sh
        t1 = t1 + l1 * sl + h1 * sh
        t2 = t2 + l2 * sl + h2 * sh
        t3 = t3 + l3 * sl + h3 * sh
    a0 = _fin_min(a0, w, o, A, t, b, t0, _k45_mins(w, o, A, t, b))
    a1 = _fin_min(a1, w, o, A, t + 1, b, t1, _k45_mins(w, o, A, t + 1, b))
    a2 = _fin_min(a2, w, o, A, t + 2, b, t2, _k45_mins(w, o, A, t + 2, b))
    a3 = _fin_min(a3, w, o, A, t + 3, b, t3, _k45_mins(w, o, A, t + 3, b))
    return a0, a1, a2, a3


@njit(cache=True, inline="always")
def q4_k_t1(w, o, A, t, b, acc):
    return _k45_t1(w, o, A, t, b, acc, False)


@njit(cache=True, inline="always")
def q4_k_t4(w, o, A, t, b, a0, a1, a2, a3):
    return _k45_t4(w, o, A, t, b, a0, a1, a2, a3, False)


@njit(cache=True, inline="always")
def q5_k_t1(w, o, A, t, b, acc):
    return _k45_t1(w, o, A, t, b, acc, True)


@njit(cache=True, inline="always")
def q5_k_t4(w, o, A, t, b, a0, a1, a2, a3):
    return _k45_t4(w, o, A, t, b, a0, a1, a2, a3, True)


# ----------------------------------------------------------------------------- Q6_K
@njit(cache=True, inline="always")
def _q6_chunk(w, o, n, cc):
    """The 4 weight vectors of chunk ``cc`` (0..7) of half ``n``: elements
    128n + {0, 32, 64, 96} + 4cc + (0..3); values 0..63 (offset 32)."""
    a = vload_i32(w, o + 288 + 64 * (16 * n + cc))
    bq = vload_i32(w, o + 288 + 64 * (16 * n + 8 + cc))
    h = vload_i32(w, o + 2336 + 64 * (8 * n + cc))
    w1 = vand_k(a, _M4) | vsll(vand_k(h, _M2), 4)
    w2 = vand_k(bq, _M4) | vsll(vand_k(vsrl(h, 2), _M2), 4)
    w3 = vand_k(vsrl(a, 4), _M4) | vsll(vand_k(vsrl(h, 4), _M2), 4)
    w4 = vand_k(vsrl(bq, 4), _M4) | vsll(vand_k(vsrl(h, 6), _M2), 4)
    return w1, w2, w3, w4


@njit(cache=True, inline="always")
def _q6_acc(tot, w, o, A, t, b, n, hh, s1, s2, s3, s4):
    """Scale the 4 sub-block sums of (half n, cc half hh) and add them to ``tot``."""
    j = 8 * n + hh
    tot = tot + vload_i8(w, o + 32 + 16 * j) * (s1 - vsplat_i32(32 * _bs(A, t, b, j)))
    tot = tot + vload_i8(w, o + 64 + 16 * j) * (s2 - vsplat_i32(32 * _bs(A, t, b, j + 2)))
    tot = tot + vload_i8(w, o + 96 + 16 * j) * (s3 - vsplat_i32(32 * _bs(A, t, b, j + 4)))
    return tot + vload_i8(w, o + 128 + 16 * j) * (s4 - vsplat_i32(32 * _bs(A, t, b, j + 6)))


@njit(cache=True, inline="always")
def _dot4(s1, s2, s3, s4, w1, w2, w3, w4, xq, xi):
    s1 = vdpbusd(s1, w1, vbcast4(xq, xi))
    s2 = vdpbusd(s2, w2, vbcast4(xq, xi + 32))
    s3 = vdpbusd(s3, w3, vbcast4(xq, xi + 64))
    s4 = vdpbusd(s4, w4, vbcast4(xq, xi + 96))
    return s1, s2, s3, s4


@njit(cache=True, inline="always")
def q6_k_t1(w, o, A, t, b, acc):
    xq = A[4]
    xi = _xk(A, t, b)
    tot = vzero_i32()
    for n in range(2):
        for hh in range(2):
            s1 = s2 = s3 = s4 = vzero_i32()
            for c4 in range(4):
                cc = 4 * hh + c4
                w1, w2, w3, w4 = _q6_chunk(w, o, n, cc)
                s1, s2, s3, s4 = _dot4(s1, s2, s3, s4, w1, w2, w3, w4, xq, xi + 128 * n + 4 * cc)
            tot = _q6_acc(tot, w, o, A, t, b, n, hh, s1, s2, s3, s4)
    return _fin(acc, w, o, A, t, b, tot)


@njit(cache=True, inline="always")
def q6_k_t4(w, o, A, t, b, a0, a1, a2, a3):
    xq = A[4]
    x0 = _xk(A, t, b)
    k = xq.shape[1]
    t0 = t1 = t2 = t3 = vzero_i32()
    for n in range(2):
        for hh in range(2):
            p1 = p2 = p3 = p4 = q1 = q2 = q3 = q4 = vzero_i32()
            r1 = r2 = r3 = r4 = u1 = u2 = u3 = u4 = vzero_i32()
            for c4 in range(4):
                cc = 4 * hh + c4
                w1, w2, w3, w4 = _q6_chunk(w, o, n, cc)
                e = x0 + 128 * n + 4 * cc
                p1, p2, p3, p4 = _dot4(p1, p2, p3, p4, w1, w2, w3, w4, xq, e)
                q1, q2, q3, q4 = _dot4(q1, q2, q3, q4, w1, w2, w3, w4, xq, e + k)
                r1, r2, r3, r4 = _dot4(r1, r2, r3, r4, w1, w2, w3, w4, xq, e + 2 * k)
                u1, u2, u3, u4 = _dot4(u1, u2, u3, u4, w1, w2, w3, w4, xq, e + 3 * k)
            t0 = _q6_acc(t0, w, o, A, t, b, n, hh, p1, p2, p3, p4)
            t1 = _q6_acc(t1, w, o, A, t + 1, b, n, hh, q1, q2, q3, q4)
            t2 = _q6_acc(t2, w, o, A, t + 2, b, n, hh, r1, r2, r3, r4)
            t3 = _q6_acc(t3, w, o, A, t + 3, b, n, hh, u1, u2, u3, u4)
    a0 = _fin(a0, w, o, A, t, b, t0)
    a1 = _fin(a1, w, o, A, t + 1, b, t1)
    a2 = _fin(a2, w, o, A, t + 2, b, t2)
    a3 = _fin(a3, w, o, A, t + 3, b, t3)
    return a0, a1, a2, a3


# ----------------------------------------------------------------------------- Q2_K / Q3_K
@njit(cache=True, inline="always")
def _k23_w(v, hm, j, n, q3):
    """2-bit field ``j`` of chunk ``v`` (plus the Q3_K high bit from ``hm``); 0..3 or 0..7."""
    q = vand_k(vsrl(v, 2 * j), _M2)
    if q3:
        q = q | vsll(vand_k(vsrl(hm, 4 * n + j), _M1), 2)
    return q


@njit(cache=True, inline="always")
def _k23_scale(tot, w, o, A, t, b, sub, s, q3):
    if q3:
        return tot + vload_i8(w, o + 32 + 16 * sub) * (s - vsplat_i32(4 * _bs(A, t, b, sub)))
    return tot + vand_k(vload_u8(w, o + 64 + 16 * sub), 0xF) * s


@njit(cache=True, inline="always")
def _k23_block(w, o, A, t, b, q3, xi, k, ntok):
    """Integer totals of up to 4 tokens (``ntok`` 1 or 4) for a Q2_K/Q3_K super-block."""
    xq = A[4]
    qo = o + (800 if q3 else 320)
    t0 = t1 = t2 = t3 = vzero_i32()
    for n in range(2):
        for h in range(2):
            p0 = p1 = p2 = p3 = q0 = q1 = q2 = q3_ = vzero_i32()
            r0 = r1 = r2 = r3 = u0 = u1 = u2 = u3 = vzero_i32()
            for c4 in range(4):
                cc = 4 * h + c4
                v = vload_i32(w, qo + 64 * (8 * n + cc))
                hm = vload_i32(w, o + 288 + 64 * cc) if q3 else v
                w0 = _k23_w(v, hm, 0, n, q3)
                w1 = _k23_w(v, hm, 1, n, q3)
                w2 = _k23_w(v, hm, 2, n, q3)
                w3 = _k23_w(v, hm, 3, n, q3)
                e = xi + 128 * n + 4 * cc
                p0, p1, p2, p3 = _dot4(p0, p1, p2, p3, w0, w1, w2, w3, xq, e)
                if ntok == 4:
                    q0, q1, q2, q3_ = _dot4(q0, q1, q2, q3_, w0, w1, w2, w3, xq, e + k)
                    r0, r1, r2, r3 = _dot4(r0, r1, r2, r3, w0, w1, w2, w3, xq, e + 2 * k)
                    u0, u1, u2, u3 = _dot4(u0, u1, u2, u3, w0, w1, w2, w3, xq, e + 3 * k)
            s = 8 * n + h
            t0 = _k23_scale(t0, w, o, A, t, b, s, p0, q3)
            t0 = _k23_scale(t0, w, o, A, t, b, s + 2, p1, q3)
            t0 = _k23_scale(t0, w, o, A, t, b, s + 4, p2, q3)
            t0 = _k23_scale(t0, w, o, A, t, b, s + 6, p3, q3)
            if ntok == 4:
                t1 = _k23_scale(t1, w, o, A, t + 1, b, s, q0, q3)
                t1 = _k23_scale(t1, w, o, A, t + 1, b, s + 2, q1, q3)
                t1 = _k23_scale(t1, w, o, A, t + 1, b, s + 4, q2, q3)
                t1 = _k23_scale(t1, w, o, A, t + 1, b, s + 6, q3_, q3)
                t2 = _k23_scale(t2, w, o, A, t + 2, b, s, r0, q3)
                t2 = _k23_scale(t2, w, o, A, t + 2, b, s + 2, r1, q3)
                t2 = _k23_scale(t2, w, o, A, t + 2, b, s + 4, r2, q3)
                t2 = _k23_scale(t2, w, o, A, t + 2, b, s + 6, r3, q3)
                t3 = _k23_scale(t3, w, o, A, t + 3, b, s, u0, q3)
                t3 = _k23_scale(t3, w, o, A, t + 3, b, s + 2, u1, q3)
                t3 = _k23_scale(t3, w, o, A, t + 3, b, s + 4, u2, q3)
                t3 = _k23_scale(t3, w, o, A, t + 3, b, s + 6, u3, q3)
    return t0, t1, t2, t3


@njit(cache=True, inline="always")
def _q2_mins(w, o, A, t, b):
    m = vzero_i32()
    for j in range(16):
        m = m + vsrl(vload_u8(w, o + 64 + 16 * j), 4) * vsplat_i32(_bs(A, t, b, j))
    return m


@njit(cache=True, inline="always")
def q2_k_t1(w, o, A, t, b, acc):
    tot, _, _, _ = _k23_block(w, o, A, t, b, False, _xk(A, t, b), A[4].shape[1], 1)
    return _fin_min(acc, w, o, A, t, b, tot, _q2_mins(w, o, A, t, b))


@njit(cache=True, inline="always")
def q2_k_t4(w, o, A, t, b, a0, a1, a2, a3):
    t0, t1, t2, t3 = _k23_block(w, o, A, t, b, False, _xk(A, t, b), A[4].shape[1], 4)
    a0 = _fin_min(a0, w, o, A, t, b, t0, _q2_mins(w, o, A, t, b))
    a1 = _fin_min(a1, w, o, A, t + 1, b, t1, _q2_mins(w, o, A, t + 1, b))
    a2 = _fin_min(a2, w, o, A, t + 2, b, t2, _q2_mins(w, o, A, t + 2, b))
    a3 = _fin_min(a3, w, o, A, t + 3, b, t3, _q2_mins(w, o, A, t + 3, b))
    return a0, a1, a2, a3


@njit(cache=True, inline="always")
def q3_k_t1(w, o, A, t, b, acc):
    tot, _, _, _ = _k23_block(w, o, A, t, b, True, _xk(A, t, b), A[4].shape[1], 1)
    return _fin(acc, w, o, A, t, b, tot)


@njit(cache=True, inline="always")
def q3_k_t4(w, o, A, t, b, a0, a1, a2, a3):
    t0, t1, t2, t3 = _k23_block(w, o, A, t, b, True, _xk(A, t, b), A[4].shape[1], 4)
    a0 = _fin(a0, w, o, A, t, b, t0)
    a1 = _fin(a1, w, o, A, t + 1, b, t1)
    a2 = _fin(a2, w, o, A, t + 2, b, t2)
    a3 = _fin(a3, w, o, A, t + 3, b, t3)
    return a0, a1, a2, a3


# ----------------------------------------------------------------------------- IQ4_XS
@njit(cache=True, inline="always")
def _iq4xs_sub(tot, w, o, A, t, b, ib, s):
    corr = 128 * (_bs(A, t, b, 2 * ib) + _bs(A, t, b, 2 * ib + 1))
    return tot + vload_i8(w, o + 32 + 16 * ib) * (s - vsplat_i32(corr))


@njit(cache=True, inline="always")
def q_iq4_xs(w, o, A, t, b, xi, k, ntok):
    xq = A[4]
    table = vload_i32(IQ4NL_TABLE, 0)
    t0 = t1 = t2 = t3 = vzero_i32()
    for ib in range(8):
        s0 = s1 = s2 = s3 = vzero_i32()
        for cc in range(4):
            lo, hi = _nib(vload_i32(w, o + 160 + 64 * (4 * ib + cc)))
            lo = vshuffle_bytes(table, lo)
            hi = vshuffle_bytes(table, hi)
            e = xi + 32 * ib + 4 * cc
            s0 = vdpbusd(vdpbusd(s0, lo, vbcast4(xq, e)), hi, vbcast4(xq, e + 16))
            if ntok == 4:
                s1 = vdpbusd(vdpbusd(s1, lo, vbcast4(xq, e + k)), hi, vbcast4(xq, e + k + 16))
                e2 = e + 2 * k
                s2 = vdpbusd(vdpbusd(s2, lo, vbcast4(xq, e2)), hi, vbcast4(xq, e2 + 16))
                e3 = e + 3 * k
                s3 = vdpbusd(vdpbusd(s3, lo, vbcast4(xq, e3)), hi, vbcast4(xq, e3 + 16))
        t0 = _iq4xs_sub(t0, w, o, A, t, b, ib, s0)
        if ntok == 4:
            t1 = _iq4xs_sub(t1, w, o, A, t + 1, b, ib, s1)
            t2 = _iq4xs_sub(t2, w, o, A, t + 2, b, ib, s2)
            t3 = _iq4xs_sub(t3, w, o, A, t + 3, b, ib, s3)
    return t0, t1, t2, t3


@njit(cache=True, inline="always")
def iq4_xs_t1(w, o, A, t, b, acc):
    tot, _, _, _ = q_iq4_xs(w, o, A, t, b, _xk(A, t, b), A[4].shape[1], 1)
    return _fin(acc, w, o, A, t, b, tot)


@njit(cache=True, inline="always")
def iq4_xs_t4(w, o, A, t, b, a0, a1, a2, a3):
    t0, t1, t2, t3 = q_iq4_xs(w, o, A, t, b, _xk(A, t, b), A[4].shape[1], 4)
    a0 = _fin(a0, w, o, A, t, b, t0)
    a1 = _fin(a1, w, o, A, t + 1, b, t1)
    a2 = _fin(a2, w, o, A, t + 2, b, t2)
    a3 = _fin(a3, w, o, A, t + 3, b, t3)
    return a0, a1, a2, a3
