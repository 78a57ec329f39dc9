"""Open-addressing hash tables usable from numba: byte strings -> id, and int64 -> int64."""

from __future__ import annotations

import numpy as np
from numba import njit

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)


@njit(cache=True, inline="always")
def fnv1a(data, start, length):  # pragma: no cover - numba
    h = _FNV_OFFSET
    for i in range(start, start + length):
        h = (h ^ np.uint64(data[i])) * _FNV_PRIME
    return h


@njit(cache=True, inline="always")
def same_bytes(a, ao, b, bo, n):  # pragma: no cover - numba
    """``a[ao:ao+n] == b[bo:bo+n]``."""
    for k in range(n):  # noqa: SIM110 (numba)
        if a[ao + k] != b[bo + k]:
            return False
    return True


def _capacity(n: int) -> int:
    cap = 16
    while cap < 2 * n + 1:
        cap <<= 1
    return cap


@njit(cache=True)
def _build_bytes_table(buf, offsets, cap):  # pragma: no cover - numba
    table = np.full(cap, -1, np.int64)
    mask = np.uint64(cap - 1)
    for i in range(offsets.shape[0] - 1):
        s = offsets[i]
        n = offsets[i + 1] - s
        slot = fnv1a(buf, s, n) & mask
        while True:
            j = table[slot]
            if j < 0:
                table[slot] = i
                break
            # same text: the later id wins (std::unordered_map operator[] semantics)
            js = offsets[j]
            if offsets[j + 1] - js == n and same_bytes(buf, js, buf, s, n):
                table[slot] = i
                break
            slot = (slot + np.uint64(1)) & mask
    return table


def build_bytes_table(texts: list[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(table, buf, offsets) for :func:`lookup_bytes`; id i is ``texts[i]``."""
    offsets = np.zeros(len(texts) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, texts), dtype=np.int64, count=len(texts)), out=offsets[1:])
    buf = np.frombuffer(b"".join(texts), dtype=np.uint8)
    table = _build_bytes_table(buf, offsets, _capacity(len(texts)))
    return table, buf, offsets


@njit(cache=True)
def lookup_bytes(table, buf, offsets, data, start, length):  # pragma: no cover - numba
    """Id of ``data[start:start+length]`` or -1."""
    mask = np.uint64(table.shape[0] - 1)
    slot = fnv1a(data, start, length) & mask
    while True:
        j = table[slot]
        if j < 0:
            return -1
        js = offsets[j]
        if offsets[j + 1] - js == length and same_bytes(buf, js, data, start, length):
            return j
        slot = (slot + np.uint64(1)) & mask


@njit(cache=True, inline="always")
def _mix(key):  # pragma: no cover - numba
    h = np.uint64(key)
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xFF51AFD7ED558CCD)
    h ^= h >> np.uint64(33)
    return h


@njit(cache=True)
def _build_int_map(keys, values, cap):  # pragma: no cover - numba
    """First occurrence of a key wins (std::unordered_map::emplace semantics)."""
    tk = np.full(cap, -1, np.int64)
    tv = np.zeros(cap, np.int64)
    mask = np.uint64(cap - 1)
    for i in range(keys.shape[0]):
        k = keys[i]
        slot = _mix(k) & mask
        while True:
            if tk[slot] == -1:
                tk[slot] = k
                tv[slot] = values[i]
                break
            if tk[slot] == k:
                break
            slot = (slot + np.uint64(1)) & mask
    return tk, tv


def build_int_map(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A map of non-negative int64 keys for :func:`lookup_int`."""
    return _build_int_map(
        keys.astype(np.int64), values.astype(np.int64), _capacity(int(keys.shape[0]))
    )


@njit(cache=True, inline="always")
def lookup_int(tk, tv, key):  # pragma: no cover - numba
    mask = np.uint64(tk.shape[0] - 1)
    slot = _mix(key) & mask
    while True:
        k = tk[slot]
        if k == key:
            return tv[slot]
        if k == -1:
            return -1
        slot = (slot + np.uint64(1)) & mask
