"""The grammar's pushdown stacks in numba, with llama.cpp's matching semantics.

A stack (llama.cpp's ``llama_grammar_stack``, a vector of element positions) is an interned
cons cell ``(top position, parent stack id)``: id 0 is the empty stack (the grammar may end),
equal stacks have equal ids, push and pop are O(1). A state is an interned, sorted set of
stack ids (id 0: no stack left, a dead state). Everything is memoized as it is met:

- ``next`` of a stack: the stacks after its top terminal matched (llama.cpp's
  ``advance_stack`` of the popped stack with the element after the terminal pushed);
- ``trans(state, code point)``: the union of ``next`` over the stacks whose top character
  class matches (the code point does not change *where* a match leads, only *whether*);
- per state, the ASCII code points (and all of non-ASCII) that lead back to the same state.

The store is a typed list of int32 lists (``L``), one of int64 (``L64``) and a typed list of
dicts (``D``), indexed by the constants below.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.typed import Dict, List

# element types (parser.py)
END, ALT, RULE_REF, CHAR, CHAR_NOT, CHAR_RNG_UPPER, CHAR_ALT, CHAR_ANY, TOKEN, TOKEN_NOT = range(10)

# L: int32 lists
S_POS, S_PARENT, S_NEXT_OFF, S_NEXT_N, S_NEXT_POOL = 0, 1, 2, 3, 4
SET_OFF, SET_N, SET_POOL, SET_TRANS, SET_FLAGS = 5, 6, 7, 8, 9
N_LISTS = 10
# D: dicts int64 -> int32
D_STACKS, D_SETS, D_TRANS_HI = 0, 1, 2
N_DICTS = 3
# state flags
F_EMPTY, F_TOKEN, F_LOOPS, F_LOOP_HI, F_LOOP_R, F_UNIFORM = 1, 2, 4, 8, 16, 32
# R: printable ASCII but '"' and backslash (code points 0-63 / 64-127), and all non-ASCII
R_LO = np.int64(((1 << 64) - (1 << 32) - (1 << 34)) - (1 << 64))  # 0x20-0x3F less '"'
R_HI = np.int64((1 << 63) - 1 - (1 << 28))  # 0x40-0x7E less backslash

MAX_STACKS_PER_STATE = 20_000
MAX_ADVANCE_STEPS = 2_000_000
UNKNOWN = -2
HI_ALL = 0x1FFFFF  # the largest code point llama.cpp's decoder can produce


_LIST_I64 = types.ListType(types.int64)
_DICT_I64 = types.DictType(types.int64, types.int64)


@njit(cache=True)
def new_store():
    """An empty store with the empty stack (id 0) and the dead state (id 0). Built here,
    not in Python: numba compiles the typed containers' Python-side helpers (make, append,
    getitem) anew in every process, ~3 s of each run with a grammar."""
    lists = List.empty_list(_LIST_I64)
    for _ in range(N_LISTS):
        lists.append(List.empty_list(types.int64))
    dicts = List.empty_list(_DICT_I64)
    for _ in range(N_DICTS):
        dicts.append(Dict.empty(types.int64, types.int64))
    l64 = List.empty_list(types.int64)
    lists[S_POS].append(-1)
    lists[S_PARENT].append(-1)
    lists[S_NEXT_OFF].append(0)
    lists[S_NEXT_N].append(0)
    lists[SET_OFF].append(0)
    lists[SET_N].append(0)
    lists[SET_FLAGS].append(F_LOOPS)
    for _ in range(128):
        lists[SET_TRANS].append(0)
    l64.append(0)
    l64.append(0)
    return lists, dicts, l64


@njit(cache=True)
def state_flags(lists, state):
    """A state's flags (read from Python without numba's per-process typed-list helpers)."""
    return lists[SET_FLAGS][state]


@njit(cache=True)
def is_end(et, p):
    return et[p] == END or et[p] == ALT


@njit(cache=True)
def intern_stack(L, D, pos, parent):
    key = (np.int64(pos) << 32) | np.int64(parent)
    m = D[D_STACKS]
    if key in m:
        return m[key]
    sid = np.int64(len(L[S_POS]))
    L[S_POS].append(pos)
    L[S_PARENT].append(parent)
    L[S_NEXT_OFF].append(-1)
    L[S_NEXT_N].append(0)
    D[D_STACKS][key] = sid
    return sid


@njit(cache=True)
def advance(et, ev, rs, L, D, start):
    """Stacks reachable from ``start`` whose top is a terminal (or the empty stack)."""
    out = [np.int64(0)][:0]
    todo = [np.int64(start)]
    seen = {np.int64(0)}
    seen.clear()
    steps = 0
    while len(todo) > 0:
        cur = todo.pop()
        if cur in seen:
            continue
        seen.add(cur)
        steps += 1
        if steps > MAX_ADVANCE_STEPS:
            raise ValueError("the grammar expands to too many stacks at one position")
        if cur == 0:
            out.append(cur)
            continue
        pos = L[S_POS][cur]
        if et[pos] != RULE_REF:
            out.append(cur)
            continue
        base = L[S_PARENT][cur]
        if not is_end(et, pos + 1):
            base = intern_stack(L, D, pos + 1, base)
        sub = rs[ev[pos]]
        while True:
            nxt = base
            if not is_end(et, sub):
                nxt = intern_stack(L, D, sub, base)
            todo.append(nxt)
            while not is_end(et, sub):
                sub += 1
            if et[sub] == ALT:
                sub += 1
            else:
                break
    return out


@njit(cache=True)
def after_terminal(et, pos):
    """The element after the terminal at ``pos`` (a char class spans several elements)."""
    if et[pos] == TOKEN or et[pos] == TOKEN_NOT:
        return pos + 1
    while True:
        if et[pos + 1] == CHAR_RNG_UPPER:
            pos += 2
        else:
            pos += 1
        if et[pos] != CHAR_ALT:
            return pos


@njit(cache=True)
def stack_next(et, ev, rs, L, D, s):
    """(offset, count) in the next-pool of the stacks after stack ``s``'s top matched."""
    off = L[S_NEXT_OFF][s]
    if off >= 0:
        return off, L[S_NEXT_N][s]
    pos = L[S_POS][s]
    after = after_terminal(et, pos)
    base = L[S_PARENT][s]
    if not is_end(et, after):
        base = intern_stack(L, D, after, base)
    out = advance(et, ev, rs, L, D, base)
    pool = L[S_NEXT_POOL]
    off = len(pool)
    for x in out:
        pool.append(x)
    L[S_NEXT_OFF][s] = off
    L[S_NEXT_N][s] = len(out)
    return off, len(out)


@njit(cache=True)
def match_char(et, ev, pos, c):
    """``llama_grammar_match_char``: does code point ``c`` satisfy the class at ``pos``."""
    positive = et[pos] == CHAR or et[pos] == CHAR_ANY
    found = False
    while True:
        if et[pos + 1] == CHAR_RNG_UPPER:
            found = found or (ev[pos] <= c and c <= ev[pos + 1])
            pos += 2
        elif et[pos] == CHAR_ANY:
            found = True
            pos += 1
        else:
            found = found or ev[pos] == c
            pos += 1
        if et[pos] != CHAR_ALT:
            break
    return found == positive


@njit(cache=True)
def match_partial(et, ev, pos, value, n_remain):
    """``llama_grammar_match_partial_char``: can the partial UTF-8 sequence complete to a
    code point the class at ``pos`` accepts."""
    positive = et[pos] == CHAR or et[pos] == CHAR_ANY
    if n_remain < 0 or (n_remain == 1 and value < 2):
        return False
    low = np.int64(value) << (n_remain * 6)
    high = low | ((np.int64(1) << (n_remain * 6)) - 1)
    if low == 0:
        if n_remain == 2:
            low = np.int64(1) << 11
        elif n_remain == 3:
            low = np.int64(1) << 16
    while True:
        if et[pos + 1] == CHAR_RNG_UPPER:
            if ev[pos] <= high and low <= ev[pos + 1]:
                return positive
            pos += 2
        elif et[pos] == CHAR_ANY:
            return True
        else:
            if low <= ev[pos] and ev[pos] <= high:
                return positive
            pos += 1
        if et[pos] != CHAR_ALT:
            break
    return not positive


@njit(cache=True)
def match_token(et, ev, pos, token):
    if et[pos] == TOKEN:
        return ev[pos] == token
    return ev[pos] != token


@njit(cache=True)
def intern_state(et, L, D, L64, items):
    """The id of the state holding the sorted, distinct stack ids ``items``."""
    n = len(items)
    if n == 0:
        return 0
    if n > MAX_STACKS_PER_STATE:
        raise ValueError("the grammar is too ambiguous: too many parse stacks at one position")
    h = np.uint64(14695981039346656037)
    for x in items:
        h = (h ^ np.uint64(x)) * np.uint64(1099511628211)
    key = np.int64(h >> np.uint64(1))
    pool = L[SET_POOL]
    while key in D[D_SETS]:
        sid = D[D_SETS][key]
        off = L[SET_OFF][sid]
        if L[SET_N][sid] == n:
            same = True
            for i in range(n):
                if pool[off + i] != items[i]:
                    same = False
                    break
            if same:
                return sid
        key += 1
    sid = np.int64(len(L[SET_OFF]))
    D[D_SETS][key] = sid
    L[SET_OFF].append(len(pool))
    L[SET_N].append(n)
    flags = 0
    for x in items:
        pool.append(x)
        if x == 0:
            flags |= F_EMPTY
        else:
            t = et[L[S_POS][x]]
            if t == TOKEN or t == TOKEN_NOT:  # noqa: SIM109 (numba)
                flags |= F_TOKEN
    L[SET_FLAGS].append(flags)
    for _ in range(128):
        L[SET_TRANS].append(UNKNOWN)
    L64.append(0)
    L64.append(0)
    return sid


@njit(cache=True)
def trans(et, ev, rs, L, D, L64, state, c):
    """The state after code point ``c`` (0: no stack accepts it)."""
    if c < 128:
        v = L[SET_TRANS][state * 128 + c]
        if v != UNKNOWN:
            return v
    else:
        key = (np.int64(state) << 32) | np.int64(c)
        if key in D[D_TRANS_HI]:
            return D[D_TRANS_HI][key]
    acc = [np.int64(0)][:0]
    off, n = L[SET_OFF][state], L[SET_N][state]
    for i in range(n):
        s = L[SET_POOL][off + i]
        if s == 0:
            continue
        pos = L[S_POS][s]
        if et[pos] == TOKEN or et[pos] == TOKEN_NOT:
            continue
        if match_char(et, ev, pos, c):
            o, k = stack_next(et, ev, rs, L, D, s)
            for j in range(k):
                acc.append(L[S_NEXT_POOL][o + j])
    v = np.int64(0)
    if len(acc) > 0:
        v = intern_state(et, L, D, L64, np.unique(np.array(acc, np.int64)))
    if c < 128:
        L[SET_TRANS][state * 128 + c] = v
    else:
        D[D_TRANS_HI][(np.int64(state) << 32) | np.int64(c)] = v
    return v


@njit(cache=True)
def _uniform_hi(et, ev, pos):
    """Does the class at ``pos`` treat every non-ASCII code point alike."""
    while True:
        lo = ev[pos]
        hi = lo
        if et[pos + 1] == CHAR_RNG_UPPER:
            hi = ev[pos + 1]
        if et[pos] == CHAR_ANY:
            return True
        if hi >= 128 and not (lo <= 128 and hi >= HI_ALL):
            return False
        pos += 2 if et[pos + 1] == CHAR_RNG_UPPER else 1
        if et[pos] != CHAR_ALT:
            return True


@njit(cache=True)
def state_loops(et, ev, rs, L, D, L64, state):
    """Flags of ``state`` with its self-loops computed: L64[2 * state] / [2 * state + 1] are
    the ASCII code points 0-63 / 64-127 that lead back to it; F_LOOP_HI: so do all others;
    F_LOOP_R: so do all of R; F_UNIFORM: all non-ASCII code points lead to one state."""
    flags = L[SET_FLAGS][state]
    if flags & F_LOOPS:
        return flags
    lo = np.int64(0)
    hi = np.int64(0)
    for c in range(128):
        if trans(et, ev, rs, L, D, L64, state, c) == state:
            if c < 64:
                lo |= np.int64(1) << c
            else:
                hi |= np.int64(1) << (c - 64)
    uniform = True
    off, n = L[SET_OFF][state], L[SET_N][state]
    for i in range(n):
        s = L[SET_POOL][off + i]
        if s != 0:
            pos = L[S_POS][s]
            if et[pos] != TOKEN and et[pos] != TOKEN_NOT and not _uniform_hi(et, ev, pos):
                uniform = False
    flags |= F_LOOPS
    if uniform:
        flags |= F_UNIFORM  # every non-ASCII code point leads where 0x80 leads
    if uniform and trans(et, ev, rs, L, D, L64, state, 0x80) == state:
        flags |= F_LOOP_HI
        if (lo & R_LO) == R_LO and (hi & R_HI) == R_HI:
            flags |= F_LOOP_R
    L[SET_FLAGS][state] = flags
    L64[2 * state] = lo
    L64[2 * state + 1] = hi
    return flags


@njit(cache=True)
def initial_state(et, ev, rs, L, D, L64, start_pos):
    """The stacks at the start (``llama_grammar_init_impl``: one per alternative of the
    start rule), from the element at ``start_pos``: a reference to the start rule."""
    first = advance(et, ev, rs, L, D, intern_stack(L, D, start_pos, 0))
    return intern_state(et, L, D, L64, np.unique(np.array(first, np.int64)))


@njit(cache=True)
def decode_utf8(data, start, end, value, n_remain, out):
    """llama.cpp's ``decode_utf8(piece, partial_start)``: code points into ``out``; returns
    (count, value, n_remain) of the partial sequence left (n_remain -1: invalid)."""
    lookup = (1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 2, 2, 3, 4)
    pos = start
    n = 0
    while pos < end and n_remain > 0:
        b = np.int64(data[pos])
        if (b >> 6) != 2:
            return 0, 0, -1
        value = (value << 6) + (b & 0x3F)
        pos += 1
        n_remain -= 1
    if n_remain == 0 and pos > start:
        out[n] = value
        n += 1
    while pos < end:
        b = np.int64(data[pos])
        n_remain = lookup[b >> 4] - 1
        if n_remain < 0:
            return 0, 0, -1
        value = b & ((1 << (7 - n_remain)) - 1)
        pos += 1
        while pos < end and n_remain > 0:
            value = (value << 6) + (np.int64(data[pos]) & 0x3F)
            pos += 1
            n_remain -= 1
        if n_remain == 0:
            out[n] = value
            n += 1
    return n, value, n_remain


@njit(cache=True)
def state_stacks(et, L, state, pred_token):
    """Stacks of ``state`` whose top is a token constraint (or a character class)."""
    out = [np.int64(0)][:0]
    off, n = L[SET_OFF][state], L[SET_N][state]
    for i in range(n):
        s = L[SET_POOL][off + i]
        if s == 0:
            continue
        t = et[L[S_POS][s]]
        if (t == TOKEN or t == TOKEN_NOT) == pred_token:  # noqa: SIM109 (numba)
            out.append(s)
    return out


@njit(cache=True)
def partial_end_ok(et, ev, L, state, value, n_remain):
    """A piece fully walked into ``state``: accepted unless it ends in a partial sequence
    no character class at the top of a stack can complete."""
    if n_remain == 0:
        return state != 0
    for s in state_stacks(et, L, state, False):
        if match_partial(et, ev, L[S_POS][s], value, n_remain):
            return True
    return False


@njit(cache=True)
def token_allowed(et, ev, rs, L, D, L64, state, value, n_remain, data, lo, hi, token, buf):
    """Would llama.cpp's grammar keep ``token`` (its piece ``data[lo:hi]``) in ``state``
    with the partial UTF-8 sequence (value, n_remain) pending."""
    n, v2, r2 = decode_utf8(data, lo, hi, np.int64(value), np.int64(n_remain), buf)
    if n == 0:
        if r2 < 0:
            return False
        return partial_end_ok(et, ev, L, state, v2, r2)
    cur = state
    for i in range(n):
        for s in state_stacks(et, L, cur, True):
            if match_token(et, ev, L[S_POS][s], token):
                return True
        cur = trans(et, ev, rs, L, D, L64, cur, buf[i])
        if cur == 0:
            return False
    return partial_end_ok(et, ev, L, cur, v2, r2)


@njit(cache=True)
def accept_token(et, ev, rs, L, D, L64, state, value, n_remain, data, lo, hi, token, buf):
    """``llama_grammar_accept_token``: (new state, value, n_remain); state 0 if rejected."""
    n, v2, r2 = decode_utf8(data, lo, hi, np.int64(value), np.int64(n_remain), buf)
    acc = [np.int64(0)][:0]
    for s in state_stacks(et, L, state, True):
        if match_token(et, ev, L[S_POS][s], token):
            o, k = stack_next(et, ev, rs, L, D, s)
            for j in range(k):
                acc.append(L[S_NEXT_POOL][o + j])
    if n == 0:
        for s in state_stacks(et, L, state, False):
            acc.append(s)
    else:
        cur = state
        for i in range(n):
            cur = trans(et, ev, rs, L, D, L64, cur, buf[i])
            if cur == 0:
                break
        off, k = L[SET_OFF][cur], L[SET_N][cur]
        for j in range(k):
            acc.append(L[SET_POOL][off + j])
    if len(acc) == 0:
        return 0, v2, r2
    return intern_state(et, L, D, L64, np.unique(np.array(acc, np.int64))), v2, r2


@njit(cache=True)
def allowed_all(et, ev, rs, L, D, L64, state, value, n_remain, data, off, excluded, out):
    """``token_allowed`` for every token not ``excluded`` (the path when a partial UTF-8
    sequence is pending, where the trie's decoding does not apply)."""
    buf = np.empty(len(data) + 1, np.int64)
    for t in range(len(off) - 1):
        if not excluded[t]:
            out[t] = token_allowed(et, ev, rs, L, D, L64, state, value, n_remain, data,
                                   off[t], off[t + 1], t, buf)  # fmt: skip
