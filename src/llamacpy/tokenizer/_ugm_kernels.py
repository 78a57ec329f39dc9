"""numba kernels for the Unigram tokenizer: byte tries, SentencePiece normalization (the
precompiled charsmap's XOR-compressed double array) and the Viterbi search. Semantics are
llama.cpp's ``llm_tokenizer_ugm_session`` (see :mod:`.ugm`)."""

from __future__ import annotations

import numpy as np
from numba import njit

from ._hashtab import _mix

# error codes returned by the kernels
ERR_XCDA = 1  # index out of bounds in the XCDA array
ERR_REPL = 2  # replacement offset out of bounds
ERR_UNTERMINATED = 3  # replacement string without NUL


@njit(cache=True, inline="always")
def _find(tk, key):  # pragma: no cover - numba
    mask = np.uint64(tk.shape[0] - 1)
    slot = _mix(key) & mask
    while True:
        k = tk[slot]
        if k == key or k == -1:
            return slot
        slot = (slot + np.uint64(1)) & mask


@njit(cache=True)
def build_trie(buf, offsets, include):  # pragma: no cover - numba
    """A byte trie of the included texts: child of node v by byte b is
    ``tv[slot of key v * 256 + b]``; ``node_val[v]`` is the text's index or -1."""
    total = 1
    for i in range(offsets.shape[0] - 1):
        if include[i]:
            total += offsets[i + 1] - offsets[i]
    cap = 16
    while cap < 2 * total:
        cap <<= 1
    tk = np.full(cap, -1, np.int64)
    tv = np.zeros(cap, np.int64)
    node_val = np.full(total, -1, np.int64)
    n_nodes = 1
    for i in range(offsets.shape[0] - 1):
        if not include[i]:
            continue
        node = 0
        for p in range(offsets[i], offsets[i + 1]):
            key = node * 256 + np.int64(buf[p])
            slot = _find(tk, key)
            if tk[slot] == -1:
                tk[slot] = key
                tv[slot] = n_nodes
                n_nodes += 1
            node = tv[slot]
        node_val[node] = i
    return tk, tv, node_val[:n_nodes]


@njit(cache=True, inline="always")
def _child(tk, tv, node, b):  # pragma: no cover - numba
    slot = _find(tk, node * 256 + np.int64(b))
    return tv[slot] if tk[slot] != -1 else -1


@njit(cache=True, inline="always")
def _cpt_len(data, off, n):  # pragma: no cover - numba
    c = data[off]
    if c < 0x80:
        return 1
    if (c & 0x40) == 0:
        return 0
    if (c & 0x20) == 0:
        need = 2
    elif (c & 0x10) == 0:
        need = 3
    elif (c & 0x08) == 0:
        need = 4
    else:
        return 0
    if off + need - 1 >= n:
        return 0
    for k in range(1, need):
        if (data[off + k] & 0xC0) != 0x80:
            return 0
    return need


@njit(cache=True)
def normalize(
    data, user_tk, user_tv, xcda, repl, escape, prepend, append, merge
):  # pragma: no cover
    """llama.cpp's ``normalize``: returns (bytes, error code)."""
    n = data.shape[0]
    cap = 3 * n + 16
    out = np.empty(cap, np.uint8)
    no = 0
    prepended = False
    in_word = False
    off = 0
    n_x = xcda.shape[0]
    while off < n:
        # user-defined tokens: longest path in their trie (not necessarily a whole token)
        node = 0
        k = off
        while k < n:
            nxt = _child(user_tk, user_tv, node, data[k])
            if nxt < 0:
                break
            node = nxt
            k += 1
        s0 = off
        s_len = k - off
        src = 0  # 0: input, 1: repl, 2: U+FFFD
        used = s_len
        if s_len == 0:
            best_len = 0
            best_off = 0
            if n_x > 0:
                idx = (xcda[0] >> 10) << ((xcda[0] & (1 << 9)) >> 6)
                for p in range(off, n):
                    c = np.int64(data[p])
                    if c == 0:
                        break
                    idx ^= c
                    if idx >= n_x:
                        return out[:0], 1
                    nd = xcda[idx]
                    if (nd & ((1 << 31) | 0xFF)) != c:
                        break
                    leaf = (nd >> 8) & 1
                    idx ^= (nd >> 10) << ((nd & (1 << 9)) >> 6)
                    if leaf:
                        if idx >= n_x:
                            return out[:0], 1
                        best_len = p - off + 1
                        best_off = xcda[idx] & ((1 << 31) - 1)
            if best_len > 0:
                if best_off >= repl.shape[0]:
                    return out[:0], 2
                e = best_off
                while e < repl.shape[0] and repl[e] != 0:
                    e += 1
                if e == repl.shape[0]:
                    return out[:0], 3
                src = 1
                s0 = best_off
                s_len = e - best_off
                used = best_len
            else:
                ln = _cpt_len(data, off, n)
                if ln == 0:
                    src = 2
                    s_len = 3
                    used = 1
                else:
                    s_len = ln
                    used = ln
        if no + 3 * s_len + 6 > cap:
            cap = 2 * cap + 3 * s_len + 6
            bigger = np.empty(cap, np.uint8)
            bigger[:no] = out[:no]
            out = bigger
        for i in range(s_len):
            if src == 0:
                c = data[s0 + i]
            elif src == 1:
                c = repl[s0 + i]
            else:
                c = np.uint8(0xEF) if i == 0 else (np.uint8(0xBF) if i == 1 else np.uint8(0xBD))
            if c != 32:
                if not in_word:
                    in_word = True
                    if (prepend and not prepended) or merge:
                        no = _space(out, no, escape)
                        prepended = True
                out[no] = c
                no += 1
            else:
                in_word = False
                if not merge:
                    no = _space(out, no, escape)
        off += used
    if append:
        if no + 3 > cap:
            bigger = np.empty(cap + 3, np.uint8)
            bigger[:no] = out[:no]
            out = bigger
        no = _space(out, no, escape)
    return out[:no].copy(), 0


@njit(cache=True, inline="always")
def _space(out, no, escape):  # pragma: no cover - numba
    if escape:
        out[no] = 0xE2
        out[no + 1] = 0x96
        out[no + 2] = 0x81
        return no + 3
    out[no] = 32
    return no + 1


@njit(cache=True)
def viterbi(norm, tk, tv, node_val, token_score, unknown_score, unk):  # pragma: no cover
    """Best segmentation of ``norm``; consecutive unknowns merged into one ``unk``."""
    n = norm.shape[0]
    best_tok = np.full(n + 1, unk, np.int64)
    best_from = np.zeros(n + 1, np.int64)
    best_score = np.full(n + 1, -1.7976931348623157e308, np.float64)
    best_score[0] = 0.0
    off = 0
    while off < n:
        b = norm[off]
        hi = b >> 4
        ln = 1 if hi < 12 else (2 if hi < 14 else (3 if hi == 14 else 4))
        n_cp = min(ln, n - off)
        base = best_score[off]
        single = False
        node = 0
        p = off
        while p < n:
            node = _child(tk, tv, node, norm[p])
            if node < 0:
                break
            p += 1
            tid = node_val[node]
            if tid >= 0:
                if p - off == n_cp:
                    single = True
                s = base + token_score[tid]
                if s > best_score[p]:
                    best_tok[p] = tid
                    best_from[p] = off
                    best_score[p] = s
        if not single:
            s = base + unknown_score
            e = off + n_cp
            if s > best_score[e]:
                best_tok[e] = unk
                best_from[e] = off
                best_score[e] = s
        off += n_cp
    out = np.empty(n + 1, np.int64)
    k = 0
    prev_unk = False
    pos = n
    while True:
        tid = best_tok[pos]
        is_unk = tid == unk
        if not (prev_unk and is_unk):
            out[k] = tid
            k += 1
        if best_from[pos] == 0:
            break
        prev_unk = is_unk
        pos = best_from[pos]
    return out[:k][::-1].copy()
