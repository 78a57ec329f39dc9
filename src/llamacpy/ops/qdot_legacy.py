"""Block kernels of the 32-weight formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4) x q8,
with ggml's float accumulation order, so results are bit-identical to llama.cpp's.

ggml's x86 ``vec_dot`` of these formats keeps 8 float lanes per dot product; lane ``j`` gets,
block after block, ``fma(d_w*d_x, (float) sum of products of elements 4j..4j+3, lane)``
(elements 0..15 are the low nibbles, 16..31 the high ones), and the result is the lanes'
``hsum_float_8`` (plus ``sum(m * s)`` for the formats with a min; IQ4_NL and MXFP4 alternate
two lane sets between even and odd blocks). Here lane vectors run across 16 rows: an
accumulator is a tuple of 8 (IQ4_NL, MXFP4: 16) ``f32x16`` plus one for the min term, and
``vpdpbusd`` of one 64-byte chunk gives exactly one ggml lane for 16 rows.

Weights are unsigned bytes for ``vpdpbusd`` (u8 x s8): nibbles as they are, Q8_0, IQ4_NL and
MXFP4 values offset by +128 (at repack / in the lookup tables); offsets are taken back per
lane with the activation sums of 4 (``xb``), used as the dot product's starting value.
MXFP4's scale is its E8M0 byte ``e`` as ``2**(e - 128)`` (the table holds E2M1 values
doubled, as ggml's ``kvalues_mxfp4``).

Per format: ``<fmt>_t1(w, o, A, t, b, nb, acc)`` adds group block ``w[o:]`` (16 rows x 32)
times token ``t``'s block ``b`` (of ``nb``); ``<fmt>_t2`` does tokens ``t`` and ``t+1``,
decoding the weights once; ``zero()``/``fin(acc)`` (IQ4_NL, MXFP4: ``zero18``/``fin18``, and
both step through ``pair_t1``) start and finish an accumulator. ``A`` is the activation
tuple ``(xq, xd, xs, xb, xqk, xdk, xbk, xf)`` of :mod:`.quantize_act`. MXFP4 has no ``_t2``:
``mxfp4_rows4`` / ``mxfp4_rows2`` run a whole row group for four / two tokens (any rows, as
one expert's gathered tokens) with each token's arithmetic that of ``mxfp4_t1``.

The formats' layouts, matmul kernels, row decoders, numpy twins and traits records
(:mod:`.traits`) close the file.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from ..gguf.constants import GGMLType
from ..simd import (
    f16_to_f32,
    vand_k,
    vbcast4,
    vcvt,
    vdpbusd,
    vfma,
    vldexp,
    vload_f16,
    vload_i32,
    vload_u8,
    vshuffle_bytes,
    vsll,
    vsplat_f32,
    vsplat_i32,
    vsrl,
    vzero_f32,
)
from .drive import drive_lanes, drive_rows
from .traits import ACT_Q8, CHUNK4, Q5HB, ROWS, XOR80, FormatTraits, Layout, register

KVALUES_IQ4NL = np.array(
    [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8
)
# E2M1 values doubled (ggml's kvalues_mxfp4)
KVALUES_MXFP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.int8)
_M4 = 0x0F0F0F0F


def _u8_table(kvalues: np.ndarray) -> np.ndarray:
    """Values + 128 as unsigned bytes, the 16-byte table repeated in each 128-bit lane."""
    return np.tile((kvalues.astype(np.int16) + 128).astype(np.uint8), 4)


IQ4NL_TABLE = _u8_table(KVALUES_IQ4NL)
MXFP4_TABLE = _u8_table(KVALUES_MXFP4)

# format selectors of the shared kernels below (the ggml type ids)
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4 = (
    int(t)
    for t in (
        GGMLType.Q4_0,
        GGMLType.Q4_1,
        GGMLType.Q5_0,
        GGMLType.Q5_1,
        GGMLType.Q8_0,
        GGMLType.IQ4_NL,
        GGMLType.MXFP4,
    )
)
_E8M0_BIAS = 128  # MXFP4: scale 2**(e - 128) (ggml_e8m0_to_fp32_half)


@njit(cache=True, inline="always")
def _nib(v):
    return vand_k(v, _M4), vand_k(vsrl(v, 4), _M4)


@njit(cache=True, inline="always")
def zero():
    z = vzero_f32()
    return (z, z, z, z, z, z, z, z, z)


@njit(cache=True, inline="always")
def zero18():
    z = vzero_f32()
    return (z, z, z, z, z, z, z, z, z, z, z, z, z, z, z, z, z, z)


@njit(cache=True, inline="always")
def _hsum8(a0, a1, a2, a3, a4, a5, a6, a7):
    """ggml's hsum_float_8 lane order, for 16 rows at once."""
    return ((a4 + a0) + (a6 + a2)) + ((a5 + a1) + (a7 + a3))


@njit(cache=True, inline="always")
def fin(a):
    return _hsum8(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]) + a[8]


@njit(cache=True, inline="always")
def fin18(a):
    h = _hsum8(
        a[0] + a[8],
        a[1] + a[9],
        a[2] + a[10],
        a[3] + a[11],
        a[4] + a[12],
        a[5] + a[13],
        a[6] + a[14],
        a[7] + a[15],
    )
    return vfma(a[16], a[17], h)


# ----------------------------------------------------------------------------- weights
@njit(cache=True, inline="always")
def _weights(fmt, w, o, c):
    """The two u8 weight vectors (lanes c and 4+c) of chunk ``c`` (0..3) of a nibble format."""
    if fmt in (Q4_0, IQ4_NL):
        lo, hi = _nib(vload_i32(w, o + 32 + 64 * c))
        if fmt == IQ4_NL:
            table = vload_i32(IQ4NL_TABLE, 0)
            lo, hi = vshuffle_bytes(table, lo), vshuffle_bytes(table, hi)
        return lo, hi
    if fmt == MXFP4:
        table = vload_i32(MXFP4_TABLE, 0)
        lo, hi = _nib(vload_i32(w, o + 16 + 64 * c))
        return vshuffle_bytes(table, lo), vshuffle_bytes(table, hi)
    if fmt == Q4_1:
        return _nib(vload_i32(w, o + 64 + 64 * c))
    ho = o + (32 if fmt == Q5_0 else 64)
    lo, hi = _nib(vload_i32(w, ho + 64 + 64 * c))
    h = vload_i32(w, ho)
    lo = lo | vsll(vand_k(vsrl(h, 2 * c), 0x01010101), 4)
    hi = hi | vsll(vand_k(vsrl(h, 2 * c + 1), 0x01010101), 4)
    return lo, hi


@njit(cache=True, inline="always")
def _offset(fmt):
    if fmt == Q4_0:
        return 8
    if fmt == Q5_0:
        return 16
    if fmt in (Q8_0, IQ4_NL, MXFP4):
        return 128
    return 0


@njit(cache=True, inline="always")
def _lane(fmt, lane_w, A, t, b, j):
    """The int32 lane ``j`` of token ``t``'s block ``b`` (sum of 4 products, offset removed)."""
    k = _offset(fmt)
    init = vsplat_i32(-k * A[3][t, 8 * b + j])
    xi = t * A[0].shape[1] + 32 * b + 4 * j
    return vdpbusd(init, lane_w, vbcast4(A[0], xi))


@njit(cache=True, inline="always")
def _e8m0(w, o):
    """MXFP4: the 16 rows' scales ``2**(e - 128)`` of the group block at ``w[o:]``."""
    e = vcvt(vload_u8(w, o)) - vsplat_f32(np.float32(_E8M0_BIAS))
    return vldexp(vsplat_f32(np.float32(1.0)), e)


@njit(cache=True, inline="always")
def _scale(fmt, w, o, A, t, b):
    if fmt == MXFP4:
        return _e8m0(w, o) * vsplat_f32(A[1][t, b])
    return vload_f16(w, o) * vsplat_f32(A[1][t, b])


@njit(cache=True, inline="always")
def _step(fmt, w, o, A, t, b, a):
    """Add one block of one token to the accumulator tuple ``a`` (nibble formats)."""
    dd = _scale(fmt, w, o, A, t, b)
    a0, a1, a2, a3, a4, a5, a6, a7, sm = a
    lo, hi = _weights(fmt, w, o, 0)
    a0 = vfma(dd, vcvt(_lane(fmt, lo, A, t, b, 0)), a0)
    a4 = vfma(dd, vcvt(_lane(fmt, hi, A, t, b, 4)), a4)
    lo, hi = _weights(fmt, w, o, 1)
    a1 = vfma(dd, vcvt(_lane(fmt, lo, A, t, b, 1)), a1)
    a5 = vfma(dd, vcvt(_lane(fmt, hi, A, t, b, 5)), a5)
    lo, hi = _weights(fmt, w, o, 2)
    a2 = vfma(dd, vcvt(_lane(fmt, lo, A, t, b, 2)), a2)
    a6 = vfma(dd, vcvt(_lane(fmt, hi, A, t, b, 6)), a6)
    lo, hi = _weights(fmt, w, o, 3)
    a3 = vfma(dd, vcvt(_lane(fmt, lo, A, t, b, 3)), a3)
    a7 = vfma(dd, vcvt(_lane(fmt, hi, A, t, b, 7)), a7)
    if fmt in (Q4_1, Q5_1):
        # summs += m * s: one rounding per product and one per sum (as compiled by gcc)
        sm = sm + vload_f16(w, o + 32) * vsplat_f32(A[2][t, b])
    return (a0, a1, a2, a3, a4, a5, a6, a7, sm)


@njit(cache=True, inline="always")
def _step2(fmt, w, o, A, t, b, a, c):
    """Two tokens ``t``, ``t+1``: weights decoded once per chunk."""
    da = _scale(fmt, w, o, A, t, b)
    dc = _scale(fmt, w, o, A, t + 1, b)
    a0, a1, a2, a3, a4, a5, a6, a7, sa = a
    c0, c1, c2, c3, c4, c5, c6, c7, sc = c
    lo, hi = _weights(fmt, w, o, 0)
    a0 = vfma(da, vcvt(_lane(fmt, lo, A, t, b, 0)), a0)
    a4 = vfma(da, vcvt(_lane(fmt, hi, A, t, b, 4)), a4)
    c0 = vfma(dc, vcvt(_lane(fmt, lo, A, t + 1, b, 0)), c0)
    c4 = vfma(dc, vcvt(_lane(fmt, hi, A, t + 1, b, 4)), c4)
    lo, hi = _weights(fmt, w, o, 1)
    a1 = vfma(da, vcvt(_lane(fmt, lo, A, t, b, 1)), a1)
    a5 = vfma(da, vcvt(_lane(fmt, hi, A, t, b, 5)), a5)
    c1 = vfma(dc, vcvt(_lane(fmt, lo, A, t + 1, b, 1)), c1)
    c5 = vfma(dc, vcvt(_lane(fmt, hi, A, t + 1, b, 5)), c5)
    lo, hi = _weights(fmt, w, o, 2)
    a2 = vfma(da, vcvt(_lane(fmt, lo, A, t, b, 2)), a2)
    a6 = vfma(da, vcvt(_lane(fmt, hi, A, t, b, 6)), a6)
    c2 = vfma(dc, vcvt(_lane(fmt, lo, A, t + 1, b, 2)), c2)
    c6 = vfma(dc, vcvt(_lane(fmt, hi, A, t + 1, b, 6)), c6)
    lo, hi = _weights(fmt, w, o, 3)
    a3 = vfma(da, vcvt(_lane(fmt, lo, A, t, b, 3)), a3)
    a7 = vfma(da, vcvt(_lane(fmt, hi, A, t, b, 7)), a7)
    c3 = vfma(dc, vcvt(_lane(fmt, lo, A, t + 1, b, 3)), c3)
    c7 = vfma(dc, vcvt(_lane(fmt, hi, A, t + 1, b, 7)), c7)
    if fmt in (Q4_1, Q5_1):
        m = vload_f16(w, o + 32)
        sa = sa + m * vsplat_f32(A[2][t, b])
        sc = sc + m * vsplat_f32(A[2][t + 1, b])
    return (a0, a1, a2, a3, a4, a5, a6, a7, sa), (c0, c1, c2, c3, c4, c5, c6, c7, sc)


# ----------------------------------------------------------------------------- Q8_0
@njit(cache=True, inline="always")
def _q8_step(w, o, A, t, b, a):
    dd = _scale(Q8_0, w, o, A, t, b)
    a0, a1, a2, a3, a4, a5, a6, a7, sm = a
    a0 = vfma(dd, vcvt(_lane(Q8_0, vload_i32(w, o + 32), A, t, b, 0)), a0)
    a1 = vfma(dd, vcvt(_lane(Q8_0, vload_i32(w, o + 96), A, t, b, 1)), a1)
    a2 = vfma(dd, vcvt(_lane(Q8_0, vload_i32(w, o + 160), A, t, b, 2)), a2)
    a3 = vfma(dd, vcvt(_lane(Q8_0, vload_i32(w, o + 224), A, t, b, 3)), a3)
    a4 = vfma(dd, vcvt(_lane(Q8_0, vload_i32(w, o + 288), A, t, b, 4)), a4)
    a5 = vfma(dd, vcvt(_lane(Q8_0, vload_i32(w, o + 352), A, t, b, 5)), a5)
    a6 = vfma(dd, vcvt(_lane(Q8_0, vload_i32(w, o + 416), A, t, b, 6)), a6)
    a7 = vfma(dd, vcvt(_lane(Q8_0, vload_i32(w, o + 480), A, t, b, 7)), a7)
    return (a0, a1, a2, a3, a4, a5, a6, a7, sm)


# ----------------------------------------------------------------------------- entry points
@njit(cache=True, inline="always")
def q4_0_t1(w, o, A, t, b, nb, a):
    return _step(Q4_0, w, o, A, t, b, a)


@njit(cache=True, inline="always")
def q4_0_t2(w, o, A, t, b, nb, a, c):
    return _step2(Q4_0, w, o, A, t, b, a, c)


@njit(cache=True, inline="always")
def q4_1_t1(w, o, A, t, b, nb, a):
    return _step(Q4_1, w, o, A, t, b, a)


@njit(cache=True, inline="always")
def q4_1_t2(w, o, A, t, b, nb, a, c):
    return _step2(Q4_1, w, o, A, t, b, a, c)


@njit(cache=True, inline="always")
def q5_0_t1(w, o, A, t, b, nb, a):
    return _step(Q5_0, w, o, A, t, b, a)


@njit(cache=True, inline="always")
def q5_0_t2(w, o, A, t, b, nb, a, c):
    return _step2(Q5_0, w, o, A, t, b, a, c)


@njit(cache=True, inline="always")
def q5_1_t1(w, o, A, t, b, nb, a):
    return _step(Q5_1, w, o, A, t, b, a)


@njit(cache=True, inline="always")
def q5_1_t2(w, o, A, t, b, nb, a, c):
    return _step2(Q5_1, w, o, A, t, b, a, c)


@njit(cache=True, inline="always")
def q8_0_t1(w, o, A, t, b, nb, a):
    return _q8_step(w, o, A, t, b, a)


@njit(cache=True, inline="always")
def q8_0_t2(w, o, A, t, b, nb, a, c):
    return _q8_step(w, o, A, t, b, a), _q8_step(w, o, A, t + 1, b, c)


@njit(cache=True, inline="always")
def pair_t1(fmt, w, o, A, t, b, nb, a):
    """IQ4_NL, MXFP4: ggml alternates two lane sets (even blocks: slots 0..7, odd: 8..15);
    with an odd block count the last block is summed apart, ``d * isum`` (slots 16, 17)."""
    if b == nb - 1 and nb % 2 == 1:
        dd = _scale(fmt, w, o, A, t, b)
        s = vsplat_i32(0)
        for c in range(4):
            lo, hi = _weights(fmt, w, o, c)
            s = s + _lane(fmt, lo, A, t, b, c) + _lane(fmt, hi, A, t, b, 4 + c)
        return (
            a[0],
            a[1],
            a[2],
            a[3],
            a[4],
            a[5],
            a[6],
            a[7],
            a[8],
            a[9],
            a[10],
            a[11],
            a[12],
            a[13],
            a[14],
            a[15],
            dd,
            vcvt(s),
        )
    if b % 2 == 0:
        e = _step(fmt, w, o, A, t, b, (a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[16]))
        return (
            e[0],
            e[1],
            e[2],
            e[3],
            e[4],
            e[5],
            e[6],
            e[7],
            a[8],
            a[9],
            a[10],
            a[11],
            a[12],
            a[13],
            a[14],
            a[15],
            a[16],
            a[17],
        )
    d = _step(fmt, w, o, A, t, b, (a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16]))
    return (
        a[0],
        a[1],
        a[2],
        a[3],
        a[4],
        a[5],
        a[6],
        a[7],
        d[0],
        d[1],
        d[2],
        d[3],
        d[4],
        d[5],
        d[6],
        d[7],
        a[16],
        a[17],
    )


@njit(cache=True, inline="always")
def iq4_nl_t1(w, o, A, t, b, nb, a):
    return pair_t1(IQ4_NL, w, o, A, t, b, nb, a)


@njit(cache=True, inline="always")
def iq4_nl_t2(w, o, A, t, b, nb, a, c):
    return iq4_nl_t1(w, o, A, t, b, nb, a), iq4_nl_t1(w, o, A, t + 1, b, nb, c)


@njit(cache=True, inline="always")
def mxfp4_t1(w, o, A, t, b, nb, a):
    return pair_t1(MXFP4, w, o, A, t, b, nb, a)


# MXFP4, several tokens per row group: a token's 16 accumulators (8 ggml lanes x even / odd
# blocks) do not fit in the registers twice, but each is a chain of its own, so they are
# computed in eight passes over the row, pass ``(c, p)`` adding chunk ``c`` (lanes ``c``, ``4+c``)
# of the blocks of parity ``p`` for all the tokens at once: each chunk is decoded once for them, and
# every lane gets exactly the operations, in the order, of :func:`mxfp4_t1`.
@njit(cache=True, inline="always")
def _mx_tok(lo, hi, A, t, b, c, e, x, y):
    """Token ``t``'s lanes ``c`` (``x``) and ``4+c`` (``y``) of block ``b`` (row exponents
    ``e``): ``d_x * 2**e`` is the product ``2**e * d_x`` of :func:`_scale`, one rounding."""
    dd = vldexp(vsplat_f32(A[1][t, b]), e)
    x = vfma(dd, vcvt(_lane(MXFP4, lo, A, t, b, c)), x)
    y = vfma(dd, vcvt(_lane(MXFP4, hi, A, t, b, 4 + c)), y)
    return x, y


@njit(cache=True, inline="always")
def _mx_pass4(w, og, bb, nb, A, t0, t1, t2, t3, c, p):
    """Lanes ``c``, ``4+c`` of four tokens over the blocks of parity ``p`` (even: those that
    start a pair; an odd count's last block is left out)."""
    z = vzero_f32()
    x0 = y0 = x1 = y1 = x2 = y2 = x3 = y3 = z
    for b in range(p, nb - 1 + p, 2):
        o = og + b * bb
        s = vcvt(vload_u8(w, o)) - vsplat_f32(np.float32(_E8M0_BIAS))
        lo, hi = _weights(MXFP4, w, o, c)
        x0, y0 = _mx_tok(lo, hi, A, t0, b, c, s, x0, y0)
        x1, y1 = _mx_tok(lo, hi, A, t1, b, c, s, x1, y1)
        x2, y2 = _mx_tok(lo, hi, A, t2, b, c, s, x2, y2)
        x3, y3 = _mx_tok(lo, hi, A, t3, b, c, s, x3, y3)
    return (x0, y0), (x1, y1), (x2, y2), (x3, y3)


@njit(cache=True, inline="always")
def _mx_pass2(w, og, bb, nb, A, t0, t1, c, p):
    """:func:`_mx_pass4` for two tokens."""
    z = vzero_f32()
    x0 = y0 = x1 = y1 = z
    for b in range(p, nb - 1 + p, 2):
        o = og + b * bb
        s = vcvt(vload_u8(w, o)) - vsplat_f32(np.float32(_E8M0_BIAS))
        lo, hi = _weights(MXFP4, w, o, c)
        x0, y0 = _mx_tok(lo, hi, A, t0, b, c, s, x0, y0)
        x1, y1 = _mx_tok(lo, hi, A, t1, b, c, s, x1, y1)
    return (x0, y0), (x1, y1)


@njit(cache=True, inline="always")
def _mx_fin(w, og, bb, nb, A, t, e0, e1, e2, e3, o0, o1, o2, o3):
    """One token's passes (``e*``: even blocks, ``o*``: odd, lanes ``c``, ``4+c`` of pass
    ``c``) as :func:`zero18`'s slots (an odd count's last block through :func:`pair_t1`),
    finished by :func:`fin18`."""
    z = vzero_f32()
    a = (
        e0[0], e1[0], e2[0], e3[0], e0[1], e1[1], e2[1], e3[1],
        o0[0], o1[0], o2[0], o3[0], o0[1], o1[1], o2[1], o3[1], z, z,
    )  # fmt: skip
    if nb % 2 == 1:
        a = pair_t1(MXFP4, w, og + (nb - 1) * bb, A, t, nb - 1, nb, a)
    return fin18(a)


@njit(cache=True, inline="always")
def mxfp4_rows4(w, og, nb, A, t0, t1, t2, t3):
    """Row group ``w[og:]`` (``nb`` blocks) . tokens ``t0..t3`` (any activation rows): four
    finished ``f32x16``, each equal to :func:`mxfp4_t1`'s over the row."""
    bb = _BB_MXFP4
    a0, b0, c0, d0 = _mx_pass4(w, og, bb, nb, A, t0, t1, t2, t3, 0, 0)
    a1, b1, c1, d1 = _mx_pass4(w, og, bb, nb, A, t0, t1, t2, t3, 1, 0)
    a2, b2, c2, d2 = _mx_pass4(w, og, bb, nb, A, t0, t1, t2, t3, 2, 0)
    a3, b3, c3, d3 = _mx_pass4(w, og, bb, nb, A, t0, t1, t2, t3, 3, 0)
    a4, b4, c4, d4 = _mx_pass4(w, og, bb, nb, A, t0, t1, t2, t3, 0, 1)
    a5, b5, c5, d5 = _mx_pass4(w, og, bb, nb, A, t0, t1, t2, t3, 1, 1)
    a6, b6, c6, d6 = _mx_pass4(w, og, bb, nb, A, t0, t1, t2, t3, 2, 1)
    a7, b7, c7, d7 = _mx_pass4(w, og, bb, nb, A, t0, t1, t2, t3, 3, 1)
    return (
        _mx_fin(w, og, bb, nb, A, t0, a0, a1, a2, a3, a4, a5, a6, a7),
        _mx_fin(w, og, bb, nb, A, t1, b0, b1, b2, b3, b4, b5, b6, b7),
        _mx_fin(w, og, bb, nb, A, t2, c0, c1, c2, c3, c4, c5, c6, c7),
        _mx_fin(w, og, bb, nb, A, t3, d0, d1, d2, d3, d4, d5, d6, d7),
    )


@njit(cache=True, inline="always")
def mxfp4_rows2(w, og, nb, A, t0, t1):
    """:func:`mxfp4_rows4` for two tokens."""
    bb = _BB_MXFP4
    a0, b0 = _mx_pass2(w, og, bb, nb, A, t0, t1, 0, 0)
    a1, b1 = _mx_pass2(w, og, bb, nb, A, t0, t1, 1, 0)
    a2, b2 = _mx_pass2(w, og, bb, nb, A, t0, t1, 2, 0)
    a3, b3 = _mx_pass2(w, og, bb, nb, A, t0, t1, 3, 0)
    a4, b4 = _mx_pass2(w, og, bb, nb, A, t0, t1, 0, 1)
    a5, b5 = _mx_pass2(w, og, bb, nb, A, t0, t1, 1, 1)
    a6, b6 = _mx_pass2(w, og, bb, nb, A, t0, t1, 2, 1)
    a7, b7 = _mx_pass2(w, og, bb, nb, A, t0, t1, 3, 1)
    return (
        _mx_fin(w, og, bb, nb, A, t0, a0, a1, a2, a3, a4, a5, a6, a7),
        _mx_fin(w, og, bb, nb, A, t1, b0, b1, b2, b3, b4, b5, b6, b7),
    )


# ----------------------------------------------------------------------------- the formats
# Group block fields (see .formats): the f16 scale d of each row, the f16 min m (Q4_1, Q5_1),
# the high bits (Q5), the quants as 4-byte chunks (Q8_0 and IQ4_NL: +128, unsigned); MXFP4:
# the E8M0 byte of each row, then the nibbles as 4-byte chunks.
_QK = 32
LAYOUT_Q4_0 = Layout.of(GGMLType.Q4_0, _QK, ACT_Q8, (ROWS, 0, 2), (CHUNK4, 2, 16))
LAYOUT_Q4_1 = Layout.of(GGMLType.Q4_1, _QK, ACT_Q8, (ROWS, 0, 2), (ROWS, 2, 2), (CHUNK4, 4, 16))
LAYOUT_Q5_0 = Layout.of(GGMLType.Q5_0, _QK, ACT_Q8, (ROWS, 0, 2), (Q5HB, 2, 4), (CHUNK4, 6, 16))
LAYOUT_Q5_1 = Layout.of(
    GGMLType.Q5_1, _QK, ACT_Q8, (ROWS, 0, 2), (ROWS, 2, 2), (Q5HB, 4, 4), (CHUNK4, 8, 16)
)
LAYOUT_Q8_0 = Layout.of(GGMLType.Q8_0, _QK, ACT_Q8, (ROWS, 0, 2), (XOR80, 2, 32))
LAYOUT_IQ4_NL = Layout.of(GGMLType.IQ4_NL, _QK, ACT_Q8, (ROWS, 0, 2), (CHUNK4, 2, 16))
LAYOUT_MXFP4 = Layout.of(GGMLType.MXFP4, _QK, ACT_Q8, (ROWS, 0, 1), (CHUNK4, 1, 16))
_BB_Q4_0, _BB_Q4_1 = LAYOUT_Q4_0.dst_bytes, LAYOUT_Q4_1.dst_bytes
_BB_Q5_0, _BB_Q5_1 = LAYOUT_Q5_0.dst_bytes, LAYOUT_Q5_1.dst_bytes
_BB_Q8_0, _BB_IQ4_NL = LAYOUT_Q8_0.dst_bytes, LAYOUT_IQ4_NL.dst_bytes
_BB_MXFP4 = LAYOUT_MXFP4.dst_bytes


@njit(cache=True)
def mm_q4_0(w, desc, A, t0, t1, g0, g1, out, ot, add):
    nblk, k1, k2 = desc[3] // _QK, q4_0_t1, q4_0_t2
    drive_lanes(zero, fin, k1, k2, w, desc[1], nblk, _BB_Q4_0, g0, g1, A, t0, t1, out, ot, add)


@njit(cache=True)
def mm_q4_1(w, desc, A, t0, t1, g0, g1, out, ot, add):
    nblk, k1, k2 = desc[3] // _QK, q4_1_t1, q4_1_t2
    drive_lanes(zero, fin, k1, k2, w, desc[1], nblk, _BB_Q4_1, g0, g1, A, t0, t1, out, ot, add)


@njit(cache=True)
def mm_q5_0(w, desc, A, t0, t1, g0, g1, out, ot, add):
    nblk, k1, k2 = desc[3] // _QK, q5_0_t1, q5_0_t2
    drive_lanes(zero, fin, k1, k2, w, desc[1], nblk, _BB_Q5_0, g0, g1, A, t0, t1, out, ot, add)


@njit(cache=True)
def mm_q5_1(w, desc, A, t0, t1, g0, g1, out, ot, add):
    nblk, k1, k2 = desc[3] // _QK, q5_1_t1, q5_1_t2
    drive_lanes(zero, fin, k1, k2, w, desc[1], nblk, _BB_Q5_1, g0, g1, A, t0, t1, out, ot, add)


@njit(cache=True)
def mm_q8_0(w, desc, A, t0, t1, g0, g1, out, ot, add):
    nblk, k1, k2 = desc[3] // _QK, q8_0_t1, q8_0_t2
    drive_lanes(zero, fin, k1, k2, w, desc[1], nblk, _BB_Q8_0, g0, g1, A, t0, t1, out, ot, add)


@njit(cache=True)
def mm_iq4_nl(w, desc, A, t0, t1, g0, g1, out, ot, add):
    nblk, k1, k2, bb = desc[3] // _QK, iq4_nl_t1, iq4_nl_t2, _BB_IQ4_NL
    drive_lanes(zero18, fin18, k1, k2, w, desc[1], nblk, bb, g0, g1, A, t0, t1, out, ot, add)


@njit(cache=True)
def mm_mxfp4_rows(w, desc, A, rows, n, adiv, a0, g0, g1, out, o0, add):
    """``out[o0 + r] (+)= W . act(A[a0 + r // adiv])`` for the rows ``r`` of ``rows[:n]``
    (empty ``rows``: ``r = 0..n-1``), see :func:`.drive.drive_rows`."""
    nblk, k1, k2, k4, bb = desc[3] // _QK, mxfp4_t1, mxfp4_rows2, mxfp4_rows4, _BB_MXFP4
    drive_rows(zero18, fin18, k1, k2, k4, w, desc[1], nblk, bb, g0, g1, A, rows, n, adiv, a0,
               out, o0, add)  # fmt: skip


@njit(cache=True)
def mm_mxfp4(w, desc, A, t0, t1, g0, g1, out, ot, add):
    mm_mxfp4_rows(w, desc, A, desc[:0], t1 - t0, 1, t0, g0, g1, out, ot, add)


# --- row decoders: row ``r`` of the group block at ``w[o:]`` -> ``out[y0:y0+32]``
@njit(cache=True, inline="always")
def chunk_byte(w, o, r, i):
    """Byte ``i`` of row ``r`` in a CHUNK4 field starting at ``w[o]``."""
    return np.int64(w[o + ((i // 4) * 16 + r) * 4 + i % 4])


@njit(cache=True, inline="always")
def f16_at(w, o, r):
    """Row ``r``'s f16 value of a ROWS field of 2 bytes at ``w[o]``."""
    return f16_to_f32(np.int64(w[o + 2 * r]) | (np.int64(w[o + 2 * r + 1]) << 8))


@njit(cache=True, inline="always")
def e8m0_at(w, o, r):
    """Row ``r``'s MXFP4 scale ``2**(e - 128)`` from a ROWS field of 1 byte at ``w[o]``."""
    return np.float32(math.ldexp(1.0, np.int64(w[o + r]) - _E8M0_BIAS))


@njit(cache=True, inline="always")
def row_mxfp4(w, o, r, out, y0):
    d = e8m0_at(w, o, r)
    for j in range(16):
        q = chunk_byte(w, o + 16, r, j)
        out[y0 + j] = np.float32(KVALUES_MXFP4[q & 0xF]) * d
        out[y0 + j + 16] = np.float32(KVALUES_MXFP4[q >> 4]) * d


@njit(cache=True, inline="always")
def _row_nibbles(fmt, w, o, r, out, y0):
    d = f16_at(w, o, r)
    qo = o + (64 if fmt == Q4_1 else 32)
    for j in range(16):
        q = chunk_byte(w, qo, r, j)
        lo, hi = q & 0xF, q >> 4
        if fmt == Q4_0:
            out[y0 + j] = np.float32(lo - 8) * d
            out[y0 + j + 16] = np.float32(hi - 8) * d
        elif fmt == IQ4_NL:
            out[y0 + j] = np.float32(KVALUES_IQ4NL[lo]) * d
            out[y0 + j + 16] = np.float32(KVALUES_IQ4NL[hi]) * d
        else:
            m = f16_at(w, o + 32, r)
            out[y0 + j] = np.float32(lo) * d + m
            out[y0 + j + 16] = np.float32(hi) * d + m


@njit(cache=True, inline="always")
def _row_q5(fmt, w, o, r, out, y0):
    d = f16_at(w, o, r)
    hbo = o + (32 if fmt == Q5_0 else 64)
    qo = o + (96 if fmt == Q5_0 else 128)
    for j in range(16):
        q = chunk_byte(w, qo, r, j)
        hb = np.int64(w[hbo + r * 4 + j % 4])
        c = j // 4
        lo = (q & 0xF) | (((hb >> (2 * c)) & 1) << 4)
        hi = (q >> 4) | (((hb >> (2 * c + 1)) & 1) << 4)
        if fmt == Q5_0:
            out[y0 + j] = np.float32(lo - 16) * d
            out[y0 + j + 16] = np.float32(hi - 16) * d
        else:
            m = f16_at(w, o + 32, r)
            out[y0 + j] = np.float32(lo) * d + m
            out[y0 + j + 16] = np.float32(hi) * d + m


@njit(cache=True, inline="always")
def row_q4_0(w, o, r, out, y0):
    _row_nibbles(Q4_0, w, o, r, out, y0)


@njit(cache=True, inline="always")
def row_q4_1(w, o, r, out, y0):
    _row_nibbles(Q4_1, w, o, r, out, y0)


@njit(cache=True, inline="always")
def row_iq4_nl(w, o, r, out, y0):
    _row_nibbles(IQ4_NL, w, o, r, out, y0)


@njit(cache=True, inline="always")
def row_q5_0(w, o, r, out, y0):
    _row_q5(Q5_0, w, o, r, out, y0)


@njit(cache=True, inline="always")
def row_q5_1(w, o, r, out, y0):
    _row_q5(Q5_1, w, o, r, out, y0)


@njit(cache=True, inline="always")
def row_q8_0(w, o, r, out, y0):
    d = f16_at(w, o, r)
    for j in range(32):
        q = chunk_byte(w, o + 32, r, j) ^ 0x80  # stored xored with 0x80 (unsigned)
        out[y0 + j] = np.float32(q - 256 if q >= 128 else q) * d


# --- numpy twins: fields of .formats.unpack_fields -> float32 [rows, blocks, 32]
def f16_np(b: np.ndarray) -> np.ndarray:
    """[..., 2] bytes -> float32 [...]."""
    return np.ascontiguousarray(b).view(np.float16)[..., 0].astype(np.float32)


def nibbles_np(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    q = q.astype(np.int64)
    return q & 0xF, q >> 4


def _q4_np(f: dict, key: str) -> tuple[np.ndarray, np.ndarray]:
    lo, hi = nibbles_np(f[key])
    return np.concatenate([lo, hi], axis=-1), f16_np(f["f0"])[..., None]


def _q5_np(f: dict, key: str) -> tuple[np.ndarray, np.ndarray]:
    q, d = _q4_np(f, key)
    return q | (f["hb"] << 4), d


def q4_0_numpy(f: dict) -> np.ndarray:
    q, d = _q4_np(f, "f2")
    return (q - 8).astype(np.float32) * d


def q4_1_numpy(f: dict) -> np.ndarray:
    q, d = _q4_np(f, "f4")
    return q.astype(np.float32) * d + f16_np(f["f2"])[..., None]


def iq4_nl_numpy(f: dict) -> np.ndarray:
    q, d = _q4_np(f, "f2")
    return KVALUES_IQ4NL[q].astype(np.float32) * d


def mxfp4_numpy(f: dict) -> np.ndarray:
    lo, hi = nibbles_np(f["f1"])
    d = np.ldexp(np.float32(1.0), f["f0"].astype(np.int32) - _E8M0_BIAS)
    with np.errstate(over="ignore"):  # 12 * 2**127 is inf in ggml too
        return KVALUES_MXFP4[np.concatenate([lo, hi], axis=-1)].astype(np.float32) * d


def q5_0_numpy(f: dict) -> np.ndarray:
    q, d = _q5_np(f, "f6")
    return (q - 16).astype(np.float32) * d


def q5_1_numpy(f: dict) -> np.ndarray:
    q, d = _q5_np(f, "f8")
    return q.astype(np.float32) * d + f16_np(f["f2"])[..., None]


def q8_0_numpy(f: dict) -> np.ndarray:
    return f["f2"].view(np.int8).astype(np.float32) * f16_np(f["f0"])[..., None]


register(FormatTraits(LAYOUT_Q4_0, mm_q4_0, row_q4_0, q4_0_numpy))
register(FormatTraits(LAYOUT_Q4_1, mm_q4_1, row_q4_1, q4_1_numpy, block_min="f2"))
register(FormatTraits(LAYOUT_Q5_0, mm_q5_0, row_q5_0, q5_0_numpy))
register(FormatTraits(LAYOUT_Q5_1, mm_q5_1, row_q5_1, q5_1_numpy, block_min="f2"))
register(FormatTraits(LAYOUT_Q8_0, mm_q8_0, row_q8_0, q8_0_numpy))
register(FormatTraits(LAYOUT_IQ4_NL, mm_iq4_nl, row_iq4_nl, iq4_nl_numpy))
register(FormatTraits(LAYOUT_MXFP4, mm_mxfp4, row_mxfp4, mxfp4_numpy, matmul_rows=mm_mxfp4_rows))
