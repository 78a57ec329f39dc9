"""WordPiece (``tokenizer.ggml.model = bert``), as llama.cpp's llm_tokenizer_wpm.

BERT-style normalization (optional lowercasing and accent stripping, splitting on
whitespace, punctuation and CJK characters), then greedy longest-match of ``▁word``
against the vocabulary; a word that cannot be matched completely becomes [UNK].
"""

from __future__ import annotations

import numpy as np
from numba import njit

from . import unicode as uni
from .vocab import Vocab

_PHANTOM = "\u2581".encode()


def preprocess(text: str, lowercase: bool, strip_accents: bool) -> list[bytes]:
    """Normalize and split into words (UTF-8 bytes)."""
    cpts = uni.str_to_cpts(text).astype(np.int64)
    if strip_accents:
        cpts = uni.nfd_first(cpts).astype(np.int64)
    buf, offs = _preprocess(cpts, uni.cpt_flags(), uni.lowercase_table(), lowercase, strip_accents)
    data = buf.tobytes()
    o = offs.tolist()
    return [data[o[i] : o[i + 1]] for i in range(len(o) - 1)]


@njit(cache=True, inline="always")
def _chinese(c):  # pragma: no cover - numba
    return (
        (0x04E00 <= c <= 0x09FFF)
        or (0x03400 <= c <= 0x04DBF)
        or (0x20000 <= c <= 0x2A6DF)
        or (0x2A700 <= c <= 0x2B73F)
        or (0x2B740 <= c <= 0x2B81F)
        or (0x2B920 <= c <= 0x2CEAF)
        or (0x0F900 <= c <= 0x0FAFF)
        or (0x2F800 <= c <= 0x2FA1F)
    )


@njit(cache=True, inline="always")
def _put(out, no, c):  # pragma: no cover - numba
    if c < 0x80:
        out[no] = c
        return no + 1
    if c < 0x800:
        out[no] = 0xC0 | (c >> 6)
        out[no + 1] = 0x80 | (c & 0x3F)
        return no + 2
    if c < 0x10000:
        out[no] = 0xE0 | (c >> 12)
        out[no + 1] = 0x80 | ((c >> 6) & 0x3F)
        out[no + 2] = 0x80 | (c & 0x3F)
        return no + 3
    out[no] = 0xF0 | (c >> 18)
    out[no + 1] = 0x80 | ((c >> 12) & 0x3F)
    out[no + 2] = 0x80 | ((c >> 6) & 0x3F)
    out[no + 3] = 0x80 | (c & 0x3F)
    return no + 4


@njit(cache=True)
def _preprocess(cpts, flags_tab, lower, lowercase, strip_accents):  # pragma: no cover - numba
    """llama.cpp's WPM ``preprocess``: words as UTF-8 (buffer, word offsets)."""
    n = cpts.shape[0]
    out = np.empty(4 * n + 4, np.uint8)
    offs = np.empty(2 * n + 2, np.int64)
    no = 0
    nw = 0
    offs[0] = 0
    word_start = 0
    for i in range(n):
        c = cpts[i]
        f = np.int64(flags_tab[c]) if c < flags_tab.shape[0] else np.int64(1)
        if f & 0x0100:  # whitespace: finish the current word
            if no > word_start:
                nw += 1
                offs[nw] = no
                word_start = no
            continue
        if c == 0 or c == 0xFFFD or (f & 0x0080):  # control
            continue
        if strip_accents and (f & 0x0010):
            continue
        cc = np.int64(lower[c]) if lowercase and c < lower.shape[0] else c
        if (f & 0x0020) or (c < 0x7F and (f & 0x0040)) or _chinese(c):
            if no > word_start:
                nw += 1
                offs[nw] = no
                word_start = no
            no = _put(out, no, cc)
            nw += 1
            offs[nw] = no
            word_start = no
        else:
            no = _put(out, no, cc)
    if no > word_start:
        nw += 1
        offs[nw] = no
    return out[:no].copy(), offs[: nw + 1].copy()


class WPMModel:
    def __init__(self, vocab: Vocab, token_bytes: list[bytes]) -> None:
        self.vocab = vocab
        self.lookup = {b: i for i, b in enumerate(token_bytes)}
        self.max_len = vocab.max_token_len
        self.unk = vocab.id("unk")

    def encode(self, text: str, out: list[int]) -> None:
        lookup = self.lookup
        for word in preprocess(text, self.vocab.lowercase, self.vocab.strip_accents):
            if not word:
                continue
            w1 = _PHANTOM + word
            n = len(w1)
            mark = len(out)
            i = 0
            while i < n:
                match = False
                for j in range(min(n, i + self.max_len + 1), i, -1):
                    tid = lookup.get(w1[i:j])
                    if tid is not None:
                        out.append(tid)
                        match = True
                        i = j - 1
                        break
                if not match:
                    del out[mark:]
                    break
                i += 1
            if len(out) == mark:
                out.append(self.unk)
