"""KV-cache rows in the block formats llama.cpp allows for the cache besides f32, f16 and
q8_0 (those three are in :mod:`.attention`): ``q4_0``, ``q4_1``, ``q5_0``, ``q5_1``,
``iq4_nl`` and ``bf16``.

A row is one cell's head vector in the format's blocks of 32 (bf16: 2 bytes a value).

* :func:`store` converts as the format's ``from_float`` does when ggml writes the cache
  (``quantize_row_*_ref``; bf16 rounds to nearest even), so the bytes equal
  :mod:`llamacpy.quants`' rows.
* :func:`load` dequantizes as its ``to_float``: V rows are read this way and accumulated in
  float32, as ggml's flash attention does for a V cache that is not f16.
* :func:`dot` is K.q with the query converted to the format's dot type (ggml's
  ``vec_dot_type``): q8_0 for q4_0 / q5_0 / iq4_nl, q8_1 for q4_1 / q5_1 (a block's
  ``d * sum(q)`` kept for the min term), bf16 for bf16. The blocks are summed in order
  (ggml's SIMD kernels sum in lanes: the result differs in the last bits).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from numba import njit

from .._lazy import lazy_module
from ..gguf.constants import GGML_BLOCK_SIZES, GGMLType
from ..simd import (
    bits_to_f32,
    f32_to_bits,
    fmaf,
    load_f16,
    round_f16,
    store_f16,
    vload_bf16,
    vload_f32,
    vstore_bf16,
    vstore_f32,
)

if TYPE_CHECKING:  # (the kernel cache's stamp reads this line: a dependency of the kernels)
    from ..quants import iq4_nl
else:  # iq4_nl's block search: imported when a kernel using it compiles
    iq4_nl = lazy_module("llamacpy.quants.iq4_nl")

KV_Q4_0, KV_Q4_1, KV_Q5_0, KV_Q5_1, KV_IQ4_NL, KV_BF16 = (
    int(t)
    for t in (
        GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.IQ4_NL,
        GGMLType.BF16,
    )
)  # fmt: skip
TYPES = {
    "q4_0": KV_Q4_0,
    "q4_1": KV_Q4_1,
    "q5_0": KV_Q5_0,
    "q5_1": KV_Q5_1,
    "iq4_nl": KV_IQ4_NL,
    "bf16": KV_BF16,
}
QK = 32
_B = {t: GGML_BLOCK_SIZES[GGMLType(t)][1] for t in TYPES.values()}
B_Q4_0, B_Q4_1, B_Q5_0, B_Q5_1, B_IQ4_NL = (
    _B[KV_Q4_0], _B[KV_Q4_1], _B[KV_Q5_0], _B[KV_Q5_1], _B[KV_IQ4_NL],
)  # fmt: skip
_F32 = np.float32
_IQ4NL = np.array(
    [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32
)


def row_bytes(t: int, hd: int) -> int:
    """Bytes of one cache row of ``hd`` values."""
    return 2 * hd if t == KV_BF16 else hd // QK * _B[t]


@njit(cache=True, inline="always")
def _block_bytes(t):
    """Bytes of one block of 32 values of block format ``t``."""
    if t == KV_Q4_0:
        return B_Q4_0
    if t == KV_Q4_1:
        return B_Q4_1
    if t == KV_Q5_0:
        return B_Q5_0
    return B_Q5_1 if t == KV_Q5_1 else B_IQ4_NL


@njit(cache=True, inline="always")
def _q8_1(t):
    """The format's query type is q8_1 (a block min to multiply by ``d * sum(q)``)."""
    return t in (KV_Q4_1, KV_Q5_1)


# ----------------------------------------------------------------------------- bf16
@njit(cache=True, inline="always")
def _round_bf16(x):
    """``x`` rounded to bfloat16 as ggml's ``fp32_to_bf16`` (nearest even; NaN quiet)."""
    u = f32_to_bits(x)
    if (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
        return bits_to_f32(((u >> np.uint32(16)) | np.uint32(64)) << np.uint32(16))
    r = (u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)
    return bits_to_f32(r << np.uint32(16))


@njit(cache=True, inline="always")
def _bf16_at(c, o):
    return bits_to_f32((np.uint32(c[o]) | np.uint32(c[o + 1]) << np.uint32(8)) << np.uint32(16))


# ----------------------------------------------------------------------------- store
@njit(cache=True, inline="always")
def _absmax_signed(x, o):
    """The value of largest magnitude (the first one on ties), as ggml's reference keeps."""
    amax = _F32(0.0)
    vmax = _F32(0.0)
    for j in range(QK):
        v = x[o + j]
        if amax < abs(v):
            amax = abs(v)
            vmax = v
    return vmax


@njit(cache=True, inline="always")
def _minmax(x, o):
    lo = _F32(np.finfo(np.float32).max)
    hi = -lo
    for j in range(QK):
        v = x[o + j]
        if v < lo:
            lo = v
        if v > hi:
            hi = v
    return lo, hi


@njit(cache=True, inline="always")
def _i8(v):
    """C's ``(int8_t)`` of a float (truncation; the values here are in range)."""
    return np.int64(v)


@njit(cache=True)
def _store_block(x, o, t, cache, co):
    """Block ``x[o:o+32]`` at byte ``co`` (``quantize_row_*_ref``)."""
    if t in (KV_Q4_0, KV_Q5_0):
        five = t == KV_Q5_0
        d = _absmax_signed(x, o) / _F32(-16.0 if five else -8.0)
        inv = _F32(1.0) / d if d != 0 else _F32(0.0)
        store_f16(cache, co, d)
        bias, top, qs = _F32(16.5 if five else 8.5), 31 if five else 15, co + (6 if five else 2)
        qh = np.uint32(0)
        for j in range(QK // 2):
            a = min(top, _i8(x[o + j] * inv + bias))
            b = min(top, _i8(x[o + 16 + j] * inv + bias))
            cache[qs + j] = np.uint8((a & 15) | ((b & 15) << 4))
            qh |= np.uint32((a >> 4) & 1) << np.uint32(j)
            qh |= np.uint32((b >> 4) & 1) << np.uint32(j + 16)
        if five:
            for k in range(4):
                cache[co + 2 + k] = np.uint8((qh >> np.uint32(8 * k)) & np.uint32(255))
    elif t in (KV_Q4_1, KV_Q5_1):
        five = t == KV_Q5_1
        lo, hi = _minmax(x, o)
        d = (hi - lo) / _F32(31.0 if five else 15.0)
        inv = _F32(1.0) / d if d != 0 else _F32(0.0)
        store_f16(cache, co, d)
        store_f16(cache, co + 2, lo)
        qs = co + (8 if five else 4)
        qh = np.uint32(0)
        for j in range(QK // 2):
            a = _i8((x[o + j] - lo) * inv + _F32(0.5))
            b = _i8((x[o + 16 + j] - lo) * inv + _F32(0.5))
            if not five:
                a, b = min(15, a), min(15, b)
            cache[qs + j] = np.uint8((a & 15) | ((b & 15) << 4))
            qh |= np.uint32((a >> 4) & 1) << np.uint32(j)
            qh |= np.uint32((b >> 4) & 1) << np.uint32(j + 16)
        if five:
            for k in range(4):
                cache[co + 4 + k] = np.uint8((qh >> np.uint32(8 * k)) & np.uint32(255))


@njit(cache=True)
def store(x, xo, hd, t, cache, co):
    """Write ``x[xo:xo+hd]`` (f32) as one cache row of format ``t`` at byte ``co``."""
    if t == KV_BF16:
        for i in range(0, hd, 16):
            vstore_bf16(cache, co + 2 * i, vload_f32(x, xo + i))
    elif t == KV_IQ4_NL:
        iq4_nl._quantize_row_ref_kernel(x[xo : xo + hd], cache[co : co + hd // QK * B_IQ4_NL])
    else:
        bb = _block_bytes(t)
        for b in range(hd // QK):
            _store_block(x, xo + QK * b, t, cache, co + bb * b)


# ----------------------------------------------------------------------------- load
@njit(cache=True, inline="always")
def _block_ints(cache, o, t, q):
    """Block at byte ``o``: its integer values into ``q[:32]``; returns ``(d, m)`` with the
    values ``d * q + m``."""
    m = _F32(0.0)
    if t in (KV_Q4_0, KV_IQ4_NL):
        qs, hb, off = o + 2, -1, 8
    elif t == KV_Q4_1:
        qs, hb, off = o + 4, -1, 0
        m = load_f16(cache, o + 2)
    elif t == KV_Q5_0:
        qs, hb, off = o + 6, o + 2, 16
    else:
        qs, hb, off = o + 8, o + 4, 0
        m = load_f16(cache, o + 2)
    qh = np.uint32(0)
    if hb >= 0:
        for k in range(4):
            qh |= np.uint32(cache[hb + k]) << np.uint32(8 * k)
    for j in range(QK // 2):
        c = np.int64(cache[qs + j])
        a, b = c & 15, c >> 4
        if hb >= 0:
            a |= np.int64((qh >> np.uint32(j)) & np.uint32(1)) << 4
            b |= np.int64((qh >> np.uint32(j + 16)) & np.uint32(1)) << 4
        if t == KV_IQ4_NL:
            q[j], q[j + 16] = _IQ4NL[a], _IQ4NL[b]
        else:
            q[j], q[j + 16] = a - off, b - off
    return load_f16(cache, o), m


@njit(cache=True)
def load(cache, co, hd, t, out):
    """Dequantize one cache row of format ``t`` into ``out[:hd]`` (f32)."""
    if t == KV_BF16:
        for i in range(0, hd, 16):
            vstore_f32(out, i, vload_bf16(cache, co + 2 * i))
        return
    bb = _block_bytes(t)
    for b in range(hd // QK):
        q = out[QK * b : QK * b + QK]
        d, m = _block_ints(cache, co + bb * b, t, q)
        for j in range(QK):
            q[j] = q[j] * d + m


# ----------------------------------------------------------------------------- K.q
@njit(cache=True)
def prepare_query(q, qo, hd, t, qv, qq):
    """Query row ``q[qo:qo+hd]`` in the dot type of format ``t``: bf16 values in ``qv``;
    else q8 blocks (``qq`` int8 values, ``qv[b]`` the f16 scale, ``qv[hd//32 + b]`` the
    f16 ``d * sum`` of q8_1)."""
    if t == KV_BF16:
        for i in range(hd):
            qv[i] = _round_bf16(q[qo + i])
        return
    nb = hd // QK
    for b in range(nb):
        amax = _F32(0.0)
        for j in range(QK):
            amax = max(amax, abs(q[qo + QK * b + j]))
        d = amax / _F32(127.0)
        inv = _F32(127.0) / amax if amax != 0 else _F32(0.0)
        s = 0
        for j in range(QK):
            v = np.int32(np.rint(q[qo + QK * b + j] * inv))
            qq[QK * b + j] = v
            s += v
        qv[b] = round_f16(d)
        qv[nb + b] = round_f16(d * _F32(s))


@njit(cache=True, inline="always")
def _lanes(kq, qq, qo, acc, d):
    """ggml's AVX2 block step: the 32 int8 products summed in 8 lanes of 4 (exact ints,
    as float), ``acc[lane] = fma(d, lane, acc[lane])``."""
    for ln in range(8):
        s = _F32(0.0)
        for i in range(4 * ln, 4 * ln + 4):
            s += kq[i] * _F32(qq[qo + i])
        acc[ln] = fmaf(d, s, acc[ln])


@njit(cache=True, inline="always")
def _hsum8(a):
    """ggml's ``hsum_float_8``."""
    r0, r1, r2, r3 = a[4] + a[0], a[5] + a[1], a[6] + a[2], a[7] + a[3]
    return (r0 + r2) + (r1 + r3)


@njit(cache=True, inline="always")
def _reduce16(c, o):
    """GCC's ``_mm512_reduce_add_ps`` of ``c[o:o+16]``: halves added down to one lane."""
    t0, t1, t2, t3 = (
        c[o + 8] + c[o],
        c[o + 9] + c[o + 1],
        c[o + 10] + c[o + 2],
        c[o + 11] + c[o + 3],
    )
    t4, t5, t6, t7 = (
        c[o + 12] + c[o + 4],
        c[o + 13] + c[o + 5],
        c[o + 14] + c[o + 6],
        c[o + 15] + c[o + 7],
    )
    u0, u1, u2, u3 = t4 + t0, t5 + t1, t6 + t2, t7 + t3
    return (u0 + u2) + (u1 + u3)


@njit(cache=True, inline="always")
def _dot_bf16(qv, kc, ko, hd, c):
    """ggml's ``vec_dot_bf16`` with AVX512-BF16: 64 values a step in two 16-lane
    accumulators (``dpbf16``: the odd pair element, then the even one, each an fma), each
    reduced, then summed in double with the values left over."""
    for j in range(32):
        c[j] = 0
    n64 = hd - hd % 64
    for i in range(0, n64, 64):
        for h in range(2):
            for j in range(16):
                e = i + 32 * h + 2 * j
                a = c[16 * h + j]
                a = fmaf(_bf16_at(kc, ko + 2 * e + 2), qv[e + 1], a)
                c[16 * h + j] = fmaf(_bf16_at(kc, ko + 2 * e), qv[e], a)
    acc = np.float64(_reduce16(c, 0))
    acc += np.float64(_reduce16(c, 16))
    for i in range(n64, hd):
        acc += np.float64(_bf16_at(kc, ko + 2 * i) * qv[i])
    return _F32(acc)


@njit(cache=True)
def dot(qv, qq, kc, ko, hd, t, kq):
    """K.q for the cache row at byte ``ko`` of format ``t`` and a query prepared by
    :func:`prepare_query`, in the order of ggml's x86 ``vec_dot`` of the format (``kq``: 48
    floats of scratch)."""
    if t == KV_BF16:
        return _dot_bf16(qv, kc, ko, hd, kq)
    nb = hd // QK
    bb = _block_bytes(t)
    a1, a2 = kq[32:40], kq[40:48]
    a1[:] = 0
    a2[:] = 0
    summs = _F32(0.0)
    last_d, last_sum = _F32(0.0), _F32(0.0)
    pairs = nb - nb % 2 if t == KV_IQ4_NL else 0  # iq4_nl: two blocks a step
    for b in range(nb):
        d, m = _block_ints(kc, ko + bb * b, t, kq)
        if b < pairs:
            _lanes(kq, qq, QK * b, a1 if b % 2 == 0 else a2, d * qv[b])
        elif t == KV_IQ4_NL:  # an odd block left: ggml's scalar loop, after the lanes
            isum = np.int64(0)
            for j in range(QK):
                isum += np.int64(kq[j]) * np.int64(qq[QK * b + j])
            last_d, last_sum = d * qv[b], _F32(isum)
        else:
            _lanes(kq, qq, QK * b, a1, d * qv[b])
            if _q8_1(t):
                summs = fmaf(m, qv[nb + b], summs)
    if pairs:
        for ln in range(8):
            a1[ln] += a2[ln]
    return fmaf(last_d, last_sum, _hsum8(a1)) + summs
