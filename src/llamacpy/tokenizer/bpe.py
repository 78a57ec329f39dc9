"""Byte-level BPE ranked by merges (``tokenizer.ggml.model = gpt2``), as llama.cpp's
llm_tokenizer_bpe.

Each pre-token ("word") is split into characters of its GPT-2 byte-level encoding (or, for
SPM-style BPE such as Gemma 4, into its UTF-8 characters); the adjacent pair with the lowest
merge rank is merged (leftmost on ties) until no pair has a rank. A final symbol that is not
a token falls back to byte tokens.

Symbols are interned strings: ids below ``n_vocab`` are the tokens themselves, others are
merge parts that are not tokens. The merge table maps a pair of symbol ids to (rank, merged
id), so the merge loop runs in numba on integers. Results are cached per word.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from . import unicode as uni
from ._hashtab import build_int_map, lookup_int
from ._intern import build_merge_table, join_bytes, single_char_symbols
from .vocab import Vocab

_CACHE_MAX = 1 << 17


class BPEModel:
    def __init__(self, vocab: Vocab) -> None:
        self.vocab = vocab
        self.n_vocab = vocab.n_tokens
        assert vocab.pre is not None
        self.byte_encode = vocab.pre.byte_encode
        self.ignore_merges = vocab.ignore_merges
        self.gemma4 = vocab.pre.type == "GEMMA4"
        tok_buf, tok_off = vocab.token_bytes_joined()
        m_buf, m_off = join_bytes(vocab.merges)
        extra = list(uni.bytes_to_unicode()) if self.byte_encode else []
        x_buf, x_off = join_bytes(extra)
        keys, vals, extra_sids, st, ln, arena, _ = build_merge_table(
            tok_buf, tok_off, m_buf, m_off, x_buf, x_off
        )
        # first occurrence of a pair keeps its rank (std::unordered_map::emplace)
        self.merge_keys, self.merge_vals = build_int_map(keys, vals)
        if self.byte_encode:
            self.byte_sid = extra_sids
        else:
            cps, ids = single_char_symbols(st, ln, arena)
            self.char_keys, self.char_vals = build_int_map(cps, ids)
        self._ranks: dict[tuple[str, str], int] | None = None
        self.cache: dict[str, tuple[int, ...]] = {}

    @property
    def ranks(self) -> dict[tuple[str, str], int]:
        """(left, right) -> rank, for the reference implementation (built on first use)."""
        if self._ranks is None:
            pairs = _split_merges(self.vocab.merges)
            n = len(pairs)
            self._ranks = dict(zip(reversed(pairs), range(n - 1, -1, -1), strict=True))
        return self._ranks

    # --- public ----------------------------------------------------------------------

    def prepare(self, words: list[str]) -> dict[str, tuple[int, ...]]:
        """Make sure every word is in the cache (one numba call for all new ones); returns
        the cache (word -> token ids)."""
        cache = self.cache
        miss = [w for w in dict.fromkeys(words) if w not in cache]
        if miss:
            if len(cache) + len(miss) > _CACHE_MAX:
                cache.clear()
            self._encode_batch(miss)
        return cache

    def encode_words(self, words: list[str], out: list[int]) -> None:
        """Append the tokens of each word (text as split by the pre-tokenizer) to ``out``."""
        cache = self.prepare(words)
        for w in words:
            out.extend(cache[w])

    # --- internals ---------------------------------------------------------------------

    def _merge_string(self, word: str) -> str:
        if self.byte_encode:
            return uni.byte_encode(uni.encode_utf8(word))
        return word

    def _encode_batch(self, words: list[str]) -> None:
        cache = self.cache
        t2i = self.vocab.token_to_id
        todo: list[str] = []
        for w in words:
            if not w:
                cache[w] = ()
                continue
            if self.ignore_merges or self.gemma4:
                ms = self._merge_string(w)
                if self.ignore_merges or ms.strip("\n") == "":
                    tid = t2i.get(ms)
                    if tid is not None:
                        cache[w] = (tid,)
                        continue
            todo.append(w)
        if not todo:
            return
        if self.byte_encode:
            encoded = [uni.encode_utf8(w) for w in todo]
            lens = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
            sids = self.byte_sid[np.frombuffer(b"".join(encoded), dtype=np.uint8)]
        else:
            cpts = [uni.str_to_cpts(w) for w in todo]
            lens = np.fromiter(map(len, cpts), dtype=np.int64, count=len(cpts))
            sids = _map_chars(np.concatenate(cpts).astype(np.int64), self.char_keys, self.char_vals)
        offs = np.zeros(len(todo) + 1, dtype=np.int64)
        np.cumsum(lens, out=offs[1:])
        res, res_off = _bpe_batch(sids, offs, self.merge_keys, self.merge_vals)
        res_list = res.tolist()
        res_off_l = res_off.tolist()
        n_vocab = self.n_vocab
        for i, w in enumerate(todo):
            toks = res_list[res_off_l[i] : res_off_l[i + 1]]
            if all(0 <= t < n_vocab for t in toks):
                cache[w] = tuple(toks)
            else:
                cache[w] = tuple(self.encode_word_slow(w))

    def encode_word_slow(self, word: str) -> list[int]:
        """Reference implementation on strings (llama.cpp's algorithm, verbatim)."""
        t2i = self.vocab.token_to_id
        ms = self._merge_string(word)
        if self.ignore_merges and ms in t2i:
            return [t2i[ms]]
        if self.gemma4 and ms and ms.strip("\n") == "" and ms in t2i:
            return [t2i[ms]]
        syms = list(ms)
        ranks = self.ranks
        while len(syms) > 1:
            best = None
            best_i = -1
            for i in range(len(syms) - 1):
                r = ranks.get((syms[i], syms[i + 1]))
                if r is not None and (best is None or r < best):
                    best, best_i = r, i
            if best is None:
                break
            syms[best_i : best_i + 2] = [syms[best_i] + syms[best_i + 1]]
        out: list[int] = []
        for s in syms:
            tid = t2i.get(s)
            if tid is not None:
                out.append(tid)
                continue
            for b in s.encode("utf-8", "surrogateescape"):
                if self.byte_encode:
                    key = bytes([b]).decode("utf-8", "surrogateescape")
                else:
                    key = f"<0x{b:02X}>"
                tid = t2i.get(key)
                if tid is not None:
                    out.append(tid)
        return out


def _split_merges(merges: list[str]) -> list[tuple[str, str]]:
    """ "a b" -> ("a", "b"), splitting at the first space after the first character;
    ("", "") when there is none (llama.cpp's reading of tokenizer.ggml.merges)."""
    out = []
    for w in merges:
        pos = w.find(" ", 1)
        out.append((w[:pos], w[pos + 1 :]) if pos != -1 else ("", ""))
    return out


@njit(cache=True)
def _map_chars(cpts, keys, vals):  # pragma: no cover - numba
    out = np.empty(cpts.shape[0], np.int64)
    for i in range(cpts.shape[0]):
        out[i] = lookup_int(keys, vals, cpts[i])
    return out


@njit(cache=True)
def _bpe_batch(sids, offs, mk, mv):  # pragma: no cover - numba
    n_words = offs.shape[0] - 1
    total = sids.shape[0]
    out = np.empty(total, np.int64)
    out_off = np.zeros(n_words + 1, np.int64)
    maxlen = 1
    for w in range(n_words):
        maxlen = max(maxlen, offs[w + 1] - offs[w])
    sym = np.empty(maxlen, np.int64)
    prv = np.empty(maxlen, np.int64)
    nxt = np.empty(maxlen, np.int64)
    cap = 3 * maxlen + 4
    hkey = np.empty(cap, np.int64)  # rank << 32 | left
    hl = np.empty(cap, np.int64)  # left symbol id (sid) at push time
    hr = np.empty(cap, np.int64)  # right symbol id at push time
    hright = np.empty(cap, np.int64)  # right index
    hres = np.empty(cap, np.int64)  # merged sid
    no = 0
    for w in range(n_words):
        s0 = offs[w]
        n = offs[w + 1] - s0
        for i in range(n):
            sym[i] = sids[s0 + i]
            prv[i] = i - 1
            nxt[i] = i + 1 if i + 1 < n else -1
        hn = 0
        for i in range(n - 1):
            a = sym[i]
            b = sym[i + 1]
            if a < 0 or b < 0:
                continue
            v = lookup_int(mk, mv, (a << 32) | b)
            if v < 0:
                continue
            j = hn
            hn += 1
            hkey[j] = ((v >> 32) << 32) | i
            hl[j] = a
            hr[j] = b
            hright[j] = i + 1
            hres[j] = v & 0xFFFFFFFF
            while j > 0:
                p = (j - 1) >> 1
                if hkey[j] < hkey[p]:
                    hkey[j], hkey[p] = hkey[p], hkey[j]
                    hl[j], hl[p] = hl[p], hl[j]
                    hr[j], hr[p] = hr[p], hr[j]
                    hright[j], hright[p] = hright[p], hright[j]
                    hres[j], hres[p] = hres[p], hres[j]
                    j = p
                else:
                    break
        while hn > 0:
            left = hkey[0] & 0xFFFFFFFF
            right = hright[0]
            la = hl[0]
            rb = hr[0]
            res = hres[0]
            hn -= 1
            hkey[0] = hkey[hn]
            hl[0] = hl[hn]
            hr[0] = hr[hn]
            hright[0] = hright[hn]
            hres[0] = hres[hn]
            j = 0
            while True:
                c = 2 * j + 1
                if c >= hn:
                    break
                if c + 1 < hn and hkey[c + 1] < hkey[c]:
                    c += 1
                if hkey[c] < hkey[j]:
                    hkey[j], hkey[c] = hkey[c], hkey[j]
                    hl[j], hl[c] = hl[c], hl[j]
                    hr[j], hr[c] = hr[c], hr[j]
                    hright[j], hright[c] = hright[c], hright[j]
                    hres[j], hres[c] = hres[c], hres[j]
                    j = c
                else:
                    break
            if sym[left] != la or sym[right] != rb or nxt[left] != right:
                continue
            # merge right into left
            sym[left] = res
            sym[right] = -2
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prv[nxt[right]] = left
            for side in range(2):
                if side == 0:
                    x = prv[left]
                    y = left
                else:
                    x = left
                    y = nxt[left]
                if x < 0 or y < 0:
                    continue
                a = sym[x]
                b = sym[y]
                if a < 0 or b < 0:
                    continue
                v = lookup_int(mk, mv, (a << 32) | b)
                if v < 0:
                    continue
                jj = hn
                hn += 1
                hkey[jj] = ((v >> 32) << 32) | x
                hl[jj] = a
                hr[jj] = b
                hright[jj] = y
                hres[jj] = v & 0xFFFFFFFF
                while jj > 0:
                    p = (jj - 1) >> 1
                    if hkey[jj] < hkey[p]:
                        hkey[jj], hkey[p] = hkey[p], hkey[jj]
                        hl[jj], hl[p] = hl[p], hl[jj]
                        hr[jj], hr[p] = hr[p], hr[jj]
                        hright[jj], hright[p] = hright[p], hright[jj]
                        hres[jj], hres[p] = hres[p], hres[jj]
                        jj = p
                    else:
                        break
        i = 0 if n > 0 else -1
        while i != -1:
            out[no] = sym[i]
            no += 1
            i = nxt[i]
        out_off[w + 1] = no
    return out[:no], out_off
