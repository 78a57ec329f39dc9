"""The loops a format's matmul kernel runs its block kernels in (row groups x tokens).

A format's ``mm`` kernel (see :mod:`.traits`) binds its block kernels and group block size to
one of these drivers: :func:`drive` (vector accumulators: K-quant and float formats, tokens
4 at a time), :func:`drive_acc` (the same with the format's own accumulator start / finish),
:func:`drive_lanes` (ggml-lane accumulators of the 32-weight formats, tokens 2 at a time,
see :mod:`.qdot_legacy`). ``out[ot + t - t0, 16g:16g+16] (+)= W[16g:16g+16] . act(x[t])``
for tokens ``t0..t1`` and row groups ``g0..g1``; ``bb`` bytes per group block, ``nblk``
blocks per row. :func:`drive_rows` takes gathered rows instead of a token range (one
expert's tokens), 4 at a time through a kernel that runs a whole row group (MXFP4).
"""

from __future__ import annotations

from numba import njit

from ..simd import prefetch, vload_f32, vstore_f32, vzero_f32

PREFETCH = 2048  # bytes ahead of the weight block being read


@njit(cache=True, inline="always")
def _put(out, i, v, add):
    if add:
        v = v + vload_f32(out, i)
    vstore_f32(out, i, v)


@njit(cache=True, inline="always")
def _same(a):
    return a


@njit(cache=True, inline="always")
def drive(k1, k4, w, off, nblk, bb, g0, g1, A, t0, t1, out, ot, add):
    """Vector accumulators (K-quant and float formats): tokens 4 at a time."""
    drive_acc(vzero_f32, _same, k1, k4, w, off, nblk, bb, g0, g1, A, t0, t1, out, ot, add)


@njit(cache=True, inline="always")
def drive_acc(zero, fin, k1, k4, w, off, nblk, bb, g0, g1, A, t0, t1, out, ot, add):
    """:func:`drive` with accumulators made by ``zero()`` and finished by ``fin(acc)``."""
    _drive(zero, fin, k1, k4, True, w, off, nblk, bb, g0, g1, A, t0, t1, out, ot, add)


@njit(cache=True, inline="always")
def _no_k4(w, o, A, t, b, a0, a1, a2, a3):
    return a0, a1, a2, a3


@njit(cache=True, inline="always")
def drive_single(zero, fin, k1, w, off, nblk, bb, g0, g1, A, t0, t1, out, ot, add):
    """:func:`drive_acc` one token at a time: every token gets the single-token arithmetic
    (the batch-invariant kernel of a format whose four-token kernel sums otherwise)."""
    _drive(zero, fin, k1, _no_k4, False, w, off, nblk, bb, g0, g1, A, t0, t1, out, ot, add)


@njit(cache=True, inline="always")
def _drive(zero, fin, k1, k4, four, w, off, nblk, bb, g0, g1, A, t0, t1, out, ot, add):
    ldo = out.shape[1]
    for g in range(g0, g1):
        og = off + g * nblk * bb
        t = t0
        while four and t + 4 <= t1:
            a0 = a1 = a2 = a3 = zero()
            for b in range(nblk):
                a0, a1, a2, a3 = k4(w, og + b * bb, A, t, b, a0, a1, a2, a3)
            o = (ot + t - t0) * ldo + 16 * g
            _put(out, o, fin(a0), add)
            _put(out, o + ldo, fin(a1), add)
            _put(out, o + 2 * ldo, fin(a2), add)
            _put(out, o + 3 * ldo, fin(a3), add)
            t += 4
        while t < t1:
            a = zero()
            for b in range(nblk):
                a = k1(w, og + b * bb, A, t, b, a)
            _put(out, (ot + t - t0) * ldo + 16 * g, fin(a), add)
            t += 1


@njit(cache=True, inline="always")
def drive_lanes(zero, fin, k1, k2, w, off, nblk, bb, g0, g1, A, t0, t1, out, ot, add):
    """ggml-lane accumulators (32-weight formats, see :mod:`.qdot_legacy`): tokens 2 at a time."""
    ldo = out.shape[1]
    for g in range(g0, g1):
        og = off + g * nblk * bb
        t = t0
        while t + 2 <= t1:
            a = zero()
            c = zero()
            for b in range(nblk):
                a, c = k2(w, og + b * bb, A, t, b, nblk, a, c)
            o = (ot + t - t0) * ldo + 16 * g
            _put(out, o, fin(a), add)
            _put(out, o + ldo, fin(c), add)
            t += 2
        if t < t1:
            a = zero()
            for b in range(nblk):
                for i in range(0, bb, 64):
                    prefetch(w, og + b * bb + PREFETCH + i)
                a = k1(w, og + b * bb, A, t, b, nblk, a)
            _put(out, (ot + t - t0) * ldo + 16 * g, fin(a), add)


@njit(cache=True, inline="always")
def _item(rows, i, adiv, a0, o0, ldo, g):
    """Item ``i`` of :func:`drive_rows`: (its activation row, its output offset)."""
    r = rows[i] if rows.shape[0] > 0 else i
    return a0 + r // adiv, (o0 + r) * ldo + 16 * g


@njit(cache=True, inline="always")
def drive_rows(zero, fin, k1, k2, k4, w, off, nblk, bb, g0, g1, A, rows, n, adiv, a0, out, o0, add):
    """Items ``i < n`` with row numbers ``r`` (``rows[i]``, or ``i`` for an empty ``rows``):
    ``out[o0 + r] (+)= W . act(A[a0 + r // adiv])`` for row groups ``g0..g1``, the items of a
    row group 4 at a time through ``k4(w, og, nblk, A, ta, tb, tc, td)`` (four finished
    vectors), a pair through ``k2``, the last one through ``k1`` (``zero``/``fin``
    accumulators), the row group's blocks staying in cache for all of them. The gathered
    rows of one expert (:func:`llamacpy.models.stages._experts`) or a plain token range."""
    ldo = out.shape[1]
    for g in range(g0, g1):
        og = off + g * nblk * bb
        i = 0
        while i + 4 <= n:
            ta, oa = _item(rows, i, adiv, a0, o0, ldo, g)
            tb, ob = _item(rows, i + 1, adiv, a0, o0, ldo, g)
            tc, oc = _item(rows, i + 2, adiv, a0, o0, ldo, g)
            td, od = _item(rows, i + 3, adiv, a0, o0, ldo, g)
            v = k4(w, og, nblk, A, ta, tb, tc, td)
            _put(out, oa, v[0], add)
            _put(out, ob, v[1], add)
            _put(out, oc, v[2], add)
            _put(out, od, v[3], add)
            i += 4
        if i + 2 <= n:
            ta, oa = _item(rows, i, adiv, a0, o0, ldo, g)
            tb, ob = _item(rows, i + 1, adiv, a0, o0, ldo, g)
            v = k2(w, og, nblk, A, ta, tb)
            _put(out, oa, v[0], add)
            _put(out, ob, v[1], add)
            i += 2
        if i < n:
            t, o = _item(rows, i, adiv, a0, o0, ldo, g)
            a = zero()
            for b in range(nblk):
                for j in range(0, bb, 64):
                    prefetch(w, og + b * bb + PREFETCH + j)
                a = k1(w, og + b * bb, A, t, b, nblk, a)
            _put(out, o, fin(a), add)
