"""The iteration order of llama.cpp's ``token_to_id`` map (a libstdc++ unordered_map).

When the metadata names no EOT/EOM/FIM token, llama.cpp takes the first token with a known
text (``<|eot_id|>``, ``<|im_end|>``, ...) in the order its ``std::unordered_map<std::string,
llama_token>`` iterates. That order is deterministic for a given libstdc++ (GCC's, used by
the Linux builds): ``std::hash`` is ``_Hash_bytes`` (a MurmurHash2 variant, seed
0xc70f6907), buckets grow through a fixed prime sequence, and inserting into an empty bucket
puts the node at the front of one global list. This module replays the insertions.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_MUL = np.uint64((0xC6A4A793 << 32) + 0x5BD1E995)
_SEED = np.uint64(0xC70F6907)
_S47 = np.uint64(47)

# bucket count of a std::unordered_map<std::string, ...> (libstdc++, max_load_factor 1)
# after n single insertions: (first n with this count, count)
BUCKET_STEPS = np.array(
    [
        [0, 1],
        [1, 13],
        [14, 29],
        [30, 59],
        [60, 127],
        [128, 257],
        [258, 541],
        [542, 1109],
        [1110, 2357],
        [2358, 5087],
        [5088, 10273],
        [10274, 20753],
        [20754, 42043],
        [42044, 85229],
        [85230, 172933],
        [172934, 351061],
        [351062, 712697],
        [712698, 1447153],
        [1447154, 2938679],
        [2938680, 5967347],
    ],
    dtype=np.int64,
)


@njit(cache=True, inline="always")
def _shift_mix(v):  # pragma: no cover - numba
    return v ^ (v >> _S47)


@njit(cache=True)
def hash_bytes(buf, start, length):  # pragma: no cover - numba
    """libstdc++ ``std::_Hash_bytes`` for 64-bit size_t."""
    h = _SEED ^ (np.uint64(length) * _MUL)
    aligned = length & ~7
    for p in range(start, start + aligned, 8):
        data = np.uint64(0)
        for k in range(7, -1, -1):
            data = (data << np.uint64(8)) | np.uint64(buf[p + k])
        data = _shift_mix(data * _MUL) * _MUL
        h ^= data
        h *= _MUL
    rest = length & 7
    if rest:
        data = np.uint64(0)
        end = start + aligned
        for k in range(rest - 1, -1, -1):
            data = (data << np.uint64(8)) | np.uint64(buf[end + k])
        h ^= data
        h *= _MUL
    h = _shift_mix(h) * _MUL
    return _shift_mix(h)


@njit(cache=True)
def iteration_order(buf, offsets, steps):  # pragma: no cover - numba
    """Ids in the order a map filled with ``map[text_i] = i`` (i = 0, 1, ...) iterates."""
    n = offsets.shape[0] - 1
    codes = np.empty(n, np.uint64)
    for i in range(n):
        codes[i] = hash_bytes(buf, offsets[i], offsets[i + 1] - offsets[i])
    nxt = np.full(n, -1, np.int64)
    head = -1  # _M_before_begin._M_nxt
    BEFORE = -2  # bucket entry pointing at _M_before_begin
    bc = 1
    buckets = np.full(1, -1, np.int64)
    step = 1
    for i in range(n):
        count = i + 1
        if step < steps.shape[0] and count >= steps[step, 0]:
            new_bc = steps[step, 1]
            step += 1
            nb = np.full(new_bc, -1, np.int64)
            p = head
            head = -1
            bbegin = 0
            while p != -1:
                after = nxt[p]
                b = np.int64(codes[p] % np.uint64(new_bc))
                if nb[b] == -1:
                    nxt[p] = head
                    head = p
                    nb[b] = BEFORE
                    if nxt[p] != -1:
                        nb[bbegin] = p
                    bbegin = b
                else:
                    prev = nb[b]
                    if prev == BEFORE:
                        nxt[p] = head
                        head = p
                    else:
                        nxt[p] = nxt[prev]
                        nxt[prev] = p
                p = after
            buckets = nb
            bc = new_bc
        b = np.int64(codes[i] % np.uint64(bc))
        prev = buckets[b]
        if prev != -1:
            if prev == BEFORE:
                nxt[i] = head
                head = i
            else:
                nxt[i] = nxt[prev]
                nxt[prev] = i
        else:
            nxt[i] = head
            head = i
            if nxt[i] != -1:
                buckets[np.int64(codes[nxt[i]] % np.uint64(bc))] = i
            buckets[b] = BEFORE
    order = np.empty(n, np.int64)
    k = 0
    p = head
    while p != -1:
        order[k] = p
        k += 1
        p = nxt[p]
    return order[:k]


def map_order_ranks(buf: np.ndarray, offsets: np.ndarray) -> np.ndarray | None:
    """Position of each id in llama.cpp's map iteration (None if the vocabulary is larger
    than the known bucket sequence); the tokens' bytes as ``_intern.join_bytes`` gives them."""
    n = offsets.shape[0] - 1
    if n >= BUCKET_STEPS[-1, 0]:
        return None
    order = iteration_order(buf, offsets, BUCKET_STEPS)
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(order.shape[0])
    return rank
