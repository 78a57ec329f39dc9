"""Block kernels of Q1_0, Q2_0 and NVFP4 x q8_0, with the float order of the ggml kernel
llama.cpp runs for each on x86, so results are bit-identical to llama.cpp's.

* Q1_0 (128 weights: f16 ``d``, one sign bit each), ggml's AVX2 ``vec_dot``: per weight block
  and for each of its four q8_0 activation blocks ``K``, 8 int32 lanes (lane ``j``: the signed
  activation bytes ``4j..4j+3`` of the block, summed), ``blk_j = d_x0 * lane`` then
  ``blk_j = fma(d_xK, lane, blk_j)``, and ``acc_j = fma(d_w, blk_j, acc_j)``; result
  ``hsum_float_8``. A lane is ``2 * (bits . x) - (x sum)``, one ``vpdpbusd`` started at the
  negated activation sum of 4 (``xb``) over the bits doubled.
* Q2_0 (64 weights: f16 ``d``, 2-bit codes ``q``, value ``(q - 1) d``): ggml has no x86
  kernel, its generic ``vec_dot`` runs: per weight block ``sumi = 0.0f``, for its two q8_0
  blocks ``sumi += d_x * (float) isum`` (product and sum rounded apart, as compiled), then
  ``sumf += sumi * d_w``; ``isum`` exact (``q . x`` less the block's activation sum).
* NVFP4 (64 weights in four sub-blocks of 16, UE4M3 scales, E2M1 codes), ggml's AVX2
  ``vec_dot``: per block two steps over 32 weights, 8 int32 lanes each (lane ``j``: elements
  ``4j..4j+3``), ``acc_j = fma(s, lane, acc_j)`` with ``s`` the product of the sub-block's
  scale and ``d_x`` (exact), lanes 0..3 the first sub-block of the 32, lanes 4..7 the second;
  result ``hsum_float_8``. Codes are looked up as MXFP4's values + 128 (unsigned, for
  ``vpdpbusd``), the offset taken back with ``-128 xb`` as the dot product's start.

Q1_0's bits and Q2_0's codes are repacked as ``PLANES`` (see :mod:`.formats`): shifting a
32-bit word by ``elem * p`` and masking gives codes ``4p..4p+3`` one per byte. ``A`` is the
activation tuple of :mod:`.quantize_act` (``xq``, ``xd``, ``xs``, ``xb``, ...).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..gguf.constants import GGMLType
from ..quants.nvfp4 import UE4M3_HALF
from ..simd import (
    load_u32,
    vabs,
    vand_k,
    vbcast4,
    vcvt,
    vdpbusd,
    vfma,
    vload_f16,
    vload_f32,
    vload_i32,
    vload_u8,
    vperm_f32,
    vselect_gt,
    vshuffle_bytes,
    vsll,
    vsplat_f32,
    vsplat_i32,
    vsrl,
    vzero_f32,
)
from .drive import drive, drive_lanes
from .qdot_legacy import KVALUES_MXFP4, MXFP4_TABLE, _nib, chunk_byte, f16_at, f16_np, fin, zero
from .traits import ACT_Q8, CHUNK4, PLANES, ROWS, FormatTraits, Layout, T, register

_F32 = np.float32
_QK1, _QK2, _QKF = 128, 64, 64  # weights per block: Q1_0, Q2_0, NVFP4
_P = 32  # group block offset of the code words (after 16 f16 scales)
_TWOS = 0x02020202
_THREES = 0x03030303


# ----------------------------------------------------------------------------- Q1_0
@njit(cache=True, inline="always")
def _q1_lane(word, A, t, k, j):
    """Lane ``j`` of activation block ``k`` (int32 x 16 rows): signs times ``x`` over
    elements ``4j..4j+3``, as ``2 (bits . x) - xb``."""
    b2 = vand_k(vsll(word, 1), _TWOS) if j == 0 else vand_k(vsrl(word, j - 1), _TWOS)
    x = vbcast4(A[0], t * A[0].shape[1] + 32 * k + 4 * j)
    return vcvt(vdpbusd(vsplat_i32(-A[3][t, 8 * k + j]), b2, x))


@njit(cache=True, inline="always")
def _q1_lanes(w, o, A, t, b, K):
    word = vload_i32(w, o + _P + 64 * K)
    k = 4 * b + K
    return (
        _q1_lane(word, A, t, k, 0), _q1_lane(word, A, t, k, 1), _q1_lane(word, A, t, k, 2),
        _q1_lane(word, A, t, k, 3), _q1_lane(word, A, t, k, 4), _q1_lane(word, A, t, k, 5),
        _q1_lane(word, A, t, k, 6), _q1_lane(word, A, t, k, 7),
    )  # fmt: skip


@njit(cache=True)
def q1_0_t1(w, o, A, t, b, nb, a):
    """Add weight block ``w[o:]`` (16 rows x 128) times token ``t``'s blocks ``4b..4b+3``."""
    c = _q1_lanes(w, o, A, t, b, 0)
    dy = vsplat_f32(A[1][t, 4 * b])
    k0, k1, k2, k3 = dy * c[0], dy * c[1], dy * c[2], dy * c[3]
    k4, k5, k6, k7 = dy * c[4], dy * c[5], dy * c[6], dy * c[7]
    for K in range(1, 4):
        c = _q1_lanes(w, o, A, t, b, K)
        dy = vsplat_f32(A[1][t, 4 * b + K])
        k0, k1, k2, k3 = (vfma(dy, c[0], k0), vfma(dy, c[1], k1), vfma(dy, c[2], k2),
                          vfma(dy, c[3], k3))  # fmt: skip
        k4, k5, k6, k7 = (vfma(dy, c[4], k4), vfma(dy, c[5], k5), vfma(dy, c[6], k6),
                          vfma(dy, c[7], k7))  # fmt: skip
    d = vload_f16(w, o)
    return (
        vfma(d, k0, a[0]), vfma(d, k1, a[1]), vfma(d, k2, a[2]), vfma(d, k3, a[3]),
        vfma(d, k4, a[4]), vfma(d, k5, a[5]), vfma(d, k6, a[6]), vfma(d, k7, a[7]), a[8],
    )  # fmt: skip


@njit(cache=True, inline="always")
def q1_0_t2(w, o, A, t, b, nb, a, c):
    return q1_0_t1(w, o, A, t, b, nb, a), q1_0_t1(w, o, A, t + 1, b, nb, c)


# ----------------------------------------------------------------------------- Q2_0
@njit(cache=True, inline="always")
def _q2_isum(w, o, A, t, b, h):
    """The exact ``sum (q - 1) x`` of 16 rows over q8_0 block ``2b + h`` (32 weights)."""
    k = 2 * b + h
    xs = 0
    for j in range(8):
        xs += A[3][t, 8 * k + j]
    s = vsplat_i32(-xs)
    xi = t * A[0].shape[1] + 32 * k
    for c in range(2):
        word = vload_i32(w, o + _P + 64 * (2 * h + c))
        for p in range(4):
            q = vand_k(vsrl(word, 2 * p), _THREES)
            s = vdpbusd(s, q, vbcast4(A[0], xi + 16 * c + 4 * p))
    return vcvt(s)


@njit(cache=True)
def q2_0_t1(w, o, A, t, b, acc):
    """``sumf += ((0 + d_x0 * i0) + d_x1 * i1) * d_w`` for weight block ``w[o:]``."""
    sumi = vzero_f32() + vsplat_f32(A[1][t, 2 * b]) * _q2_isum(w, o, A, t, b, 0)
    sumi = sumi + vsplat_f32(A[1][t, 2 * b + 1]) * _q2_isum(w, o, A, t, b, 1)
    return acc + sumi * vload_f16(w, o)


@njit(cache=True, inline="always")
def q2_0_t4(w, o, A, t, b, a0, a1, a2, a3):
    return (
        q2_0_t1(w, o, A, t, b, a0),
        q2_0_t1(w, o, A, t + 1, b, a1),
        q2_0_t1(w, o, A, t + 2, b, a2),
        q2_0_t1(w, o, A, t + 3, b, a3),
    )


# ----------------------------------------------------------------------------- NVFP4
# UE4M3 / 2 = tb[e] * m + ta[e] (e: 4 exponent bits, m: 3 mantissa bits; exact)
_UE_TA = np.array([0.0] + [8.0 * 2.0 ** (e - 11) for e in range(1, 16)], np.float32)
_UE_TB = np.array([2.0**-10] + [2.0 ** (e - 11) for e in range(1, 16)], np.float32)


@njit(cache=True, inline="always")
def _ue4m3(w, o):
    """``ggml_ue4m3_to_fp32`` of the scale bytes of 16 rows at ``w[o:]`` (0x7F: zero; the top
    bit ignored)."""
    x = vload_u8(w, o)
    e = vand_k(vsrl(x, 3), 15)
    tb, ta = vperm_f32(vload_f32(_UE_TB, 0), e), vperm_f32(vload_f32(_UE_TA, 0), e)
    v = vfma(tb, vcvt(vand_k(x, 7)), ta)
    special = vabs(vcvt(x - vsplat_i32(0x7F)))
    return vselect_gt(special, vsplat_f32(_F32(0.5)), v, vzero_f32())


@njit(cache=True, inline="always")
def _nv_lane(q, A, t, i):
    """``q . x`` (q: values + 128, 16 rows) over activation elements ``4i..4i+3`` of token
    ``t``'s row, the offset taken back."""
    x = vbcast4(A[0], t * A[0].shape[1] + 4 * i)
    return vcvt(vdpbusd(vsplat_i32(-128 * A[3][t, i]), q, x))


@njit(cache=True, inline="always")
def _nv_codes(w, o, c):
    """The values (+128) of code word ``c`` (bytes 4c..4c+3 of the block): low, high nibbles."""
    table = vload_i32(MXFP4_TABLE, 0)
    lo, hi = _nib(vload_i32(w, o + 64 + 64 * c))
    return vshuffle_bytes(table, lo), vshuffle_bytes(table, hi)


@njit(cache=True)
def _nv_half(w, o, A, t, b, h, s0, s1, a):
    """One 32-weight step (``h``: which half of the block): lanes 0..3 scaled by ``s0``,
    4..7 by ``s1``. Code word ``c`` of sub-block ``s`` holds lanes ``4(s % 2) + c % 2`` (low
    nibbles) and ``+ 2`` (high)."""
    i = 16 * b + 8 * h  # the first lane's activation group of 4
    lo, hi = _nv_codes(w, o, 4 * h)
    a0, a2 = vfma(s0, _nv_lane(lo, A, t, i), a[0]), vfma(s0, _nv_lane(hi, A, t, i + 2), a[2])
    lo, hi = _nv_codes(w, o, 4 * h + 1)
    a1, a3 = vfma(s0, _nv_lane(lo, A, t, i + 1), a[1]), vfma(s0, _nv_lane(hi, A, t, i + 3), a[3])
    lo, hi = _nv_codes(w, o, 4 * h + 2)
    a4, a6 = vfma(s1, _nv_lane(lo, A, t, i + 4), a[4]), vfma(s1, _nv_lane(hi, A, t, i + 6), a[6])
    lo, hi = _nv_codes(w, o, 4 * h + 3)
    a5, a7 = vfma(s1, _nv_lane(lo, A, t, i + 5), a[5]), vfma(s1, _nv_lane(hi, A, t, i + 7), a[7])
    return (a0, a1, a2, a3, a4, a5, a6, a7, a[8])


@njit(cache=True, inline="always")
def nvfp4_t1(w, o, A, t, b, nb, a):
    dy0 = vsplat_f32(A[1][t, 2 * b])
    dy1 = vsplat_f32(A[1][t, 2 * b + 1])
    a = _nv_half(w, o, A, t, b, 0, _ue4m3(w, o) * dy0, _ue4m3(w, o + 16) * dy0, a)
    return _nv_half(w, o, A, t, b, 1, _ue4m3(w, o + 32) * dy1, _ue4m3(w, o + 48) * dy1, a)


@njit(cache=True, inline="always")
def nvfp4_t2(w, o, A, t, b, nb, a, c):
    return nvfp4_t1(w, o, A, t, b, nb, a), nvfp4_t1(w, o, A, t + 1, b, nb, c)


# ----------------------------------------------------------------------------- the formats
# Group block fields (see .formats): the f16 d of each row and the code words as PLANES
# (Q1_0, Q2_0); NVFP4: the four scale bytes as [sub-block][row], the codes as 4-byte chunks.
LAYOUT_Q1_0 = Layout.of(GGMLType.Q1_0, _QK1, ACT_Q8, (ROWS, 0, 2), (PLANES, 2, 16, 1))
LAYOUT_Q2_0 = Layout.of(GGMLType.Q2_0, _QK2, ACT_Q8, (ROWS, 0, 2), (PLANES, 2, 16, 2))
LAYOUT_NVFP4 = Layout.of(GGMLType.NVFP4, _QKF, ACT_Q8, (T, 0, 4, 1), (CHUNK4, 4, 32))
_BB_Q1_0, _BB_Q2_0, _BB_NVFP4 = LAYOUT_Q1_0.dst_bytes, LAYOUT_Q2_0.dst_bytes, LAYOUT_NVFP4.dst_bytes


@njit(cache=True)
def mm_q1_0(w, desc, A, t0, t1, g0, g1, out, ot, add):
    nblk, k1, k2 = desc[3] // _QK1, q1_0_t1, q1_0_t2
    drive_lanes(zero, fin, k1, k2, w, desc[1], nblk, _BB_Q1_0, g0, g1, A, t0, t1, out, ot, add)


@njit(cache=True)
def mm_q2_0(w, desc, A, t0, t1, g0, g1, out, ot, add):
    nblk = desc[3] // _QK2
    drive(q2_0_t1, q2_0_t4, w, desc[1], nblk, _BB_Q2_0, g0, g1, A, t0, t1, out, ot, add)


@njit(cache=True)
def mm_nvfp4(w, desc, A, t0, t1, g0, g1, out, ot, add):
    nblk, k1, k2 = desc[3] // _QKF, nvfp4_t1, nvfp4_t2
    drive_lanes(zero, fin, k1, k2, w, desc[1], nblk, _BB_NVFP4, g0, g1, A, t0, t1, out, ot, add)


# --- row decoders: row ``r`` of the group block at ``w[o:]`` -> ``out[y0:y0+qk]``
@njit(cache=True, inline="always")
def _plane_word(w, o, r, c):
    return np.int64(load_u32(w, o + _P + (c * 16 + r) * 4))


@njit(cache=True, inline="always")
def row_q1_0(w, o, r, out, y0):
    d = f16_at(w, o, r)
    for c in range(4):
        u = _plane_word(w, o, r, c)
        for g in range(32):
            bit = (u >> (8 * (g % 4) + g // 4)) & 1
            out[y0 + 32 * c + g] = d if bit else -d


@njit(cache=True, inline="always")
def row_q2_0(w, o, r, out, y0):
    d = f16_at(w, o, r)
    for c in range(4):
        u = _plane_word(w, o, r, c)
        for g in range(16):
            q = (u >> (8 * (g % 4) + 2 * (g // 4))) & 3
            out[y0 + 16 * c + g] = _F32(q - 1) * d


@njit(cache=True, inline="always")
def row_nvfp4(w, o, r, out, y0):
    for s in range(4):
        d = UE4M3_HALF[w[o + 16 * s + r]]
        for j in range(8):
            q = chunk_byte(w, o + 64, r, 8 * s + j)
            out[y0 + 16 * s + j] = _F32(KVALUES_MXFP4[q & 0xF]) * d
            out[y0 + 16 * s + 8 + j] = _F32(KVALUES_MXFP4[q >> 4]) * d


# --- numpy twins: fields of .formats.unpack_fields -> float32 [rows, blocks, qk]
def q1_0_numpy(f: dict) -> np.ndarray:
    bits = np.unpackbits(f["f2"], axis=-1, bitorder="little").astype(bool)
    d = f16_np(f["f0"])[..., None]
    return np.where(bits, d, -d)


def q2_0_numpy(f: dict) -> np.ndarray:
    q = (f["f2"][..., None] >> (2 * np.arange(4, dtype=np.uint8))) & 3
    q = q.reshape(*f["f2"].shape[:-1], _QK2).astype(np.float32) - _F32(1)
    with np.errstate(invalid="ignore"):  # 0 * inf is NaN in ggml too
        return q * f16_np(f["f0"])[..., None]


def nvfp4_numpy(f: dict) -> np.ndarray:
    qs = f["f4"].reshape(*f["f4"].shape[:-1], 4, 8)
    q = np.concatenate([qs & 0xF, qs >> 4], axis=-1)  # [..., 4, 16]
    v = KVALUES_MXFP4[q].astype(np.float32) * UE4M3_HALF[f["f0"]][..., None]
    return v.reshape(*f["f4"].shape[:-1], _QKF)


register(FormatTraits(LAYOUT_Q1_0, mm_q1_0, row_q1_0, q1_0_numpy))
register(FormatTraits(LAYOUT_Q2_0, mm_q2_0, row_q2_0, q2_0_numpy))
register(FormatTraits(LAYOUT_NVFP4, mm_nvfp4, row_nvfp4, nvfp4_numpy))
