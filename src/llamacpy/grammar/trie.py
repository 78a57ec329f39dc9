"""A vocabulary as a trie of decoded code points, and the mask walk over it (numba).

Tokens are decoded as llama.cpp's grammar decodes a piece (``decode_utf8`` with no partial
sequence pending) and sorted by their code points, a trailing incomplete UTF-8 sequence
being one extra pseudo code point. Each trie node then covers a contiguous range of sorted
tokens: first those ending at the node, then its descendants'. A mask is a depth-first walk
that carries one grammar state per node and drops a subtree as soon as its state is dead;
when every code point below a node leads its state back to itself (inside a JSON string,
say), the whole range is allowed without walking it.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .kernels import (
    F_LOOP_HI,
    F_TOKEN,
    S_POS,
    SET_FLAGS,
    SET_N,
    SET_OFF,
    SET_POOL,
    TOKEN,
    TOKEN_NOT,
    decode_utf8,
    match_partial,
    match_token,
    state_loops,
    trans,
)

PSEUDO = np.int64(1) << 40  # key of a trailing partial sequence: PSEUDO + (n_remain << 32) + value
SKIP_MIN_TOKENS = 16  # subtrees this large are checked for a self-looping state


@njit(cache=True)
def decode_all(data, off):
    """Code points of every piece: (flat code points, offsets, partial value, n_remain)."""
    n = len(off) - 1
    cps = np.empty(len(data) + 1, np.int64)
    cp_off = np.zeros(n + 1, np.int64)
    pval = np.zeros(n, np.int64)
    prem = np.zeros(n, np.int64)
    k = 0
    for t in range(n):
        m, v, r = decode_utf8(data, off[t], off[t + 1], np.int64(0), np.int64(0), cps[k:])
        k += m
        cp_off[t + 1] = k
        pval[t] = v
        prem[t] = r
    return cps[:k], cp_off, pval, prem


@njit(cache=True)
def build_trie(keys, key_off):
    """Nodes in preorder from sorted keys: (cp, partial value, partial n_remain, end of
    subtree, first / end of tokens ending here, end of subtree tokens, ASCII bitmaps of
    descendants' code points (0-63, 64-127), descendant flags: 1 non-ASCII, 2 partial)."""
    n_tok = len(key_off) - 1
    cap = len(keys) + 1
    cp = np.full(cap, -1, np.int64)
    pval = np.zeros(cap, np.int64)
    prem = np.zeros(cap, np.int64)
    parent = np.full(cap, -1, np.int64)
    term_lo = np.full(cap, -1, np.int64)
    term_hi = np.full(cap, -1, np.int64)
    first = np.zeros(cap, np.int64)
    path = np.zeros(cap + 1, np.int64)
    nn = 1
    prev_lo, prev_hi = 0, 0
    for t in range(n_tok):
        lo, hi = key_off[t], key_off[t + 1]
        lcp = 0
        while lcp < hi - lo and lcp < prev_hi - prev_lo and keys[lo + lcp] == keys[prev_lo + lcp]:
            lcp += 1
        if t == 0:
            lcp = 0
        for d in range(lcp, hi - lo):
            k = keys[lo + d]
            if k >= PSEUDO:
                prem[nn] = (k - PSEUDO) >> 32
                pval[nn] = (k - PSEUDO) & 0xFFFFFFFF
            else:
                cp[nn] = k
            parent[nn] = path[d]
            first[nn] = t
            path[d + 1] = nn
            nn += 1
        node = path[hi - lo]
        if term_lo[node] < 0:
            term_lo[node] = t
        term_hi[node] = t + 1
        prev_lo, prev_hi = lo, hi
    return _finish_trie(nn, cp[:nn], pval[:nn], prem[:nn], parent[:nn], term_lo[:nn],
                        term_hi[:nn], first[:nn], n_tok)  # fmt: skip


@njit(cache=True)
def _finish_trie(nn, cp, pval, prem, parent, term_lo, term_hi, first, n_tok):
    end = np.arange(1, nn + 1).astype(np.int64)
    hi = np.zeros(nn, np.int64)
    sub_lo = np.zeros(nn, np.int64)
    sub_hi = np.zeros(nn, np.int64)
    sub_flags = np.zeros(nn, np.int64)
    for n in range(nn):
        if term_lo[n] < 0:
            term_lo[n] = first[n]
            term_hi[n] = first[n]
        hi[n] = term_hi[n]
    hi[0] = n_tok
    for n in range(nn - 1, 0, -1):
        p = parent[n]
        end[p] = max(end[p], end[n])
        hi[p] = max(hi[p], hi[n])
        c = cp[n]
        if c < 0:
            sub_flags[p] |= 2
        elif c < 64:
            sub_lo[p] |= np.int64(1) << c
        elif c < 128:
            sub_hi[p] |= np.int64(1) << (c - 64)
        else:
            sub_flags[p] |= 1
        sub_lo[p] |= sub_lo[n]
        sub_hi[p] |= sub_hi[n]
        sub_flags[p] |= sub_flags[n]
    return cp, pval, prem, end, term_lo, term_hi, hi, sub_lo, sub_hi, sub_flags


@njit(cache=True)
def _allow(out, sorted_ids, lo, hi):
    for i in range(lo, hi):
        out[sorted_ids[i]] = True


@njit(cache=True)
def _token_tops(et, ev, L, state, out, sorted_ids, where, lo, hi):
    """Stacks topped by a token constraint decide tokens that still have code points left
    on the token id alone (llama.cpp's ``reject_candidates_for_stack``)."""
    off, n = L[SET_OFF][state], L[SET_N][state]
    for i in range(n):
        s = L[SET_POOL][off + i]
        if s == 0:
            continue
        pos = L[S_POS][s]
        if et[pos] == TOKEN:
            w = where[ev[pos]] if 0 <= ev[pos] < len(where) else -1
            if lo <= w < hi:
                out[ev[pos]] = True
        elif et[pos] == TOKEN_NOT:
            for j in range(lo, hi):
                if match_token(et, ev, pos, sorted_ids[j]):
                    out[sorted_ids[j]] = True


@njit(cache=True)
def _partial_ok(et, ev, L, state, value, n_remain):
    off, n = L[SET_OFF][state], L[SET_N][state]
    for i in range(n):
        s = L[SET_POOL][off + i]
        if s == 0:
            continue
        pos = L[S_POS][s]
        if et[pos] != TOKEN and et[pos] != TOKEN_NOT and match_partial(et, ev, pos, value, n_remain):
            return True
    return False


@njit(cache=True)
def _loops_over(et, ev, rs, L, D, L64, state, sub_lo, sub_hi, sub_flags, n):
    """Does every code point below node ``n`` lead ``state`` back to itself."""
    if sub_flags[n] & 2:
        return False
    flags = state_loops(et, ev, rs, L, D, L64, state)
    if (sub_flags[n] & 1) and not (flags & F_LOOP_HI):
        return False
    return (sub_lo[n] & ~L64[2 * state]) == 0 and (sub_hi[n] & ~L64[2 * state + 1]) == 0


@njit(cache=True)
def mask_walk(et, ev, rs, L, D, L64, state, trie, sorted_ids, where, out):
    """Set ``out[token]`` for every trie token the grammar state allows."""
    cp, pval, prem, end, term_lo, term_hi, hi, sub_lo, sub_hi, sub_flags = trie
    todo_n = [np.int64(0)]
    todo_s = [np.int64(state)]
    while len(todo_n) > 0:
        n = todo_n.pop()
        s = todo_s.pop()
        _allow(out, sorted_ids, term_lo[n], term_hi[n])
        flags = L[SET_FLAGS][s]
        if flags & F_TOKEN:
            _token_tops(et, ev, L, s, out, sorted_ids, where, term_hi[n], hi[n])
        elif hi[n] - term_hi[n] >= SKIP_MIN_TOKENS and _loops_over(
            et, ev, rs, L, D, L64, s, sub_lo, sub_hi, sub_flags, n
        ):
            _allow(out, sorted_ids, term_hi[n], hi[n])
            continue
        c = n + 1
        while c < end[n]:
            if cp[c] < 0:
                if _partial_ok(et, ev, L, s, pval[c], prem[c]):
                    _allow(out, sorted_ids, term_lo[c], term_hi[c])
            else:
                s2 = trans(et, ev, rs, L, D, L64, s, cp[c])
                if s2 != 0:
                    todo_n.append(c)
                    todo_s.append(s2)
            c = end[c]
