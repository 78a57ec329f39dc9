"""SentencePiece-style BPE (``tokenizer.ggml.model = llama``), as llama.cpp's llm_tokenizer_spm.

The text (spaces already escaped to ``▁``) is split into UTF-8 characters; adjacent symbols
whose concatenation is a vocabulary token are merged, highest score first (leftmost on
ties), until nothing merges. A symbol that is not a token is emitted byte by byte as
``<0xXX>`` tokens. Runs in numba on the UTF-8 bytes.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ._hashtab import build_bytes_table, lookup_bytes
from .errors import TokenizerError
from .vocab import Vocab


class SPMModel:
    """Lookup tables for one vocabulary."""

    def __init__(self, vocab: Vocab, token_bytes: list[bytes]) -> None:
        self.table, self.buf, self.offsets = build_bytes_table(token_bytes)
        self.scores = vocab.scores.astype(np.float64)
        self.byte_tokens = byte_fallback_table(vocab)

    def encode(self, data: bytes) -> list[int]:
        return self.encode_many([data])[0]

    def encode_many(self, chunks: list[bytes]) -> list[list[int]]:
        """Each chunk (spaces already escaped) tokenized on its own, in one numba call."""
        if not chunks:
            return []
        lens = np.fromiter(map(len, chunks), dtype=np.int64, count=len(chunks))
        offs = np.zeros(len(chunks) + 1, dtype=np.int64)
        np.cumsum(lens, out=offs[1:])
        data = np.frombuffer(b"".join(chunks), dtype=np.uint8)
        out, out_off, bad = _spm_encode_many(
            data, offs, self.table, self.buf, self.offsets, self.scores, self.byte_tokens
        )
        if bad >= 0:
            raise TokenizerError(f"no token for byte 0x{bad:02X} (byte fallback)")
        ids = out.tolist()
        bounds = out_off.tolist()
        return [ids[bounds[i] : bounds[i + 1]] for i in range(len(chunks))]


def byte_fallback_table(vocab: Vocab) -> np.ndarray:
    """byte -> token: ``<0xXX>`` if present, else the one-character token (llama.cpp's
    ``byte_to_token`` for SPM/UGM); -1 when neither exists."""
    out = np.full(256, -1, dtype=np.int64)
    t2i = vocab.token_to_id
    for b in range(256):
        tid = t2i.get(f"<0x{b:02X}>")
        if tid is None:
            tid = t2i.get(bytes([b]).decode("utf-8", "surrogateescape"))
        if tid is not None:
            out[b] = tid
    return out


@njit(cache=True, inline="always")
def _utf8_len(b):  # pragma: no cover - numba
    hi = b >> 4
    if hi < 12:
        return 1
    if hi < 14:
        return 2
    if hi == 14:
        return 3
    return 4


@njit(cache=True, inline="always")
def _better(s1, l1, s2, l2):  # pragma: no cover - numba
    """Heap order: higher score first, then smaller left index."""
    return s1 > s2 or (s1 == s2 and l1 < l2)


@njit(cache=True)
def _spm_encode_many(data, offs, table, buf, offsets, scores, byte_tokens):  # pragma: no cover
    n_chunks = offs.shape[0] - 1
    maxlen = 1
    for c in range(n_chunks):
        maxlen = max(maxlen, offs[c + 1] - offs[c])
    start = np.empty(maxlen, np.int64)
    size = np.empty(maxlen, np.int64)
    prev = np.empty(maxlen, np.int64)
    nxt = np.empty(maxlen, np.int64)
    cap = 3 * maxlen + 4
    h_score = np.empty(cap, np.float64)
    h_left = np.empty(cap, np.int64)
    h_right = np.empty(cap, np.int64)
    h_size = np.empty(cap, np.int64)
    out = np.empty(data.shape[0], np.int64)
    out_off = np.zeros(n_chunks + 1, np.int64)
    no = 0
    bad = -1
    for c in range(n_chunks):
        no, b = _spm_chunk(
            data, offs[c], offs[c + 1], table, buf, offsets, scores, byte_tokens,
            start, size, prev, nxt, h_score, h_left, h_right, h_size, out, no,
        )  # fmt: skip
        if b >= 0:
            bad = b
        out_off[c + 1] = no
    return out[:no], out_off, bad


@njit(cache=True)
def _spm_chunk(
    data, c0, c1, table, buf, offsets, scores, byte_tokens,
    start, size, prev, nxt, h_score, h_left, h_right, h_size, out, no,
):  # fmt: skip  # pragma: no cover - numba
    ns = 0
    off = c0
    while off < c1:
        ln = min(_utf8_len(data[off]), c1 - off)
        start[ns] = off
        size[ns] = ln
        prev[ns] = ns - 1
        off += ln
        nxt[ns] = -1 if off == c1 else ns + 1
        ns += 1
    n_tok = scores.shape[0]
    hn = 0

    for i in range(1, ns):
        left = i - 1
        ln = size[left] + size[i]
        tok = lookup_bytes(table, buf, offsets, data, start[left], ln)
        if tok < 0 or tok >= n_tok:
            continue
        j = hn
        hn += 1
        h_score[j] = scores[tok]
        h_left[j] = left
        h_right[j] = i
        h_size[j] = ln
        while j > 0:
            p = (j - 1) >> 1
            if _better(h_score[j], h_left[j], h_score[p], h_left[p]):
                h_score[j], h_score[p] = h_score[p], h_score[j]
                h_left[j], h_left[p] = h_left[p], h_left[j]
                h_right[j], h_right[p] = h_right[p], h_right[j]
                h_size[j], h_size[p] = h_size[p], h_size[j]
                j = p
            else:
                break

    while hn > 0:
        left = h_left[0]
        right = h_right[0]
        bsize = h_size[0]
        # pop
        hn -= 1
        h_score[0] = h_score[hn]
        h_left[0] = h_left[hn]
        h_right[0] = h_right[hn]
        h_size[0] = h_size[hn]
        j = 0
        while True:
            c = 2 * j + 1
            if c >= hn:
                break
            if c + 1 < hn and _better(h_score[c + 1], h_left[c + 1], h_score[c], h_left[c]):
                c += 1
            if _better(h_score[c], h_left[c], h_score[j], h_left[j]):
                h_score[j], h_score[c] = h_score[c], h_score[j]
                h_left[j], h_left[c] = h_left[c], h_left[j]
                h_right[j], h_right[c] = h_right[c], h_right[j]
                h_size[j], h_size[c] = h_size[c], h_size[j]
                j = c
            else:
                break
        if size[left] == 0 or size[right] == 0 or size[left] + size[right] != bsize:
            continue
        size[left] += size[right]
        size[right] = 0
        nxt[left] = nxt[right]
        if nxt[right] >= 0:
            prev[nxt[right]] = left
        # try the new neighbours
        for side in range(2):
            if side == 0:
                a = prev[left]
                b = left
            else:
                a = left
                b = nxt[left]
            if a < 0 or b < 0:
                continue
            ln = size[a] + size[b]
            tok = lookup_bytes(table, buf, offsets, data, start[a], ln)
            if tok < 0 or tok >= n_tok:
                continue
            jj = hn
            hn += 1
            h_score[jj] = scores[tok]
            h_left[jj] = a
            h_right[jj] = b
            h_size[jj] = ln
            while jj > 0:
                p = (jj - 1) >> 1
                if _better(h_score[jj], h_left[jj], h_score[p], h_left[p]):
                    h_score[jj], h_score[p] = h_score[p], h_score[jj]
                    h_left[jj], h_left[p] = h_left[p], h_left[jj]
                    h_right[jj], h_right[p] = h_right[p], h_right[jj]
                    h_size[jj], h_size[p] = h_size[p], h_size[jj]
                    jj = p
                else:
                    break

    bad = -1
    i = 0 if ns > 0 else -1
    while i != -1:
        tok = lookup_bytes(table, buf, offsets, data, start[i], size[i])
        if tok >= 0:
            out[no] = tok
            no += 1
        else:
            for k in range(start[i], start[i] + size[i]):
                bt = byte_tokens[data[k]]
                if bt < 0:
                    bad = data[k]
                else:
                    out[no] = bt
                    no += 1
        i = nxt[i]
    return no, bad
