"""Attention over the KV cache with ggml's flash-attention numerics (CPU backend).

Cache rows are one cell's head vector: ``kc[head_kv, cell, :]`` bytes in the cache type
(``KV_F16``, ``KV_F32``, ``KV_Q8_0``, or a format of :mod:`.kv_rows`: q4_0, q4_1, q5_0, q5_1,
iq4_nl, bf16). ``mask[t, cell]`` is 1 where token ``t`` may attend
``cell`` (same sequence, not in the future). Three regimes, as in ``ggml_compute_forward_
flash_attn_ext_f16``:

* ``attend_row`` (ubatches of fewer than 64 tokens, and decoding): one query row, cells in
  order, online softmax; with an f16 V cache the accumulator is kept in f16 (rounded after
  every update), the query is rounded to f16 (the K dot type) and K.Q is summed in ggml's
  lane order. ``ic0..ic1`` restricts the cells (the decode split of long caches into one
  chunk per thread, merged by :func:`merge_partials`).
* ``attend_tiled`` (ubatches of 64 tokens and more, f16/f32 cache): float32 throughout, cells
  in tiles of 64 with the softmax state updated per tile.

Attention logit soft-capping (gemma2): a score becomes ``softcap * tanh(s * scale /
softcap)``, the scale divided by the cap first (``scale /= softcap`` in float32) and the cap
applied before the mask, as ggml's ``flash_attn_ext`` with ``logit_softcap`` does in each
regime; a cap of 0 leaves the scores as they are.

An f32 cache is attended as llama.cpp attends it: its K and V are cast to f16 before flash
attention (``build_attn_mha``), so every f32 row is read rounded to f16 and the f16 numerics
apply (query rounded to f16, f16 V accumulator). The rows themselves stay f32 (the K-shift
and state files see full precision).

A quantized cache stores its heads rotated (llama.cpp's attention rotation): q and k by a
Walsh-Hadamard transform of :func:`k_rotation` elements, v by one of :func:`v_rotation`
elements and the attention output back by the same (the transform is its own inverse); the
scores and outputs are those of the unrotated vectors, the quantization error is spread
over each block. :func:`fwht` is ggml's ``fwht`` (its ``mul_mat`` with a Hadamard hint).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..simd import (
    fmaf,
    load_f16,
    load_f32,
    round_f16,
    store_f16,
    vfma,
    vhmax,
    vhsum,
    vload_f16,
    vload_f32,
    vround_f16,
    vsplat_f32,
    vstore_f16,
    vstore_f32,
    vzero_f32,
)
from . import kv_rows
from .activations import vexp_ggml
from .rope import rope_apply, rope_cache
from .threads import split

KV_F32, KV_F16, KV_Q8_0 = 0, 1, 8  # ggml type ids
TILE = 64
_F32 = np.float32
_NEG_INF = _F32(-np.inf)


def kv_row_bytes(kv_type: int, head_dim: int) -> int:
    if kv_type == KV_F32:
        return 4 * head_dim
    if kv_type == KV_F16:
        return 2 * head_dim
    if kv_type == KV_Q8_0:
        return head_dim // 32 * 34
    return kv_rows.row_bytes(kv_type, head_dim)


@njit(cache=True, inline="always")
def quantized(kv_type):
    """A cache type in blocks with scales (not f32, f16 or bf16): its heads are rotated."""
    return kv_type != KV_F32 and kv_type != KV_F16 and kv_type != kv_rows.KV_BF16


# ----------------------------------------------------------------------------- rotation
@njit(cache=True)
def k_rotation(kv_type, hd):
    """Elements of the Hadamard rotation of q and k for a K cache of ``kv_type`` (0: none):
    a quantized cache of heads that are a multiple of 64, the largest power of two from 64
    that divides the head."""
    if not quantized(kv_type) or hd % 64 != 0:
        return 0
    n = 64
    while hd % (2 * n) == 0:
        n *= 2
    return n


@njit(cache=True)
def v_rotation(kv_type, hd):
    """Elements of the Hadamard rotation of v (and back of the attention output) for a V
    cache of ``kv_type`` (0: none): 64 for a quantized cache of heads that are a multiple
    of 64."""
    return 64 if quantized(kv_type) and hd % 64 == 0 else 0


@njit(cache=True)
def fwht(x, off, length, n):
    """In place, ``x[off:off+length]`` in chunks of ``n`` (a power of two): each chunk
    scaled by ``1/sqrt(n)`` then the butterflies ``(u + v, u - v)`` of widths 1, 2, 4, ...
    (ggml's fast Walsh-Hadamard transform; the same rounding as its SIMD passes)."""
    scale = _F32(1.0) / np.sqrt(_F32(n))
    for c0 in range(off, off + length, n):
        for j in range(c0, c0 + n):
            x[j] = x[j] * scale
        w = 1
        while w < n:
            for i in range(c0, c0 + n, 2 * w):
                for j in range(i, i + w):
                    u, v = x[j], x[j + w]
                    x[j] = u + v
                    x[j + w] = u - v
            w *= 2


# ----------------------------------------------------------------------------- cache rows
@njit(cache=True)
def store_row(x, xo, hd, kv_type, cache, co):
    """Write ``x[xo:xo+hd]`` (f32, flat) into the cache row at byte ``co``, converting as
    ggml's ``from_float`` of the cache type (f16 round to nearest; q8_0 as for activations)."""
    if kv_type == KV_F32:
        for i in range(0, hd, 16):
            vstore_f32(cache, co + 4 * i, vload_f32(x, xo + i))
    elif kv_type == KV_F16:
        for i in range(0, hd, 16):
            vstore_f16(cache, co + 2 * i, vload_f32(x, xo + i))
    elif kv_type != KV_Q8_0:
        kv_rows.store(x, xo, hd, kv_type, cache, co)
    else:
        for b in range(hd // 32):
            amax = _F32(0.0)
            for j in range(32):
                amax = max(amax, abs(x[xo + 32 * b + j]))
            d = amax / _F32(127.0)
            inv = _F32(127.0) / amax if amax != 0 else _F32(0.0)
            o = co + 34 * b
            store_f16(cache, o, d)
            for j in range(32):
                cache[o + 2 + j] = np.uint8(np.int64(np.rint(x[xo + 32 * b + j] * inv)) & 0xFF)


@njit(cache=True)
def load_row(cache, co, hd, kv_type, out):
    """Dequantize a cache row into ``out[:hd]`` (f32)."""
    if kv_type == KV_F32:
        for i in range(0, hd, 16):
            vstore_f32(out, i, vload_f32(cache, co + 4 * i))
    elif kv_type == KV_F16:
        for i in range(0, hd, 16):
            vstore_f32(out, i, vload_f16(cache, co + 2 * i))
    elif kv_type != KV_Q8_0:
        kv_rows.load(cache, co, hd, kv_type, out)
    else:
        for b in range(hd // 32):
            d = load_f16(cache, co + 34 * b)
            for j in range(32):
                q = np.int64(cache[co + 34 * b + 2 + j])
                out[32 * b + j] = _F32(q - 256 if q >= 128 else q) * d


# ----------------------------------------------------------------------------- one row
@njit(cache=True, inline="always")
def _dot_f16(qv, kc, ko, hd):
    """ggml_vec_dot_f16 for hd % 16 == 0: 4 lane accumulators per 64, tree reduction,
    leftover elements summed in double. ``qv`` holds q rounded to f16 (as f32)."""
    n64 = hd - hd % 64
    s0 = s1 = s2 = s3 = vzero_f32()
    for i in range(0, n64, 64):
        s0 = vfma(vload_f32(qv, i), vload_f16(kc, ko + 2 * i), s0)
        s1 = vfma(vload_f32(qv, i + 16), vload_f16(kc, ko + 2 * i + 32), s1)
        s2 = vfma(vload_f32(qv, i + 32), vload_f16(kc, ko + 2 * i + 64), s2)
        s3 = vfma(vload_f32(qv, i + 48), vload_f16(kc, ko + 2 * i + 96), s3)
    acc = np.float64(vhsum((s0 + s2) + (s1 + s3))) if n64 > 0 else 0.0
    for i in range(n64, hd):
        acc += np.float64(qv[i] * load_f16(kc, ko + 2 * i))
    return _F32(acc)


@njit(cache=True, inline="always")
def _dot_f32(qv, kc, ko, hd):
    """:func:`_dot_f16` over an f32 row read rounded to f16 (the cast before flash
    attention)."""
    n64 = hd - hd % 64
    s0 = s1 = s2 = s3 = vzero_f32()
    for i in range(0, n64, 64):
        s0 = vfma(vload_f32(qv, i), vround_f16(vload_f32(kc, ko + 4 * i)), s0)
        s1 = vfma(vload_f32(qv, i + 16), vround_f16(vload_f32(kc, ko + 4 * i + 64)), s1)
        s2 = vfma(vload_f32(qv, i + 32), vround_f16(vload_f32(kc, ko + 4 * i + 128)), s2)
        s3 = vfma(vload_f32(qv, i + 48), vround_f16(vload_f32(kc, ko + 4 * i + 192)), s3)
    acc = np.float64(vhsum((s0 + s2) + (s1 + s3))) if n64 > 0 else 0.0
    for i in range(n64, hd):
        acc += np.float64(qv[i] * round_f16(load_f32(kc, ko + 4 * i)))
    return _F32(acc)


@njit(cache=True, inline="always")
def _i8(b):
    v = np.int32(b)
    return v - 256 if v >= 128 else v


@njit(cache=True, inline="always")
def _lane4(kc, o, qq, qo):
    """One int32 lane of ggml's ``mul_sum_i8_pairs_float``: 4 consecutive int8 products."""
    return _F32(
        _i8(kc[o]) * qq[qo]
        + _i8(kc[o + 1]) * qq[qo + 1]
        + _i8(kc[o + 2]) * qq[qo + 2]
        + _i8(kc[o + 3]) * qq[qo + 3]
    )


@njit(cache=True, inline="always")
def _dot_q8(qv, qq, kc, ko, hd):
    """ggml_vec_dot_q8_0_q8_0 (x86, AVX2 and up): per block ``d = d_k * d_q``, the 32 int8
    products summed in 8 lanes of 4 (as float), ``acc[lane] = fma(d, lane, acc[lane])``;
    ``hsum_float_8`` at the end. ``qq`` = q quantized (int8 in an int32 array), ``qv[b]``
    its block scales."""
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = _F32(0.0)
    for b in range(hd // 32):
        o = ko + 34 * b + 2
        q0 = 32 * b
        d = load_f16(kc, o - 2) * qv[b]
        a0 = fmaf(d, _lane4(kc, o, qq, q0), a0)
        a1 = fmaf(d, _lane4(kc, o + 4, qq, q0 + 4), a1)
        a2 = fmaf(d, _lane4(kc, o + 8, qq, q0 + 8), a2)
        a3 = fmaf(d, _lane4(kc, o + 12, qq, q0 + 12), a3)
        a4 = fmaf(d, _lane4(kc, o + 16, qq, q0 + 16), a4)
        a5 = fmaf(d, _lane4(kc, o + 20, qq, q0 + 20), a5)
        a6 = fmaf(d, _lane4(kc, o + 24, qq, q0 + 24), a6)
        a7 = fmaf(d, _lane4(kc, o + 28, qq, q0 + 28), a7)
    r0, r1, r2, r3 = a4 + a0, a5 + a1, a6 + a2, a7 + a3
    return (r0 + r2) + (r1 + r3)


@njit(cache=True)
def prepare_query(q, qo, hd, k_type, qv, qq):
    """Convert a query row to the K dot type: f16-rounded (f16 K, and f32 K read as f16),
    q8_0, or that of a :mod:`.kv_rows` format."""
    if k_type != KV_Q8_0 and k_type != KV_F16 and k_type != KV_F32:
        kv_rows.prepare_query(q, qo, hd, k_type, qv, qq)
    elif k_type != KV_Q8_0:  # f16, or f32 read as f16
        for i in range(0, hd, 16):
            vstore_f32(qv, i, vround_f16(vload_f32(q, qo + i)))
    else:
        for b in range(hd // 32):
            amax = _F32(0.0)
            for j in range(32):
                amax = max(amax, abs(q[qo + 32 * b + j]))
            d = amax / _F32(127.0)
            inv = _F32(127.0) / amax if amax != 0 else _F32(0.0)
            for j in range(32):
                qq[32 * b + j] = np.int32(np.rint(q[qo + 32 * b + j] * inv))
            qv[b] = round_f16(d)


@njit(cache=True)
def attend_row(
    qv, qq, kc, vc, ko, vo, cstride, k_type, v_type, hd, mask, mo, ic0, ic1, scale, vbuf, res,
    order, softcap,
):  # fmt: skip
    """One query row over cells ``ic0..ic1`` -> ``res[:hd]`` (unnormalized, f32) and
    returns ``(M, S)`` (running max and sum). ``mask[mo + c]`` gates cell ``c``. A
    non-empty ``order`` visits cells ``order[ic0..ic1]`` instead (cells in position order:
    the result then does not depend on where a sequence's cells are). ``softcap`` != 0:
    each score ``s * scale`` becomes ``softcap * tanh(s * scale)`` (``scale`` already
    divided by the cap, see :func:`cap_scale`)."""
    m = _NEG_INF
    s_sum = _F32(0.0)
    ordered = order.shape[0] > 0
    for i in range(0, hd, 16):
        vstore_f32(res, i, vzero_f32())
    for j in range(ic0, ic1):
        c = order[j] if ordered else j
        if mask[mo + c] == 0:
            continue
        kco = ko + c * cstride
        if k_type == KV_F16:
            s = _dot_f16(qv, kc, kco, hd)
        elif k_type == KV_F32:
            s = _dot_f32(qv, kc, kco, hd)
        elif k_type == KV_Q8_0:
            s = _dot_q8(qv, qq, kc, kco, hd)
        else:  # (vbuf: scratch until V is read)
            s = kv_rows.dot(qv, qq, kc, kco, hd, k_type, vbuf)
        s = s * scale
        if softcap != 0:
            s = softcap * np.tanh(s)
        ms = _F32(1.0)
        vs = _F32(1.0)
        vco = vo + c * cstride
        if s > m:
            ms = np.exp(m - s)
            m = s
            for i in range(0, hd, 16):
                r = vload_f32(res, i) * vsplat_f32(ms)
                if v_type in (KV_F16, KV_F32):  # an f16 accumulator
                    r = vround_f16(r)
                vstore_f32(res, i, r)
        else:
            vs = np.exp(s - m)
        if v_type == KV_F16:
            for i in range(0, hd, 16):
                r = vfma(vload_f16(vc, vco + 2 * i), vsplat_f32(vs), vload_f32(res, i))
                vstore_f32(res, i, vround_f16(r))
        elif v_type == KV_F32:
            for i in range(0, hd, 16):
                v = vround_f16(vload_f32(vc, vco + 4 * i))
                r = vfma(v, vsplat_f32(vs), vload_f32(res, i))
                vstore_f32(res, i, vround_f16(r))
        else:
            load_row(vc, vco, hd, v_type, vbuf)
            for i in range(0, hd, 16):
                r = vfma(vload_f32(vbuf, i), vsplat_f32(vs), vload_f32(res, i))
                vstore_f32(res, i, r)
        s_sum = fmaf(s_sum, ms, vs)  # gcc contracts ggml's `S = S*ms + vs`
    return m, s_sum


@njit(cache=True, inline="always")
def cap_scale(scale, softcap):
    """The K.Q scale the kernels apply before the cap: ``scale / softcap`` (in the scale's
    float type, as ggml's ``scale /= logit_softcap``), ``scale`` without a cap."""
    if softcap != 0:
        return scale / _F32(softcap)
    return scale


@njit(cache=True)
def finish_row(res, hd, s_sum, out, oo):
    """``out[oo:oo+hd] = res / S`` (0 when no cell was visible)."""
    inv = _F32(1.0) / s_sum if s_sum != 0 else _F32(0.0)
    for i in range(0, hd, 16):
        vstore_f32(out, oo + i, vload_f32(res, i) * vsplat_f32(inv))


@njit(cache=True)
def merge_partials(ms, ss, parts, n_chunks, hd, out, oo, tmp):
    """Combine per-chunk (M, S, VKQ) of one head as ggml's split-KV reduction."""
    m_fin = _NEG_INF
    s_fin = _F32(0.0)
    for i in range(hd):
        tmp[i] = 0
    for c in range(n_chunks):
        if ss[c] == 0:
            continue
        m_new = max(m_fin, ms[c])
        so = np.exp(m_fin - m_new)
        sn = np.exp(ms[c] - m_new)
        for i in range(hd):
            tmp[i] = fmaf(tmp[i], so, parts[c, i] * sn)
        s_fin = fmaf(s_fin, so, ss[c] * sn)
        m_fin = m_new
    inv = _F32(1.0) / s_fin if s_fin != 0 else _F32(1.0)
    for i in range(hd):
        out[oo + i] = tmp[i] * inv


@njit(cache=True)
def add_sink(sinks, h, m, s_sum, res, hd):
    """Head ``h``'s attention sink (``sinks[h]``, gpt-oss; none when ``sinks`` is empty): one
    more score in the softmax with no value row, as ggml adds it after the cells (the
    accumulator rescaled in f32 when the sink is the new maximum). Returns the new (M, S)."""
    if sinks.shape[0] == 0:
        return m, s_sum
    sink = sinks[h]
    if sink > m:
        ms = np.exp(m - sink)
        for i in range(0, hd, 16):
            vstore_f32(res, i, vload_f32(res, i) * vsplat_f32(ms))
        return sink, fmaf(s_sum, ms, _F32(1.0))
    return m, fmaf(s_sum, _F32(1.0), np.exp(sink - m))


# ----------------------------------------------------------------------------- tiled
@njit(cache=True)
def load_tile(kc, vc, ko, vo, cstride, k_type, v_type, hd, c0, n, kt, vt):
    """Cells ``c0..c0+n`` of one head as float32: ``kt[d, c]`` (transposed) and ``vt[c, d]``;
    cells past ``n`` are zero. f32 rows are read rounded to f16 (see the module notes)."""
    k16, v16 = k_type == KV_F32, v_type == KV_F32
    for c in range(TILE):
        if c < n:
            load_row(kc, ko + (c0 + c) * cstride, hd, k_type, vt[c])
            for d in range(hd):
                kt[d, c] = round_f16(vt[c, d]) if k16 else vt[c, d]
            load_row(vc, vo + (c0 + c) * cstride, hd, v_type, vt[c])
            if v16:
                for i in range(0, hd, 16):
                    vstore_f32(vt[c], i, vround_f16(vload_f32(vt[c], i)))
        else:
            for d in range(hd):
                kt[d, c] = 0
                vt[c, d] = 0


@njit(cache=True, inline="always")
def _tile_scores(p, kq0, kq1, kq2, kq3, scale, softcap, mask, mo, c0, n):
    """One row's scaled (and soft-capped) scores of a tile into ``p``, masked and
    past-``n`` cells at -inf; returns their maximum."""
    sc = vsplat_f32(scale)
    vstore_f32(p, 0, kq0 * sc)
    vstore_f32(p, 16, kq1 * sc)
    vstore_f32(p, 32, kq2 * sc)
    vstore_f32(p, 48, kq3 * sc)
    if softcap != 0:
        for c in range(TILE):
            p[c] = np.tanh(p[c]) * softcap
    for c in range(TILE):
        if c >= n or mask[mo + c0 + c] == 0:
            p[c] = _NEG_INF
    tmax = max(vhmax(vload_f32(p, 0)), vhmax(vload_f32(p, 16)))
    return max(tmax, max(vhmax(vload_f32(p, 32)), vhmax(vload_f32(p, 48))))


@njit(cache=True, inline="always")
def _tile_softmax(p, tmax, hd, state, res):
    """One row's online-softmax step: rescale ``res``/``state`` to the new maximum and turn
    the scores in ``p`` into probabilities (ggml_vec_soft_max_f32: ggml's vector exp,
    16-lane sums added in double)."""
    m_old = state[0]
    m_new = max(m_old, tmax)
    if m_new > m_old:
        ms = np.exp(m_old - m_new)
        for i in range(0, hd, 16):
            vstore_f32(res, i, vload_f32(res, i) * vsplat_f32(ms))
        state[1] *= ms
    state[0] = m_new
    tot = 0.0
    mv = vsplat_f32(m_new)
    for c in range(0, TILE, 16):
        e = vexp_ggml(vload_f32(p, c) - mv)
        vstore_f32(p, c, e)
        tot += np.float64(vhsum(e))
    state[1] = _F32(np.float64(state[1]) + tot)


@njit(cache=True, inline="always")
def _tile_pv(p, n, vt, hd, res):
    """``res += p . V`` for one row: 64 dimensions at a time held in registers across the
    cells (through memory, each cell's update waited for the previous one's store); cells
    with probability 0 are skipped."""
    i0 = 0
    while i0 + 64 <= hd:
        r0, r1 = vload_f32(res, i0), vload_f32(res, i0 + 16)
        r2, r3 = vload_f32(res, i0 + 32), vload_f32(res, i0 + 48)
        for c in range(n):
            if p[c] != 0:
                pc = vsplat_f32(p[c])
                r0 = vfma(pc, vload_f32(vt[c], i0), r0)
                r1 = vfma(pc, vload_f32(vt[c], i0 + 16), r1)
                r2 = vfma(pc, vload_f32(vt[c], i0 + 32), r2)
                r3 = vfma(pc, vload_f32(vt[c], i0 + 48), r3)
        vstore_f32(res, i0, r0)
        vstore_f32(res, i0 + 16, r1)
        vstore_f32(res, i0 + 32, r2)
        vstore_f32(res, i0 + 48, r3)
        i0 += 64
    _tile_pv_from(p, n, vt, i0, hd, res)


@njit(cache=True, inline="always")
def _tile_pv_from(p, n, vt, i0, hd, res):
    """``res[i0:hd] += p . V[:, i0:hd]``, 16 dimensions at a time through memory (the
    dimensions past the last whole 64 of :func:`_tile_pv`)."""
    if i0 >= hd:
        return
    for c in range(n):
        if p[c] != 0:
            pc = vsplat_f32(p[c])
            for i in range(i0, hd, 16):
                vstore_f32(res, i, vfma(pc, vload_f32(vt[c], i), vload_f32(res, i)))


@njit(cache=True, inline="always")
def _tile_pv2(pa, pb, n, vt, hd, ra, rb):
    """:func:`_tile_pv` for two rows sharing the V tile (each row's operations unchanged)."""
    i0 = 0
    while i0 + 64 <= hd:
        a0, a1 = vload_f32(ra, i0), vload_f32(ra, i0 + 16)
        a2, a3 = vload_f32(ra, i0 + 32), vload_f32(ra, i0 + 48)
        b0, b1 = vload_f32(rb, i0), vload_f32(rb, i0 + 16)
        b2, b3 = vload_f32(rb, i0 + 32), vload_f32(rb, i0 + 48)
        for c in range(n):
            v0, v1 = vload_f32(vt[c], i0), vload_f32(vt[c], i0 + 16)
            v2, v3 = vload_f32(vt[c], i0 + 32), vload_f32(vt[c], i0 + 48)
            if pa[c] != 0:
                pc = vsplat_f32(pa[c])
                a0, a1 = vfma(pc, v0, a0), vfma(pc, v1, a1)
                a2, a3 = vfma(pc, v2, a2), vfma(pc, v3, a3)
            if pb[c] != 0:
                pc = vsplat_f32(pb[c])
                b0, b1 = vfma(pc, v0, b0), vfma(pc, v1, b1)
                b2, b3 = vfma(pc, v2, b2), vfma(pc, v3, b3)
        vstore_f32(ra, i0, a0)
        vstore_f32(ra, i0 + 16, a1)
        vstore_f32(ra, i0 + 32, a2)
        vstore_f32(ra, i0 + 48, a3)
        vstore_f32(rb, i0, b0)
        vstore_f32(rb, i0 + 16, b1)
        vstore_f32(rb, i0 + 32, b2)
        vstore_f32(rb, i0 + 48, b3)
        i0 += 64
    _tile_pv_from(pa, n, vt, i0, hd, ra)
    _tile_pv_from(pb, n, vt, i0, hd, rb)


@njit(cache=True)
def attend_tile(q, qo, hd, kt, vt, mask, mo, c0, n, scale, softcap, state, res, p):
    """Update one query row's softmax state (``state`` = [M, S]) and accumulator ``res`` with
    a loaded tile of ``n`` cells starting at cell ``c0``, ggml's tiled f32 numerics
    (``p``: scratch of TILE floats)."""
    kq0 = kq1 = kq2 = kq3 = vzero_f32()
    for d in range(hd):
        qd = vsplat_f32(q[qo + d])
        kq0 = vfma(qd, vload_f32(kt[d], 0), kq0)
        kq1 = vfma(qd, vload_f32(kt[d], 16), kq1)
        kq2 = vfma(qd, vload_f32(kt[d], 32), kq2)
        kq3 = vfma(qd, vload_f32(kt[d], 48), kq3)
    tmax = _tile_scores(p, kq0, kq1, kq2, kq3, scale, softcap, mask, mo, c0, n)
    if tmax == _NEG_INF:
        return
    _tile_softmax(p, tmax, hd, state, res)
    _tile_pv(p, n, vt, hd, res)


@njit(cache=True)
def attend_tile2(qa, qb, qo, hd, kt, vt, ma, mb, c0, n, scale, softcap, sa, sb, ra, rb, pa, pb):
    """:func:`attend_tile` for two query rows (``qa``/``qb``, masks ``ma``/``mb``, states,
    accumulators, scratch) sharing the tile: each K and V vector is loaded once for both,
    and twice as many independent sums keep the FMA units busy. Each row's operations and
    their order are those of :func:`attend_tile`: the results are bit-identical."""
    a0 = a1 = a2 = a3 = b0 = b1 = b2 = b3 = vzero_f32()
    for d in range(hd):
        k0, k1 = vload_f32(kt[d], 0), vload_f32(kt[d], 16)
        k2, k3 = vload_f32(kt[d], 32), vload_f32(kt[d], 48)
        qd = vsplat_f32(qa[qo + d])
        a0, a1, a2, a3 = vfma(qd, k0, a0), vfma(qd, k1, a1), vfma(qd, k2, a2), vfma(qd, k3, a3)
        qd = vsplat_f32(qb[qo + d])
        b0, b1, b2, b3 = vfma(qd, k0, b0), vfma(qd, k1, b1), vfma(qd, k2, b2), vfma(qd, k3, b3)
    ta = _tile_scores(pa, a0, a1, a2, a3, scale, softcap, ma, 0, c0, n)
    tb = _tile_scores(pb, b0, b1, b2, b3, scale, softcap, mb, 0, c0, n)
    live_a, live_b = ta != _NEG_INF, tb != _NEG_INF
    if live_a:
        _tile_softmax(pa, ta, hd, sa, ra)
    if live_b:
        _tile_softmax(pb, tb, hd, sb, rb)
    if live_a and live_b:
        _tile_pv2(pa, pb, n, vt, hd, ra, rb)
    elif live_a:
        _tile_pv(pa, n, vt, hd, ra)
    elif live_b:
        _tile_pv(pb, n, vt, hd, rb)


# ----------------------------------------------------------------------------- drivers
# ``kc``/``vc`` are a whole cache, flat (uint8); the row of KV head ``hk``, cell ``c`` of the
# layer is at byte ``lbase + hk*hstride + c*rowb``. ``Q``/``ATT`` are ``[n_tokens,
# n_head * hd]``; work is split among ``nth`` threads by ``tid``.


@njit(cache=True)
def attention_rows(
    tid,
    nth,
    n_tok,
    n_kv,
    n_head,
    gqa,
    hd,
    scale,
    k_type,
    v_type,
    rowb,
    Q,
    kc,
    vc,
    lbase,
    hstride,
    mask,
    order,
    ATT,
    qv,
    qq,
    vbuf,
    res,
    sinks,
    softcap=0.0,
):
    """One (token, head) row after the other (ubatches under 64 tokens, short decodes, and
    every ubatch of a deterministic context, which passes its cells in position order);
    ``sinks``: per-head attention sinks (empty: none, see :func:`add_sink`); ``softcap``:
    the scores' soft cap (0: none)."""
    kq, cap = cap_scale(scale, softcap), _F32(softcap)
    i0, i1 = split(n_tok * n_head, tid, nth)
    for i in range(i0, i1):
        t, h = i // n_head, i % n_head
        prepare_query(Q[t], h * hd, hd, k_type, qv, qq)
        m, s = attend_row(
            qv,
            qq,
            kc,
            vc,
            lbase + (h // gqa) * hstride,
            lbase + (h // gqa) * hstride,
            rowb,
            k_type,
            v_type,
            hd,
            mask[t],
            0,
            0,
            n_kv,
            kq,
            vbuf,
            res,
            order,
            cap,
        )
        _, s = add_sink(sinks, h, m, s, res, hd)
        finish_row(res, hd, s, ATT[t], h * hd)


@njit(cache=True)
def attention_split_partial(
    tid,
    nth,
    n_kv,
    n_head,
    gqa,
    hd,
    scale,
    k_type,
    v_type,
    rowb,
    Q,
    kc,
    vc,
    lbase,
    hstride,
    mask,
    order,
    qv,
    qq,
    vbuf,
    res,
    pm,
    ps,
    pv,
    sinks,
    row=0,
    softcap=0.0,
):
    """Decode (one token, query row ``row``) over a long cache, phase 1: thread ``tid``
    attends its chunk of cells for every head; partials go to ``pm/ps/pv[head, tid]``. The
    sinks go into the first chunk's partials (as ggml's)."""
    kq, cap = cap_scale(scale, softcap), _F32(softcap)
    cs = (n_kv + nth - 1) // nth
    ic0, ic1 = min(tid * cs, n_kv), min((tid + 1) * cs, n_kv)
    for h in range(n_head):
        prepare_query(Q[row], h * hd, hd, k_type, qv, qq)
        m, s = attend_row(
            qv,
            qq,
            kc,
            vc,
            lbase + (h // gqa) * hstride,
            lbase + (h // gqa) * hstride,
            rowb,
            k_type,
            v_type,
            hd,
            mask[row],
            0,
            ic0,
            ic1,
            kq,
            vbuf,
            res,
            order,
            cap,
        )
        if tid == 0:
            m, s = add_sink(sinks, h, m, s, res, hd)
        pm[h, tid], ps[h, tid] = m, s
        pv[h, tid, :hd] = res[:hd]


@njit(cache=True)
def attention_split_merge(tid, nth, n_head, hd, pm, ps, pv, ATT, tmp, row=0):
    """Phase 2 (after a barrier): thread ``tid`` merges the partials of its heads into
    ``ATT[row]``."""
    h0, h1 = split(n_head, tid, nth)
    for h in range(h0, h1):
        merge_partials(pm[h], ps[h], pv[h], nth, hd, ATT[row], h * hd, tmp)


@njit(cache=True)
def attention_tiled(
    tid,
    nth,
    n_tok,
    n_kv,
    n_head,
    gqa,
    hd,
    scale,
    k_type,
    v_type,
    rowb,
    Q,
    kc,
    vc,
    lbase,
    hstride,
    mask,
    ATT,
    kt,
    vt,
    pt,
    st,
    sinks,
    softcap=0.0,
):
    """Ubatches of 64 tokens and more: work items are (KV head, block of 16, 32 or 64
    tokens), dealt round-robin (later blocks see more cells); a block is as large as ``st``
    holds softmax states for (2 floats a row) while leaving every thread four items or
    more. Each tile of cells is loaded once per block for as many of the ``gqa`` query heads
    sharing the KV head as ``st`` holds states for (``128 * gqa`` floats: 64-token blocks,
    all heads), and goes to two query rows at a time when ``pt`` holds two rows' scores
    (2 * TILE floats). Every query row still sees the tiles in cell order with the same
    operations, so its numerics do not depend on the grouping. ``softcap``: the scores'
    soft cap (0: none)."""
    kq, cap = cap_scale(scale, softcap), _F32(softcap)
    n_kv_head = n_head // gqa
    rows = _tiled_rows(n_tok, n_kv_head, st.shape[0], nth)
    nb = (n_tok + rows - 1) // rows
    gfit = max(1, min(gqa, st.shape[0] // (2 * rows)))
    pair = pt.shape[0] >= 2 * TILE  # scratch for two rows' scores: rows go in pairs
    for i in range(tid, n_kv_head * nb, nth):
        hk, blk = i % n_kv_head, i // n_kv_head
        q0, q1 = rows * blk, min(rows * blk + rows, n_tok)
        ho = lbase + hk * hstride
        for g0 in range(0, gqa, gfit):
            g1 = min(gqa, g0 + gfit)
            _tiled_start(ATT, st, hk, gqa, g0, g1, q0, q1, rows, hd)
            for c0 in range(0, n_kv, TILE):
                n = min(TILE, n_kv - c0)
                if not _tile_visible(mask, q0, q1, c0, n):
                    continue
                load_tile(kc, vc, ho, ho, rowb, k_type, v_type, hd, c0, n, kt, vt)
                for g in range(g0, g1):
                    h = hk * gqa + g
                    t = q0
                    while t + 1 < q1 and pair:  # two rows at a time (same numerics)
                        s = 2 * rows * (g - g0) + 2 * (t - q0)
                        attend_tile2(
                            Q[t], Q[t + 1], h * hd, hd, kt, vt, mask[t], mask[t + 1], c0, n,
                            kq, cap, st[s : s + 2], st[s + 2 : s + 4], ATT[t, h * hd :],
                            ATT[t + 1, h * hd :], pt[:TILE], pt[TILE : 2 * TILE],
                        )  # fmt: skip
                        t += 2
                    while t < q1:
                        s = 2 * rows * (g - g0) + 2 * (t - q0)
                        attend_tile(
                            Q[t], h * hd, hd, kt, vt, mask[t], 0, c0, n, kq, cap, st[s : s + 2],
                            ATT[t, h * hd :], pt,
                        )  # fmt: skip
                        t += 1
            for g in range(g0, g1):
                h = hk * gqa + g
                for t in range(q0, q1):
                    s = 2 * rows * (g - g0) + 2 * (t - q0)
                    _, sum_ = add_sink(sinks, h, st[s], st[s + 1], ATT[t, h * hd :], hd)
                    finish_row(ATT[t, h * hd :], hd, sum_, ATT[t], h * hd)


@njit(cache=True, inline="always")
def _tiled_rows(n_tok, n_kv_head, n_states, nth):
    """Query rows per work item: 16, 32 or 64, as many as ``n_states`` softmax states allow
    while every thread keeps four items or more."""
    rows = 16
    while (
        rows < 64
        and 4 * rows <= n_states
        and n_kv_head * ((n_tok + 2 * rows - 1) // (2 * rows)) >= 4 * nth
    ):
        rows *= 2
    return rows


@njit(cache=True, inline="always")
def _tiled_start(ATT, st, hk, gqa, g0, g1, q0, q1, rows, hd):
    """Zero the outputs of query heads ``g0..g1`` of KV head ``hk``, rows ``q0..q1``, and
    start their softmax states (max -inf, sum 0)."""
    for g in range(g0, g1):
        h = hk * gqa + g
        for t in range(q0, q1):
            ATT[t, h * hd : (h + 1) * hd] = 0
            s = 2 * rows * (g - g0) + 2 * (t - q0)
            st[s] = -np.inf
            st[s + 1] = 0


@njit(cache=True, inline="always")
def _tile_visible(mask, q0, q1, c0, n):
    """Whether any of rows ``q0..q1`` sees any of cells ``c0..c0+n``."""
    for t in range(q0, q1):
        for c in range(c0, c0 + n):
            if mask[t, c] != 0:
                return True
    return False


# ----------------------------------------------------------------------------- K shift
@njit(cache=True)
def rope_shift_rows(
    kc, k_type, hd, n_layer, n_head_kv, n_ctx, rowb, cells, shift, rp, ff, neox, off=0
):  # fmt: skip
    """Rotate the cached keys of ``cells`` by rope at position ``shift[cell]`` (every layer
    and head of the flat cache ``kc``), dequantizing and re-storing in the cache type as
    llama.cpp's K-shift; the roped part of a row starts at ``off`` (deepseek2's latent
    rows: after the latent)."""
    n_rot = np.int64(rp[6])
    rk = k_rotation(k_type, hd)
    row = np.empty((1, hd), _F32)
    cache = np.empty(max(2, n_rot), _F32)
    for c in cells:
        rope_cache(shift[c], rp, ff, cache)
        for hk in range(n_layer * n_head_kv):
            o = (hk * n_ctx + c) * rowb
            load_row(kc, o, hd, k_type, row[0])
            if rk:  # rotated keys: back, rope, forward again
                fwht(row[0], 0, hd, rk)
            rope_apply(row, 0, off, 1, hd, cache, n_rot, neox)
            if rk:
                fwht(row[0], 0, hd, rk)
            store_row(row[0], 0, hd, k_type, kc, o)
