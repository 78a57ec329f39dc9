"""Building the BPE merge table in numba (a vocabulary can have half a million merges).

Every string that takes part in a merge is interned as a symbol id: the tokens keep their
ids, other merge parts get ids from ``n_vocab`` up. Strings are compared as UTF-8 bytes.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ._hashtab import fnv1a, same_bytes

_FNV_PRIME = np.uint64(0x100000001B3)


def join_bytes(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(buffer, offsets) of the UTF-8 (surrogateescape) bytes of ``texts``: text i is
    ``buffer[offsets[i]:offsets[i + 1]]``."""
    if not texts:
        return np.zeros(0, np.uint8), np.zeros(1, np.int64)
    joined = "\x00".join(texts)
    raw = np.frombuffer(joined.encode("utf-8", "surrogateescape"), dtype=np.uint8)
    seps = np.flatnonzero(raw == 0)
    if seps.shape[0] != len(texts) - 1:  # a text holds NUL: encode one by one
        parts = [t.encode("utf-8", "surrogateescape") for t in texts]
        lens = np.fromiter(map(len, parts), dtype=np.int64, count=len(parts))
        offsets = np.zeros(len(parts) + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
        return np.frombuffer(b"".join(parts), dtype=np.uint8), offsets
    keep = np.ones(raw.shape[0], dtype=bool)
    keep[seps] = False
    offsets = np.empty(len(texts) + 1, dtype=np.int64)
    offsets[0] = 0
    offsets[1:-1] = seps - np.arange(seps.shape[0])
    offsets[-1] = raw.shape[0] - seps.shape[0]
    return raw[keep], offsets


@njit(cache=True, inline="always")
def _hash2(buf1, s1, n1, buf2, s2, n2):  # pragma: no cover - numba
    h = fnv1a(buf1, s1, n1)
    for i in range(s2, s2 + n2):
        h = (h ^ np.uint64(buf2[i])) * _FNV_PRIME
    return h


@njit(cache=True, inline="always")
def _lookup_or_add(
    table, arena, str_start, str_len, n_str, buf1, s1, n1, buf2, s2, n2, arena_used
):  # pragma: no cover - numba
    """Symbol id of buf1[s1:s1+n1] + buf2[s2:s2+n2]; added to the arena if new.

    Returns (id, n_str, arena_used)."""
    mask = np.uint64(table.shape[0] - 1)
    slot = _hash2(buf1, s1, n1, buf2, s2, n2) & mask
    total = n1 + n2
    while True:
        j = table[slot]
        if j < 0:
            break
        st = str_start[j]
        if (
            str_len[j] == total
            and same_bytes(arena, st, buf1, s1, n1)
            and same_bytes(arena, st + n1, buf2, s2, n2)
        ):
            return j, n_str, arena_used
        slot = (slot + np.uint64(1)) & mask
    sid = n_str
    str_start[sid] = arena_used
    str_len[sid] = total
    for k in range(n1):
        arena[arena_used + k] = buf1[s1 + k]
    for k in range(n2):
        arena[arena_used + n1 + k] = buf2[s2 + k]
    table[slot] = sid
    return sid, n_str + 1, arena_used + total


@njit(cache=True)
def build_merge_table(tok_buf, tok_off, m_buf, m_off, extra_buf, extra_off):  # pragma: no cover
    """Returns (keys, vals, extra_sids, str_start, str_len, arena, n_str).

    keys[i] = left_sid << 32 | right_sid and vals[i] = rank << 32 | merged_sid for merge i
    (duplicates included; the first one wins when the map is built). ``extra`` strings
    (e.g. the 256 byte characters) are interned too.
    """
    n_tok = tok_off.shape[0] - 1
    n_m = m_off.shape[0] - 1
    n_extra = extra_off.shape[0] - 1
    cap_str = n_tok + 3 * n_m + n_extra + 1
    cap = 16
    while cap < 2 * cap_str:
        cap <<= 1
    table = np.full(cap, -1, np.int64)
    arena = np.empty(tok_buf.shape[0] + 2 * m_buf.shape[0] + extra_buf.shape[0] + 1, np.uint8)
    str_start = np.empty(cap_str, np.int64)
    str_len = np.empty(cap_str, np.int64)
    n_str = 0
    used = 0
    empty = np.zeros(1, np.uint8)
    mask = np.uint64(cap - 1)
    # tokens keep their ids (a repeated text maps to its last id)
    for i in range(n_tok):
        s = tok_off[i]
        n = tok_off[i + 1] - s
        str_start[i] = used
        str_len[i] = n
        for k in range(n):
            arena[used + k] = tok_buf[s + k]
        used += n
        slot = fnv1a(tok_buf, s, n) & mask
        while True:
            j = table[slot]
            if j < 0:
                table[slot] = i
                break
            if str_len[j] == n and same_bytes(arena, str_start[j], tok_buf, s, n):
                table[slot] = i
                break
            slot = (slot + np.uint64(1)) & mask
    n_str = n_tok
    keys = np.empty(n_m, np.int64)
    vals = np.empty(n_m, np.int64)
    for r in range(n_m):
        s = m_off[r]
        e = m_off[r + 1]
        pos = -1
        for k in range(s + 1, e):
            if m_buf[k] == 32:
                pos = k
                break
        if pos < 0:
            a0, an, b0, bn = s, 0, s, 0
        else:
            a0, an, b0, bn = s, pos - s, pos + 1, e - pos - 1
        sa, n_str, used = _lookup_or_add(
            table, arena, str_start, str_len, n_str, m_buf, a0, an, empty, 0, 0, used
        )
        sb, n_str, used = _lookup_or_add(
            table, arena, str_start, str_len, n_str, m_buf, b0, bn, empty, 0, 0, used
        )
        sab, n_str, used = _lookup_or_add(
            table, arena, str_start, str_len, n_str, m_buf, a0, an, m_buf, b0, bn, used
        )
        keys[r] = (sa << 32) | sb
        vals[r] = (np.int64(r) << 32) | sab
    extra_sids = np.empty(n_extra, np.int64)
    for x in range(n_extra):
        s = extra_off[x]
        sid, n_str, used = _lookup_or_add(
            table,
            arena,
            str_start,
            str_len,
            n_str,
            extra_buf,
            s,
            extra_off[x + 1] - s,
            empty,
            0,
            0,
            used,
        )
        extra_sids[x] = sid
    return keys, vals, extra_sids, str_start[:n_str], str_len[:n_str], arena[:used], n_str


@njit(cache=True)
def single_char_symbols(str_start, str_len, arena):  # pragma: no cover - numba
    """(code point, symbol id) of every symbol that is exactly one valid UTF-8 character."""
    n = str_start.shape[0]
    cps = np.empty(n, np.int64)
    ids = np.empty(n, np.int64)
    k = 0
    for i in range(n):
        ln = str_len[i]
        if ln < 1 or ln > 4:
            continue
        s = str_start[i]
        c = np.int64(arena[s])
        if ln == 1:
            if c < 0x80:
                cps[k] = c
                ids[k] = i
                k += 1
            continue
        need = 0
        if (c & 0xE0) == 0xC0:
            need = 2
        elif (c & 0xF0) == 0xE0:
            need = 3
        elif (c & 0xF8) == 0xF0:
            need = 4
        if need != ln:
            continue
        cp = c & (0x1F if ln == 2 else 0x0F if ln == 3 else 0x07)
        ok = True
        for j in range(1, ln):
            b = np.int64(arena[s + j])
            if (b & 0xC0) != 0x80:
                ok = False
                break
            cp = (cp << 6) | (b & 0x3F)
        if ok and cp >= (0x80 if ln == 2 else 0x800 if ln == 3 else 0x10000) and cp <= 0x10FFFF:
            cps[k] = cp
            ids[k] = i
            k += 1
    return cps[:k], ids[:k]
