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
    F_LOOP_R,
    F_TOKEN,
    F_UNIFORM,
    R_HI,
    R_LO,
    S_POS,
    SET_FLAGS,
    TOKEN,
    decode_utf8,
    match_token,
    partial_end_ok,
    state_loops,
    state_stacks,
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
    run_end, run_hi, hi_end = _clean_runs(nn, cp, parent, end, hi, sub_lo, sub_hi, sub_flags)
    return (cp, pval, prem, end, term_lo, term_hi, hi, sub_lo, sub_hi, sub_flags, run_end, run_hi,
            hi_end)  # fmt: skip


@njit(cache=True)
def _clean_runs(nn, cp, parent, end, hi, sub_lo, sub_hi, sub_flags):
    """Runs of siblings whose code points, their own and below, are all in ``R`` (printable
    ASCII but ``"`` and backslash, and all non-ASCII: what a JSON string or ``.`` takes):
    ``run_end[c]`` is the node after the run starting at ``c`` and ``run_hi[c]`` the end of
    its tokens; -1 where ``c`` is not clean. A state that loops on all of ``R`` allows a
    whole run at once. ``hi_end[c]``: the node after the non-ASCII siblings from ``c`` on
    (skipped at once by a state no non-ASCII code point continues)."""
    run_end = np.full(nn, -1, np.int64)
    run_hi = np.full(nn, -1, np.int64)
    hi_end = np.full(nn, -1, np.int64)
    for n in range(nn - 1, 0, -1):
        c = cp[n]
        if c >= 128:
            nxt = end[n]
            hi_end[n] = hi_end[nxt] if nxt < end[parent[n]] and cp[nxt] >= 128 else nxt
        own = c >= 128 or (c >= 64 and (R_HI >> (c - 64)) & 1) or (0 <= c < 64 and (R_LO >> c) & 1)
        if not own or (sub_flags[n] & 2) or (sub_lo[n] & ~R_LO) or (sub_hi[n] & ~R_HI):
            continue
        nxt = end[n]
        if nxt < end[parent[n]] and run_end[nxt] >= 0:
            run_end[n], run_hi[n] = run_end[nxt], run_hi[nxt]
        else:
            run_end[n], run_hi[n] = end[n], hi[n]
    return run_end, run_hi, hi_end


@njit(cache=True)
def _allow(out, sorted_ids, lo, hi):
    for i in range(lo, hi):
        out[sorted_ids[i]] = True


@njit(cache=True)
def _token_tops(et, ev, L, state, out, sorted_ids, where, lo, hi):
    """Stacks topped by a token constraint decide tokens that still have code points left
    on the token id alone (llama.cpp's ``reject_candidates_for_stack``)."""
    for s in state_stacks(et, L, state, True):
        pos = L[S_POS][s]
        if et[pos] == TOKEN:
            w = where[ev[pos]] if 0 <= ev[pos] < len(where) else -1
            if lo <= w < hi:
                out[ev[pos]] = True
        else:
            for j in range(lo, hi):
                if match_token(et, ev, pos, sorted_ids[j]):
                    out[sorted_ids[j]] = True


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
    cp, pval, prem, end, term_lo, term_hi, hi, sub_lo, sub_hi, sub_flags = trie[:10]
    run_end, run_hi, hi_end = trie[10:]
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
        loop_r, s_hi = False, np.int64(-1)
        if not (flags & F_TOKEN) and hi[n] - term_hi[n] >= SKIP_MIN_TOKENS:
            flags = state_loops(et, ev, rs, L, D, L64, s)
            loop_r = (flags & F_LOOP_R) != 0
            if flags & F_UNIFORM:
                s_hi = trans(et, ev, rs, L, D, L64, s, 0x80)
        c = n + 1
        while c < end[n]:
            if loop_r and run_end[c] >= 0:
                _allow(out, sorted_ids, term_lo[c], run_hi[c])
                c = run_end[c]
                continue
            if s_hi == 0 and cp[c] >= 128:
                c = hi_end[c]
                continue
            if cp[c] < 0:
                if partial_end_ok(et, ev, L, s, pval[c], prem[c]):
                    _allow(out, sorted_ids, term_lo[c], term_hi[c])
            else:
                s2 = s_hi if s_hi >= 0 and cp[c] >= 128 else trans(et, ev, rs, L, D, L64, s, cp[c])
                if s2 != 0:
                    todo_n.append(c)
                    todo_s.append(s2)
            c = end[c]
