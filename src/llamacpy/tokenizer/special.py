"""Splitting text at special tokens, as llama.cpp's ``tokenizer_st_partition`` does.

llama.cpp walks its special tokens longest first; each one splits every remaining text
fragment at its leftmost non-overlapping occurrences (dropping whitespace next to it when
the token has the lstrip/rstrip attribute). The result is the same as marking, token by
token, every occurrence that does not overlap an earlier claim, which is what the numba
kernels below do on the UTF-8 bytes. Only the tokens that occur in the text at all (found
with a byte trie) take part, so a vocabulary with thousands of special tokens costs one
pass over the text.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .vocab import ATTR_CONTROL, ATTR_LSTRIP, ATTR_RSTRIP, ATTR_UNKNOWN, Vocab


class SpecialTokens:
    """The vocabulary's special tokens, ready for partitioning."""

    def __init__(self, vocab: Vocab) -> None:
        ids = vocab.special_tokens
        self.ids = np.asarray(ids, dtype=np.int64)
        texts = [vocab.tokens[i].encode("utf-8", "surrogateescape") for i in ids]
        self.lengths = np.asarray([len(t) for t in texts], dtype=np.int64)
        self.offsets = np.zeros(len(texts) + 1, dtype=np.int64)
        np.cumsum(self.lengths, out=self.offsets[1:])
        self.buf = (
            np.frombuffer(b"".join(texts), dtype=np.uint8) if texts else np.zeros(0, np.uint8)
        )
        attrs = vocab.attrs[self.ids] if len(ids) else np.zeros(0, np.int32)
        self.control = (attrs & (ATTR_CONTROL | ATTR_UNKNOWN)) != 0
        self.lstrip = (attrs & ATTR_LSTRIP) != 0
        self.rstrip = (attrs & ATTR_RSTRIP) != 0
        self._trie = _build_trie(texts)

    def partition(self, data: bytes, parse_special: bool) -> list[tuple[int, int, int]]:
        """Segments of ``data`` in order: ``(start, end, -1)`` for text, ``(0, 0, id)`` for a
        special token."""
        n = len(data)
        if n == 0:
            return []
        if self.ids.shape[0] == 0:
            return [(0, n, -1)]
        arr = np.frombuffer(data, dtype=np.uint8)
        edge_start, edge_byte, edge_target, node_token = self._trie
        present = _present(arr, edge_start, edge_byte, edge_target, node_token, self.ids.shape[0])
        allowed = present if parse_special else present & ~self.control
        order = np.nonzero(allowed)[0].astype(np.int64)
        if order.shape[0] == 0:
            return [(0, n, -1)]
        starts, ends, toks = _partition(
            arr, order, self.buf, self.offsets, self.lstrip, self.rstrip, self.ids
        )
        return list(zip(starts.tolist(), ends.tolist(), toks.tolist(), strict=True))


def _build_trie(texts: list[bytes]) -> tuple[np.ndarray, ...]:
    """A byte trie as CSR arrays: children of node v are edges edge_start[v]..edge_start[v+1]."""
    children: list[dict[int, int]] = [{}]
    token_at: list[int] = [-1]
    for k, text in enumerate(texts):
        node = 0
        for b in text:
            nxt = children[node].get(b)
            if nxt is None:
                nxt = len(children)
                children[node][b] = nxt
                children.append({})
                token_at.append(-1)
            node = nxt
        if token_at[node] == -1:
            token_at[node] = k
    n = len(children)
    edge_start = np.zeros(n + 1, dtype=np.int64)
    edge_start[1:] = np.cumsum([len(c) for c in children])
    edge_byte = np.zeros(edge_start[-1], dtype=np.uint8)
    edge_target = np.zeros(edge_start[-1], dtype=np.int64)
    for v, c in enumerate(children):
        for j, (b, t) in enumerate(sorted(c.items())):
            edge_byte[edge_start[v] + j] = b
            edge_target[edge_start[v] + j] = t
    return edge_start, edge_byte, edge_target, np.asarray(token_at, dtype=np.int64)


@njit(cache=True)
def _present(data, edge_start, edge_byte, edge_target, node_token, n_tokens):  # pragma: no cover
    """Which tokens (by index in parse order) occur anywhere in ``data``."""
    present = np.zeros(n_tokens, np.bool_)
    n = data.shape[0]
    # first bytes that start any token
    first = np.zeros(256, np.bool_)
    for e in range(edge_start[0], edge_start[1]):
        first[edge_byte[e]] = True
    for p in range(n):
        if not first[data[p]]:
            continue
        node = 0
        q = p
        while q < n:
            b = data[q]
            nxt = -1
            for e in range(edge_start[node], edge_start[node + 1]):
                if edge_byte[e] == b:
                    nxt = edge_target[e]
                    break
            if nxt < 0:
                break
            node = nxt
            if node_token[node] >= 0:
                present[node_token[node]] = True
            q += 1
    return present


@njit(cache=True, inline="always")
def _isspace(b):  # pragma: no cover - numba
    return b == 32 or (9 <= b <= 13)


@njit(cache=True)
def _partition(data, order, buf, offsets, lstrip, rstrip, ids):  # pragma: no cover - numba
    n = data.shape[0]
    claimed = np.zeros(n, np.bool_)
    m_start = np.empty(n, np.int64)
    m_tok = np.empty(n, np.int64)
    n_match = 0
    for k in order:
        t0 = offsets[k]
        tl = offsets[k + 1] - t0
        b0 = buf[t0]
        pos = 0
        while pos + tl <= n:
            if data[pos] != b0:
                pos += 1
                continue
            ok = True
            for j in range(tl):
                if data[pos + j] != buf[t0 + j] or claimed[pos + j]:
                    ok = False
                    break
            if not ok:
                pos += 1
                continue
            for j in range(tl):
                claimed[pos + j] = True
            m_start[n_match] = pos
            m_tok[n_match] = ids[k]
            n_match += 1
            if lstrip[k]:
                q = pos - 1
                while q >= 0 and not claimed[q] and _isspace(data[q]):
                    claimed[q] = True
                    q -= 1
            if rstrip[k]:
                q = pos + tl
                while q < n and not claimed[q] and _isspace(data[q]):
                    claimed[q] = True
                    q += 1
            pos += tl
    # matches in text order
    idx = np.argsort(m_start[:n_match], kind="mergesort")
    starts = np.empty(2 * n_match + 1, np.int64)
    ends = np.empty(2 * n_match + 1, np.int64)
    toks = np.empty(2 * n_match + 1, np.int64)
    n_seg = 0
    mi = 0
    p = 0
    while p < n:
        if claimed[p]:
            if mi < n_match and m_start[idx[mi]] == p:
                k_tok = m_tok[idx[mi]]
                starts[n_seg] = 0
                ends[n_seg] = 0
                toks[n_seg] = k_tok
                n_seg += 1
                mi += 1
            p += 1
            continue
        q = p
        while q < n and not claimed[q]:
            q += 1
        starts[n_seg] = p
        ends[n_seg] = q
        toks[n_seg] = -1
        n_seg += 1
        p = q
    return starts[:n_seg], ends[:n_seg], toks[:n_seg]
