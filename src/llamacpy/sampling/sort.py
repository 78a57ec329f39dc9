"""libstdc++'s ``std::sort`` and ``std::partial_sort``, step for step, in numba.

llama.cpp orders candidates with these unstable algorithms, so *which* of two equal
logits comes first is decided by their exact sequence of comparisons and moves. To give
the same token for the same seed even when logits tie, we replay that sequence: introsort
(median-of-three pivot into the first slot, unguarded partition, depth limit 2*lg(n),
heap sort fallback, final insertion sort with threshold 16) and heap-select + sort-heap.

Records are three parallel arrays moved together: ``key`` (float32, compared), ``a``
(int32 payload) and ``b`` (float32 payload). ``desc=True`` compares with ``>`` (llama.cpp's
``a.logit > b.logit``), ``desc=False`` with ``<``.

``bucket_partial_sort`` is llama.cpp's ``llama_token_data_array_partial_sort``: a
128-bucket histogram over logits in [-10, 10] selects the buckets holding the top
``npartial``, each full bucket is ``std::sort``-ed and the last one ``std::partial_sort``-ed.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_THRESHOLD = 16  # libstdc++ _S_threshold
_NBUCKETS = 128
_BUCKET_SCALE = np.float32(6.4)  # nbuckets / (high - low), as the float constexpr
_BUCKET_INTER = np.float32(64.0)  # -low * scale
_INT_MIN = -2147483648


@njit(cache=True, error_model="numpy")
def _comp(x, y, desc):
    if desc:
        return x > y
    return x < y


@njit(cache=True, error_model="numpy")
def _swap(key, a, b, i, j):
    key[i], key[j] = key[j], key[i]
    a[i], a[j] = a[j], a[i]
    b[i], b[j] = b[j], b[i]


@njit(cache=True, error_model="numpy")
def _move(key, a, b, dst, src):
    key[dst] = key[src]
    a[dst] = a[src]
    b[dst] = b[src]


@njit(cache=True, error_model="numpy")
def _push_heap(key, a, b, first, hole, top, vk, va, vb, desc):
    parent = (hole - 1) // 2
    while hole > top and _comp(key[first + parent], vk, desc):
        _move(key, a, b, first + hole, first + parent)
        hole = parent
        parent = (hole - 1) // 2
    key[first + hole] = vk
    a[first + hole] = va
    b[first + hole] = vb


@njit(cache=True, error_model="numpy")
def _adjust_heap(key, a, b, first, hole, length, vk, va, vb, desc):
    top = hole
    second = hole
    while second < (length - 1) // 2:
        second = 2 * (second + 1)
        if _comp(key[first + second], key[first + second - 1], desc):
            second -= 1
        _move(key, a, b, first + hole, first + second)
        hole = second
    if (length & 1) == 0 and second == (length - 2) // 2:
        second = 2 * (second + 1)
        _move(key, a, b, first + hole, first + second - 1)
        hole = second - 1
    _push_heap(key, a, b, first, hole, top, vk, va, vb, desc)


@njit(cache=True, error_model="numpy")
def _pop_heap(key, a, b, first, last, result, desc):
    vk, va, vb = key[result], a[result], b[result]
    _move(key, a, b, result, first)
    _adjust_heap(key, a, b, first, np.int64(0), last - first, vk, va, vb, desc)


@njit(cache=True, error_model="numpy")
def _make_heap(key, a, b, first, last, desc):
    n = last - first
    if n < 2:
        return
    parent = (n - 2) // 2
    while True:
        _adjust_heap(
            key,
            a,
            b,
            first,
            parent,
            n,
            key[first + parent],
            a[first + parent],
            b[first + parent],
            desc,
        )
        if parent == 0:
            return
        parent -= 1


_CHUNK = 64


@njit(cache=True, error_model="numpy")
def partial_sort_top(key, a, b, n, k):
    """``std::partial_sort(0, k, n)`` by descending key when only the first ``k`` records
    matter afterwards (llama.cpp truncates to them): the same heap operations run on a
    small (key, position) heap, the ``n - k`` tail is only read, and the chosen records'
    payloads are gathered at the end. The tail is left unspecified.
    """
    if k <= 0:
        return
    zero, yes = np.int64(0), np.bool_(True)  # not literals: no extra specialisations
    hk = key[:k].copy()
    hp = np.arange(k).astype(np.int32)
    hb = np.zeros(k, np.float32)
    _make_heap(hk, hp, hb, zero, k, yes)
    top = hk[0]
    i = k
    while i < n:
        # the heap top only moves up: a chunk with no key above it cannot change the
        # heap; this tight vectorised count skips almost every chunk after the first few
        while i + _CHUNK <= n:
            chunk = key[i : i + _CHUNK]  # a view indexed by range(): no wraparound checks
            cnt = np.int32(0)
            for j in range(_CHUNK):
                cnt += np.int32(chunk[j] > top)
            if cnt > 0:
                break
            i += _CHUNK
        end = min(i + _CHUNK, n)
        for j in range(i, end):
            if key[j] > top:  # pop_heap(first, middle, j) minus the write to j
                _adjust_heap(hk, hp, hb, zero, zero, k, key[j], np.int32(j), np.float32(0.0), yes)
                top = hk[0]
        i = end
    end = k
    while end > 1:
        end -= 1
        _pop_heap(hk, hp, hb, zero, end, end, yes)
    ids = np.empty(k, a.dtype)
    ps = np.empty(k, b.dtype)
    for t in range(k):
        ids[t] = a[hp[t]]
        ps[t] = b[hp[t]]
    key[:k] = hk
    a[:k] = ids
    b[:k] = ps


@njit(cache=True, error_model="numpy")
def partial_sort(key, a, b, first, middle, last, desc):
    """``std::partial_sort(first, middle, last)``: heap-select, then sort-heap."""
    _make_heap(key, a, b, first, middle, desc)
    for i in range(middle, last):
        if _comp(key[i], key[first], desc):
            _pop_heap(key, a, b, first, middle, i, desc)
    end = middle
    while end - first > 1:
        end -= 1
        _pop_heap(key, a, b, first, end, end, desc)


@njit(cache=True, error_model="numpy")
def _move_median_to_first(key, a, b, result, x, y, z, desc):
    if _comp(key[x], key[y], desc):
        if _comp(key[y], key[z], desc):
            _swap(key, a, b, result, y)
        elif _comp(key[x], key[z], desc):
            _swap(key, a, b, result, z)
        else:
            _swap(key, a, b, result, x)
    elif _comp(key[x], key[z], desc):
        _swap(key, a, b, result, x)
    elif _comp(key[y], key[z], desc):
        _swap(key, a, b, result, z)
    else:
        _swap(key, a, b, result, y)


@njit(cache=True, error_model="numpy")
def _partition_pivot(key, a, b, first, last, desc):
    mid = first + (last - first) // 2
    _move_median_to_first(key, a, b, first, first + 1, mid, last - 1, desc)
    pivot = first
    lo = first + 1
    hi = last
    while True:
        while _comp(key[lo], key[pivot], desc):
            lo += 1
        hi -= 1
        while _comp(key[pivot], key[hi], desc):
            hi -= 1
        if not lo < hi:
            return lo
        _swap(key, a, b, lo, hi)
        lo += 1


@njit(cache=True, error_model="numpy")
def _linear_insert(key, a, b, last, desc):
    vk, va, vb = key[last], a[last], b[last]
    nxt = last - 1
    while _comp(vk, key[nxt], desc):
        _move(key, a, b, last, nxt)
        last = nxt
        nxt -= 1
    key[last] = vk
    a[last] = va
    b[last] = vb


@njit(cache=True, error_model="numpy")
def _insertion_sort(key, a, b, first, last, desc):
    if first == last:
        return
    for i in range(first + 1, last):
        if _comp(key[i], key[first], desc):
            vk, va, vb = key[i], a[i], b[i]
            for j in range(i, first, -1):
                _move(key, a, b, j, j - 1)
            key[first] = vk
            a[first] = va
            b[first] = vb
        else:
            _linear_insert(key, a, b, i, desc)


@njit(cache=True, error_model="numpy")
def _lg(n):
    r = -1
    while n > 0:
        n >>= 1
        r += 1
    return r


@njit(cache=True, error_model="numpy")
def std_sort(key, a, b, first, last, desc):
    """``std::sort(first, last)`` (introsort), same comparisons and moves as libstdc++."""
    if first == last:
        return
    # introsort loop; the recursion on the right part becomes an explicit stack (the
    # disjoint ranges are independent, so processing order does not change the result)
    stack = np.empty((2 * 64 + 8, 3), dtype=np.int64)
    top = 0
    stack[0, 0], stack[0, 1], stack[0, 2] = first, last, 2 * _lg(last - first)
    top = 1
    while top > 0:
        top -= 1
        f, l, depth = stack[top, 0], stack[top, 1], stack[top, 2]
        while l - f > _THRESHOLD:
            if depth == 0:
                partial_sort(key, a, b, f, l, l, desc)
                break
            depth -= 1
            cut = _partition_pivot(key, a, b, f, l, desc)
            stack[top, 0], stack[top, 1], stack[top, 2] = cut, l, depth
            top += 1
            l = cut
    if last - first > _THRESHOLD:
        _insertion_sort(key, a, b, first, first + _THRESHOLD, desc)
        for i in range(first + _THRESHOLD, last):
            _linear_insert(key, a, b, i, desc)
    else:
        _insertion_sort(key, a, b, first, last, desc)


@njit(cache=True, error_model="numpy")
def _bucket_of(val):
    x = _BUCKET_SCALE * val + _BUCKET_INTER
    # float -> int as x86 cvttss2si does it: NaN and out-of-range give INT_MIN
    ib = _INT_MIN if x != x or x >= 2147483648.0 or x < -2147483648.0 else int(x)
    return max(0, min(_NBUCKETS - 1, ib))


@njit(cache=True, error_model="numpy")
def bucket_partial_sort(key, a, b, n, npartial, out_key, out_a, out_b):
    """Top ``npartial`` of ``n`` records, sorted by descending key, into ``out_*``.

    Returns how many records were copied (>= npartial); only the first ``npartial``
    are ordered. The inputs are not modified.
    """
    bucket = np.empty(n, dtype=np.int32)
    histo = np.zeros(_NBUCKETS, dtype=np.int64)
    for i in range(n):
        ib = _bucket_of(key[i])
        bucket[i] = ib
        histo[ib] += 1
    nhave = 0
    ib = _NBUCKETS - 1
    while ib >= 0:
        nhave += histo[ib]
        if nhave >= npartial:
            break
        ib -= 1
    # bucket j (from the top) starts at ptr[127 - j]
    ptr = np.zeros(_NBUCKETS, dtype=np.int64)
    pos = 0
    for j in range(_NBUCKETS - 1, ib - 1, -1):
        ptr[_NBUCKETS - 1 - j] = pos
        pos += histo[j]
    for i in range(n):
        j = bucket[i]
        if j >= ib:
            d = ptr[_NBUCKETS - 1 - j]
            out_key[d] = key[i]
            out_a[d] = a[i]
            out_b[d] = b[i]
            ptr[_NBUCKETS - 1 - j] = d + 1
    start = 0
    ndone = 0
    for j in range(_NBUCKETS - 1, ib, -1):
        std_sort(out_key, out_a, out_b, start, start + histo[j], np.bool_(True))
        start += histo[j]
        ndone += histo[j]
    end = start + histo[ib]
    partial_sort(out_key, out_a, out_b, start, start + npartial - ndone, end, np.bool_(True))
    return nhave
