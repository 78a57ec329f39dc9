"""Block kernels of the 256-weight "K" formats (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) x q8_K.

Same contract as :mod:`.qdot_legacy`: ``<fmt>_t1(w, o, A, t, b, acc)`` and ``<fmt>_t4``
(tokens ``t..t+3``) for one repacked group super-block. As in ggml, the integer dot products
of each sub-block are multiplied by the integer sub-block scales and summed as int32 over the
super-block before the single float multiply by ``d_weight * d_activation``; mins and value
offsets are taken back with the activation sums per 16 (``xbk``).

Two formats follow ggml's float accumulation exactly, so their results are bit-identical to
llama.cpp's on x86: Q4_K as its repacked ``q4_K_8x8`` kernels (products and min products in
two accumulators, ``acc - acc_min`` at the end: ``zero_pair``/``fin_pair``), and Q6_K as
``vec_dot_q6_K`` (8 lane accumulators, lane ``j`` = elements ``4j..4j+3`` of every 32, with
``hsum_float_8``: ``q6_k_l1``/``q6_k_l2`` over :mod:`.qdot_legacy`'s ``zero``/``fin``).

The formats' layouts, matmul kernels, row decoders, numpy twins and traits records
(:mod:`.traits`) close the file.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..gguf.constants import GGMLType
from ..simd import (
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
    vzero_f32,
    vzero_i32,
)
from .drive import drive, drive_acc, drive_lanes, drive_single
from .qdot_legacy import (
    IQ4NL_TABLE,
    KVALUES_IQ4NL,
    _nib,
    chunk_byte,
    f16_at,
    f16_np,
    fin,
    nibbles_np,
    zero,
)
from .traits import (
    ACT_Q8K,
    CHUNK4,
    IQ4XSSC,
    K4SC,
    Q3SC,
    ROWS,
    FormatTraits,
    Layout,
    T,
    register,
)

# llama.cpp multiplies K-quant weights it does not repack (Q6_K on x86) with its tiled kernels
# when the matmul has at least this many tokens, and with vec_dot below (ggml_tiled_min_batch)
TILED_MIN_TOKENS = 8

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
def _k45_tot1(w, o, A, t, b, q5):
    """Integer sum of the super-block (sub-block scales applied) for token ``t``."""
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
    return tot


@njit(cache=True, inline="always")
def _k45_pair4(w, o, q5, jj, xq, x0, x1, x2, x3):
    """Integer sums of pair ``jj`` (sub-blocks 2jj, 2jj+1, scales applied) for the four
    tokens whose super-block activations start at ``x0..x3``; weights decoded once."""
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
    return l0 * sl + h0 * sh, l1 * sl + h1 * sh, l2 * sl + h2 * sh, l3 * sl + h3 * sh


@njit(cache=True, inline="always")
def _k45_tot4(w, o, A, t, b, q5):
    """:func:`_k45_tot1` for tokens ``t..t+3``, weights decoded once."""
    xq = A[4]
    x0 = _xk(A, t, b)
    k = xq.shape[1]
    t0 = t1 = t2 = t3 = vzero_i32()
    for jj in range(4):
        p0, p1, p2, p3 = _k45_pair4(w, o, q5, jj, xq, x0, x0 + k, x0 + 2 * k, x0 + 3 * k)
        t0, t1, t2, t3 = t0 + p0, t1 + p1, t2 + p2, t3 + p3
    return t0, t1, t2, t3


# Q4_K as ggml's repacked kernels (q4_K_8x8) sum it: super-block products and min products
# in two accumulators, subtracted at the end (``zero_pair`` / ``fin_pair``)
@njit(cache=True, inline="always")
def zero_pair():
    z = vzero_f32()
    return (z, z)


@njit(cache=True, inline="always")
def fin_pair(a):
    return a[0] - a[1]


@njit(cache=True, inline="always")
def _acc_pair(a, w, o, A, t, b, tot):
    dx = vsplat_f32(A[5][t, b])
    msum = _k45_mins(w, o, A, t, b)
    return (
        vfma(vload_f16(w, o) * dx, vcvt(tot), a[0]),
        vfma(vload_f16(w, o + 32) * dx, vcvt(msum), a[1]),
    )


@njit(cache=True, inline="always")
def q4_k_t1(w, o, A, t, b, acc):
    return _acc_pair(acc, w, o, A, t, b, _k45_tot1(w, o, A, t, b, False))


@njit(cache=True, inline="always")
def _k4_mins64(w, o, A, t, b, jj):
    """Integer min sum of sub-blocks 2jj and 2jj+1 (the 64 weights of pair ``jj``)."""
    m = vload_u8(w, o + 192 + 16 * (2 * jj)) * vsplat_i32(
        _bs(A, t, b, 4 * jj) + _bs(A, t, b, 4 * jj + 1)
    )
    bs = _bs(A, t, b, 4 * jj + 2) + _bs(A, t, b, 4 * jj + 3)
    return m + vload_u8(w, o + 192 + 16 * (2 * jj + 1)) * vsplat_i32(bs)


@njit(cache=True, inline="always")
def _acc_pair64(a, w, o, A, t, b, jj, tot):
    dx = vsplat_f32(A[5][t, b])
    return (
        vfma(vload_f16(w, o) * dx, vcvt(tot), a[0]),
        vfma(vload_f16(w, o + 32) * dx, vcvt(_k4_mins64(w, o, A, t, b, jj)), a[1]),
    )


@njit(cache=True, inline="always")
def q4_k_t4(w, o, A, t, b, a0, a1, a2, a3):
    """Four tokens as ggml's AVX-512 ``gemm_q4_K_8x8`` (which the 4-token groups of a batch
    go through): one multiply-add per 64 weights instead of per super-block."""
    xq = A[4]
    x0 = _xk(A, t, b)
    k = xq.shape[1]
    for jj in range(4):
        p0, p1, p2, p3 = _k45_pair4(w, o, False, jj, xq, x0, x0 + k, x0 + 2 * k, x0 + 3 * k)
        a0 = _acc_pair64(a0, w, o, A, t, b, jj, p0)
        a1 = _acc_pair64(a1, w, o, A, t + 1, b, jj, p1)
        a2 = _acc_pair64(a2, w, o, A, t + 2, b, jj, p2)
        a3 = _acc_pair64(a3, w, o, A, t + 3, b, jj, p3)
    return a0, a1, a2, a3


@njit(cache=True, inline="always")
def q5_k_t1(w, o, A, t, b, acc):
    tot = _k45_tot1(w, o, A, t, b, True)
    return _fin_min(acc, w, o, A, t, b, tot, _k45_mins(w, o, A, t, b))


@njit(cache=True, inline="always")
def q5_k_t4(w, o, A, t, b, a0, a1, a2, a3):
    t0, t1, t2, t3 = _k45_tot4(w, o, A, t, b, True)
    a0 = _fin_min(a0, w, o, A, t, b, t0, _k45_mins(w, o, A, t, b))
    a1 = _fin_min(a1, w, o, A, t + 1, b, t1, _k45_mins(w, o, A, t + 1, b))
    a2 = _fin_min(a2, w, o, A, t + 2, b, t2, _k45_mins(w, o, A, t + 2, b))
    a3 = _fin_min(a3, w, o, A, t + 3, b, t3, _k45_mins(w, o, A, t + 3, b))
    return a0, a1, a2, a3


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
def _dot4(s1, s2, s3, s4, w1, w2, w3, w4, xq, xi):
    s1 = vdpbusd(s1, w1, vbcast4(xq, xi))
    s2 = vdpbusd(s2, w2, vbcast4(xq, xi + 32))
    s3 = vdpbusd(s3, w3, vbcast4(xq, xi + 64))
    s4 = vdpbusd(s4, w4, vbcast4(xq, xi + 96))
    return s1, s2, s3, s4


@njit(cache=True, inline="always")
def _q6_scaled(w, so, w1, w2, w3, w4, xq, e):
    """Scale-weighted ``q . x`` of one lane (see :func:`_q6_lane`) from decoded weights."""
    z = vzero_i32()
    s = vload_i8(w, so) * vdpbusd(z, w1, vbcast4(xq, e))
    s = s + vload_i8(w, so + 32) * vdpbusd(z, w2, vbcast4(xq, e + 32))
    s = s + vload_i8(w, so + 64) * vdpbusd(z, w3, vbcast4(xq, e + 64))
    return s + vload_i8(w, so + 96) * vdpbusd(z, w4, vbcast4(xq, e + 96))


@njit(cache=True, inline="always")
def _q6_lane(w, o, n, cc, xq, e):
    """Lane ``cc`` of half ``n`` for one token (activations at ``xq[e:]``, ``e`` = its
    super-block + 128n + 4cc): sum over the 4 chunks of sub-block scale * (q . x), q in
    0..63 (the offset of 32 is taken back per lane by :func:`_q6_offset`)."""
    w1, w2, w3, w4 = _q6_chunk(w, o, n, cc)
    return _q6_scaled(w, o + 32 + 16 * (8 * n + cc // 4), w1, w2, w3, w4, xq, e)


@njit(cache=True, inline="always")
def _q6_offset(w, o, A, t, b, k):
    """32 * (scale . activation sum) of sub-blocks 2k and 2k+1: what ggml takes back from
    lane ``k`` (``q8sclsub``)."""
    s0 = vload_i8(w, o + 32 + 16 * (2 * k)) * vsplat_i32(32 * _bs(A, t, b, 2 * k))
    return s0 + vload_i8(w, o + 32 + 16 * (2 * k + 1)) * vsplat_i32(32 * _bs(A, t, b, 2 * k + 1))


@njit(cache=True, inline="always")
def _q6_l(w, o, A, t, b, xq, xi, k):
    s = _q6_lane(w, o, 0, k, xq, xi + 4 * k) + _q6_lane(w, o, 1, k, xq, xi + 128 + 4 * k)
    return vcvt(s - _q6_offset(w, o, A, t, b, k))


@njit(cache=True, inline="always")
def _q6_step(w, o, A, t, b, a):
    """One super-block of token ``t`` into ggml's 8 lane accumulators (``vec_dot_q6_K``:
    lane ``k`` = elements 4k..4k+3 of every 32, ``fma(d_x * d_w, lane sum, acc)``)."""
    xq = A[4]
    xi = _xk(A, t, b)
    d = vload_f16(w, o) * vsplat_f32(A[5][t, b])
    a0, a1, a2, a3, a4, a5, a6, a7, sm = a
    a0 = vfma(d, _q6_l(w, o, A, t, b, xq, xi, 0), a0)
    a1 = vfma(d, _q6_l(w, o, A, t, b, xq, xi, 1), a1)
    a2 = vfma(d, _q6_l(w, o, A, t, b, xq, xi, 2), a2)
    a3 = vfma(d, _q6_l(w, o, A, t, b, xq, xi, 3), a3)
    a4 = vfma(d, _q6_l(w, o, A, t, b, xq, xi, 4), a4)
    a5 = vfma(d, _q6_l(w, o, A, t, b, xq, xi, 5), a5)
    a6 = vfma(d, _q6_l(w, o, A, t, b, xq, xi, 6), a6)
    a7 = vfma(d, _q6_l(w, o, A, t, b, xq, xi, 7), a7)
    return (a0, a1, a2, a3, a4, a5, a6, a7, sm)


@njit(cache=True, inline="always")
def q6_k_l1(w, o, A, t, b, nb, a):
    """Q6_K with ggml's lane accumulators (``qdot_legacy.zero`` / ``fin``), one token."""
    return _q6_step(w, o, A, t, b, a)


@njit(cache=True, inline="always")
def q6_k_l2(w, o, A, t, b, nb, a, c):
    """Two tokens (the integer work is per token; the weights come from cache)."""
    return _q6_step(w, o, A, t, b, a), _q6_step(w, o, A, t + 1, b, c)


# Q6_K as llama.cpp's tiled K-quant matmul sums it (``ggml-cpu/tiled``: batches of 8 tokens
# and more, weights not repacked): the whole super-block as one exact int32,
# ``s1 = sum_s scale_s * sum (q - 32) x``, then ``acc += (float(s1) * d_w) * d_x``, super-blocks
# in order (the add is contracted into a multiply-add by the compiler).
@njit(cache=True, inline="always")
def _q6_offsets(w, o, A, t, b):
    s = vzero_i32()
    for k in range(8):
        s = s + _q6_offset(w, o, A, t, b, k)
    return s


@njit(cache=True, inline="always")
def _q6_tiled_fin(acc, w, o, A, t, b, s1):
    r = vcvt(s1) * vload_f16(w, o)
    return vfma(r, vsplat_f32(A[5][t, b]), acc)


@njit(cache=True, inline="always")
def q6_k_tiled_t1(w, o, A, t, b, acc):
    """One token, llama.cpp's tiled Q6_K numerics (f32 vector accumulator)."""
    xq = A[4]
    xi = _xk(A, t, b)
    s = vzero_i32()
    for n in range(2):
        for k in range(8):
            w1, w2, w3, w4 = _q6_chunk(w, o, n, k)
            so = o + 32 + 16 * (8 * n + k // 4)
            s = s + _q6_scaled(w, so, w1, w2, w3, w4, xq, xi + 128 * n + 4 * k)
    return _q6_tiled_fin(acc, w, o, A, t, b, s - _q6_offsets(w, o, A, t, b))


@njit(cache=True, inline="always")
def q6_k_tiled_t4(w, o, A, t, b, a0, a1, a2, a3):
    """Four tokens as :func:`q6_k_tiled_t1`, the weights decoded once."""
    xq = A[4]
    k4 = xq.shape[1]
    x0 = _xk(A, t, b)
    s0 = s1 = s2 = s3 = vzero_i32()
    for n in range(2):
        for k in range(8):
            w1, w2, w3, w4 = _q6_chunk(w, o, n, k)
            so = o + 32 + 16 * (8 * n + k // 4)
            e = x0 + 128 * n + 4 * k
            s0 = s0 + _q6_scaled(w, so, w1, w2, w3, w4, xq, e)
            s1 = s1 + _q6_scaled(w, so, w1, w2, w3, w4, xq, e + k4)
            s2 = s2 + _q6_scaled(w, so, w1, w2, w3, w4, xq, e + 2 * k4)
            s3 = s3 + _q6_scaled(w, so, w1, w2, w3, w4, xq, e + 3 * k4)
    a0 = _q6_tiled_fin(a0, w, o, A, t, b, s0 - _q6_offsets(w, o, A, t, b))
    a1 = _q6_tiled_fin(a1, w, o, A, t + 1, b, s1 - _q6_offsets(w, o, A, t + 1, b))
    a2 = _q6_tiled_fin(a2, w, o, A, t + 2, b, s2 - _q6_offsets(w, o, A, t + 2, b))
    a3 = _q6_tiled_fin(a3, w, o, A, t + 3, b, s3 - _q6_offsets(w, o, A, t + 3, b))
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


# ----------------------------------------------------------------------------- the formats
# Super-blocks of 256: f16 d (and dmin) per row, sub-block scales (K4SC / Q3SC / IQ4XSSC:
# unpacked to a byte each), quants as 4-byte chunks.
_QK = 256
LAYOUT_Q2_K = Layout.of(
    GGMLType.Q2_K, _QK, ACT_Q8K, (ROWS, 80, 2), (ROWS, 82, 2), (T, 0, 16, 1), (CHUNK4, 16, 64)
)
LAYOUT_Q3_K = Layout.of(
    GGMLType.Q3_K, _QK, ACT_Q8K, (ROWS, 108, 2), (Q3SC, 96, 12), (CHUNK4, 0, 32), (CHUNK4, 32, 64)
)
LAYOUT_Q4_K = Layout.of(
    GGMLType.Q4_K, _QK, ACT_Q8K, (ROWS, 0, 2), (ROWS, 2, 2), (K4SC, 4, 12), (CHUNK4, 16, 128)
)
LAYOUT_Q5_K = Layout.of(
    GGMLType.Q5_K,
    _QK,
    ACT_Q8K,
    (ROWS, 0, 2),
    (ROWS, 2, 2),
    (K4SC, 4, 12),
    (CHUNK4, 16, 32),
    (CHUNK4, 48, 128),
)
LAYOUT_Q6_K = Layout.of(
    GGMLType.Q6_K,
    _QK,
    ACT_Q8K,
    (ROWS, 208, 2),
    (T, 192, 16, 1),
    (CHUNK4, 0, 128),
    (CHUNK4, 128, 64),
)
LAYOUT_IQ4_XS = Layout.of(
    GGMLType.IQ4_XS, _QK, ACT_Q8K, (ROWS, 0, 2), (IQ4XSSC, 2, 6), (CHUNK4, 8, 128)
)
_BB_Q2_K, _BB_Q3_K = LAYOUT_Q2_K.dst_bytes, LAYOUT_Q3_K.dst_bytes
_BB_Q4_K, _BB_Q5_K = LAYOUT_Q4_K.dst_bytes, LAYOUT_Q5_K.dst_bytes
_BB_Q6_K, _BB_IQ4_XS = LAYOUT_Q6_K.dst_bytes, LAYOUT_IQ4_XS.dst_bytes


@njit(cache=True)
def mm_q2_k(w, desc, A, t0, t1, g0, g1, out, ot, add):
    nblk = desc[3] // _QK
    drive(q2_k_t1, q2_k_t4, w, desc[1], nblk, _BB_Q2_K, g0, g1, A, t0, t1, out, ot, add)


@njit(cache=True)
def mm_q3_k(w, desc, A, t0, t1, g0, g1, out, ot, add):
    nblk = desc[3] // _QK
    drive(q3_k_t1, q3_k_t4, w, desc[1], nblk, _BB_Q3_K, g0, g1, A, t0, t1, out, ot, add)


@njit(cache=True)
def mm_q4_k(w, desc, A, t0, t1, g0, g1, out, ot, add):
    nblk, k1, k4, z, f = desc[3] // _QK, q4_k_t1, q4_k_t4, zero_pair, fin_pair
    drive_acc(z, f, k1, k4, w, desc[1], nblk, _BB_Q4_K, g0, g1, A, t0, t1, out, ot, add)


@njit(cache=True)
def mm_q4_k_single(w, desc, A, t0, t1, g0, g1, out, ot, add):
    """Every token as one alone (ggml's gemv numerics; see ``FormatTraits.matmul_invariant``)."""
    nblk, z, f = desc[3] // _QK, zero_pair, fin_pair
    drive_single(z, f, q4_k_t1, w, desc[1], nblk, _BB_Q4_K, g0, g1, A, t0, t1, out, ot, add)


@njit(cache=True)
def mm_q5_k(w, desc, A, t0, t1, g0, g1, out, ot, add):
    nblk = desc[3] // _QK
    drive(q5_k_t1, q5_k_t4, w, desc[1], nblk, _BB_Q5_K, g0, g1, A, t0, t1, out, ot, add)


@njit(cache=True)
def mm_q6_k(w, desc, A, t0, t1, g0, g1, out, ot, add):
    nblk, bb = desc[3] // _QK, _BB_Q6_K
    if t1 - t0 >= TILED_MIN_TOKENS:  # llama.cpp's tiled K-quant matmul (see above)
        k1, k4 = q6_k_tiled_t1, q6_k_tiled_t4
        drive(k1, k4, w, desc[1], nblk, bb, g0, g1, A, t0, t1, out, ot, add)
    else:
        mm_q6_k_vec(w, desc, A, t0, t1, g0, g1, out, ot, add)


@njit(cache=True)
def mm_q6_k_vec(w, desc, A, t0, t1, g0, g1, out, ot, add):
    """Any token count as llama.cpp's ``vec_dot`` (its kernel under 8 tokens): the
    batch-invariant Q6_K kernel (``FormatTraits.matmul_invariant``)."""
    nblk, k1, k2 = desc[3] // _QK, q6_k_l1, q6_k_l2
    drive_lanes(zero, fin, k1, k2, w, desc[1], nblk, _BB_Q6_K, g0, g1, A, t0, t1, out, ot, add)


@njit(cache=True)
def mm_iq4_xs(w, desc, A, t0, t1, g0, g1, out, ot, add):
    nblk = desc[3] // _QK
    drive(iq4_xs_t1, iq4_xs_t4, w, desc[1], nblk, _BB_IQ4_XS, g0, g1, A, t0, t1, out, ot, add)


# --- row decoders: row ``r`` of the group block at ``w[o:]`` -> ``out[y0:y0+256]``
@njit(cache=True, inline="always")
def row_q2_k(w, o, r, out, y0):
    d, dmin = f16_at(w, o, r), f16_at(w, o + 32, r)
    for n in range(2):
        for j in range(4):
            for h in range(2):
                s = np.int64(w[o + 64 + (8 * n + 2 * j + h) * 16 + r])
                dl = d * np.float32(s & 0xF)
                ml = dmin * np.float32(s >> 4)
                for l in range(16):
                    q = (chunk_byte(w, o + 320, r, 32 * n + 16 * h + l) >> (2 * j)) & 3
                    out[y0 + 128 * n + 32 * j + 16 * h + l] = dl * np.float32(q) - ml


@njit(cache=True, inline="always")
def row_q3_k(w, o, r, out, y0):
    d = f16_at(w, o, r)
    for n in range(2):
        for j in range(4):
            for h in range(2):
                s = np.int64(np.int8(w[o + 32 + (8 * n + 2 * j + h) * 16 + r]))
                dl = d * np.float32(s)
                for l in range(16):
                    i = 16 * h + l
                    q = (chunk_byte(w, o + 800, r, 32 * n + i) >> (2 * j)) & 3
                    hb = (chunk_byte(w, o + 288, r, i) >> (4 * n + j)) & 1
                    out[y0 + 128 * n + 32 * j + i] = dl * np.float32(q - (0 if hb else 4))


@njit(cache=True, inline="always")
def _row_k45(q5, w, o, r, out, y0):
    d, dmin = f16_at(w, o, r), f16_at(w, o + 32, r)
    qo = o + (832 if q5 else 320)
    for j in range(4):
        for h in range(2):
            sc = np.int64(w[o + 64 + (2 * j + h) * 16 + r])
            mn = np.int64(w[o + 192 + (2 * j + h) * 16 + r])
            dl = d * np.float32(sc)
            ml = dmin * np.float32(mn)
            for l in range(32):
                q = (chunk_byte(w, qo, r, 32 * j + l) >> (4 * h)) & 0xF
                if q5:
                    q += ((chunk_byte(w, o + 320, r, l) >> (2 * j + h)) & 1) * 16
                out[y0 + 64 * j + 32 * h + l] = dl * np.float32(q) - ml


@njit(cache=True, inline="always")
def row_q4_k(w, o, r, out, y0):
    _row_k45(False, w, o, r, out, y0)


@njit(cache=True, inline="always")
def row_q5_k(w, o, r, out, y0):
    _row_k45(True, w, o, r, out, y0)


@njit(cache=True, inline="always")
def row_q6_k(w, o, r, out, y0):
    d = f16_at(w, o, r)
    for n in range(2):
        for l in range(32):
            a = chunk_byte(w, o + 288, r, 64 * n + l)
            b = chunk_byte(w, o + 288, r, 64 * n + 32 + l)
            h = chunk_byte(w, o + 2336, r, 32 * n + l)
            qs = (
                (a & 0xF) | ((h & 3) << 4),
                (b & 0xF) | (((h >> 2) & 3) << 4),
                (a >> 4) | (((h >> 4) & 3) << 4),
                (b >> 4) | (((h >> 6) & 3) << 4),
            )
            for k in range(4):
                s = np.int64(np.int8(w[o + 32 + (8 * n + 2 * k + l // 16) * 16 + r]))
                out[y0 + 128 * n + 32 * k + l] = d * np.float32(s) * np.float32(qs[k] - 32)


@njit(cache=True, inline="always")
def row_iq4_xs(w, o, r, out, y0):
    d = f16_at(w, o, r)
    for ib in range(8):
        s = np.int64(np.int8(w[o + 32 + ib * 16 + r]))
        dl = d * np.float32(s)
        for j in range(16):
            q = chunk_byte(w, o + 160, r, 16 * ib + j)
            out[y0 + 32 * ib + j] = dl * np.float32(KVALUES_IQ4NL[q & 0xF])
            out[y0 + 32 * ib + j + 16] = dl * np.float32(KVALUES_IQ4NL[q >> 4])


# --- numpy twins: fields of .formats.unpack_fields -> float32 [rows, blocks, 256]
def q2_k_numpy(f: dict) -> np.ndarray:
    d, dmin = f16_np(f["f80"])[..., None], f16_np(f["f82"])[..., None]
    sc = f["f0"].astype(np.int64)  # [r, b, 16]
    qs = f["f16"].astype(np.int64).reshape(*sc.shape[:2], 2, 32)  # two halves of 32 bytes
    out = np.empty((*sc.shape[:2], 2, 4, 2, 16), np.float32)
    for j in range(4):
        v = (qs >> (2 * j)) & 3
        for h in range(2):  # which 16 bytes of the half
            idx = np.arange(2) * 8 + 2 * j + h  # sub-block of each half
            dl = d * (sc[..., idx] & 0xF).astype(np.float32)
            ml = dmin * (sc[..., idx] >> 4).astype(np.float32)
            out[..., j, h, :] = dl[..., None] * v[..., h * 16 : (h + 1) * 16] - ml[..., None]
    return out.reshape(*sc.shape[:2], 256)


def q3_k_numpy(f: dict) -> np.ndarray:
    d = f16_np(f["f108"])[..., None]
    sc = f["sc"]  # [r, b, 16] signed
    hm = f["f0"].astype(np.int64)  # [r, b, 32]
    qs = f["f32"].astype(np.int64).reshape(*sc.shape[:2], 2, 32)
    out = np.empty((*sc.shape[:2], 2, 4, 2, 16), np.float32)
    for n in range(2):
        for j in range(4):
            low = (qs[..., n, :] >> (2 * j)) & 3
            high = (hm >> (4 * n + j)) & 1
            v = low - np.where(high == 1, 0, 4)
            for h in range(2):
                dl = d[..., 0] * sc[..., 8 * n + 2 * j + h].astype(np.float32)
                out[..., n, j, h, :] = dl[..., None] * v[..., h * 16 : (h + 1) * 16]
    return out.reshape(*sc.shape[:2], 256)


def _k45_numpy(f: dict, q5: bool) -> np.ndarray:
    d, dmin = f16_np(f["f0"]), f16_np(f["f2"])
    sc, mn = f["sc"], f["mn"]
    q = f["f48" if q5 else "f16"].astype(np.int64).reshape(*sc.shape[:2], 4, 32)
    out = np.empty((*sc.shape[:2], 4, 2, 32), np.float32)
    for j in range(4):
        for h in range(2):
            v = (q[..., j, :] >> (4 * h)) & 0xF
            if q5:
                v = v + ((f["f16"].astype(np.int64) >> (2 * j + h)) & 1) * 16
            dl = d * sc[..., 2 * j + h].astype(np.float32)
            ml = dmin * mn[..., 2 * j + h].astype(np.float32)
            out[..., j, h, :] = dl[..., None] * v - ml[..., None]
    return out.reshape(*sc.shape[:2], 256)


def q4_k_numpy(f: dict) -> np.ndarray:
    return _k45_numpy(f, False)


def q5_k_numpy(f: dict) -> np.ndarray:
    return _k45_numpy(f, True)


def q6_k_numpy(f: dict) -> np.ndarray:
    d = f16_np(f["f208"])
    sc = f["f192"].view(np.int8).astype(np.int64)  # [r, b, 16]
    ql = f["f0"].astype(np.int64).reshape(*sc.shape[:2], 2, 64)
    qh = f["f128"].astype(np.int64).reshape(*sc.shape[:2], 2, 32)
    out = np.empty((*sc.shape[:2], 2, 4, 32), np.float32)
    for n in range(2):
        a, b, h = ql[..., n, :32], ql[..., n, 32:], qh[..., n, :]
        quads = (
            (a & 0xF) | ((h & 3) << 4),
            (b & 0xF) | (((h >> 2) & 3) << 4),
            (a >> 4) | (((h >> 4) & 3) << 4),
            (b >> 4) | (((h >> 6) & 3) << 4),
        )
        for k, v in enumerate(quads):
            s = sc[..., 8 * n + 2 * k : 8 * n + 2 * k + 2].astype(np.float32)  # two 16-blocks
            dl = np.repeat(d[..., None] * s, 16, axis=-1)
            out[..., n, k, :] = dl * (v - 32).astype(np.float32)
    return out.reshape(*sc.shape[:2], 256)


def iq4_xs_numpy(f: dict) -> np.ndarray:
    d = f16_np(f["f0"])
    sc = f["sc"]  # [r, b, 8] signed (ls - 32)
    lo, hi = nibbles_np(f["f8"].reshape(*sc.shape[:2], 8, 16))
    q = np.concatenate([lo, hi], axis=-1)  # [r, b, 8, 32]
    dl = d[..., None] * sc.astype(np.float32)
    return (dl[..., None] * KVALUES_IQ4NL[q].astype(np.float32)).reshape(*sc.shape[:2], 256)


register(FormatTraits(LAYOUT_Q2_K, mm_q2_k, row_q2_k, q2_k_numpy))
register(FormatTraits(LAYOUT_Q3_K, mm_q3_k, row_q3_k, q3_k_numpy))
register(FormatTraits(LAYOUT_Q4_K, mm_q4_k, row_q4_k, q4_k_numpy, matmul_invariant=mm_q4_k_single))
register(FormatTraits(LAYOUT_Q5_K, mm_q5_k, row_q5_k, q5_k_numpy))
register(FormatTraits(LAYOUT_Q6_K, mm_q6_k, row_q6_k, q6_k_numpy, matmul_invariant=mm_q6_k_vec))
register(FormatTraits(LAYOUT_IQ4_XS, mm_iq4_xs, row_iq4_xs, iq4_xs_numpy))
