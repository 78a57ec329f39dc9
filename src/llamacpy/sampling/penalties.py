"""Repetition samplers: repeat/frequency/presence penalties and DRY."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence

import numpy as np
from numba import njit

from .base import Sampler, check_float, check_int, invalid
from .candidates import TokenDataArray


@njit(cache=True, error_model="numpy")
def _penalties_kernel(id, logit, size, tokens, counts, repeat, freq, present):
    for j in range(len(tokens)):
        t = tokens[j]
        c = counts[j]
        if t >= 0 and t < size and id[t] == t:
            lo, hi = t, t + 1  # the usual unshuffled layout: token t sits at index t
        else:
            lo, hi = 0, size
        for i in range(lo, hi):
            if id[i] != t:
                continue
            if logit[i] <= 0:
                logit[i] = logit[i] * repeat
            else:
                logit[i] = logit[i] / repeat
            logit[i] = logit[i] - (np.float32(c) * freq + np.float32(c > 0) * present)


class Penalties(Sampler):
    """Repeat, frequency and presence penalties over the last ``penalty_last_n`` accepted tokens."""

    name = "penalties"

    def __init__(
        self,
        penalty_last_n: int = 64,
        penalty_repeat: float = 1.0,
        penalty_freq: float = 0.0,
        penalty_present: float = 0.0,
    ) -> None:
        self.penalty_last_n = check_int("penalty_last_n", penalty_last_n, lo=0)
        self.penalty_repeat = check_float("penalty_repeat", penalty_repeat)
        with np.errstate(over="ignore", divide="ignore"):
            inverse = np.float32(1.0) / self.penalty_repeat  # as llama.cpp checks it, in float
        if self.penalty_repeat <= 0 or not math.isfinite(inverse):
            raise invalid("penalty_repeat", penalty_repeat, "must be finite and greater than 0")
        self.penalty_freq = check_float("penalty_freq", penalty_freq)
        self.penalty_present = check_float("penalty_present", penalty_present)
        self.prev: deque[int] = deque()
        self.token_count: dict[int, int] = {}

    @property
    def is_noop(self) -> bool:
        return self.penalty_last_n == 0 or (
            self.penalty_repeat == 1.0 and self.penalty_freq == 0.0 and self.penalty_present == 0.0
        )

    def accept(self, token: int) -> None:
        if self.penalty_last_n == 0:
            return
        token = int(token)
        self.token_count[token] = self.token_count.get(token, 0) + 1
        if len(self.prev) >= self.penalty_last_n:
            old = self.prev.popleft()
            self.token_count[old] -= 1
            if self.token_count[old] == 0:
                del self.token_count[old]
        self.prev.append(token)

    def apply(self, cur: TokenDataArray) -> None:
        if self.is_noop:
            return
        if self.token_count:
            tokens = np.fromiter(self.token_count.keys(), np.int32, len(self.token_count))
            counts = np.fromiter(self.token_count.values(), np.int32, len(self.token_count))
            _penalties_kernel(
                cur.id, cur.logit, cur.size, tokens, counts,
                self.penalty_repeat, self.penalty_freq, self.penalty_present,
            )  # fmt: skip
        cur.sorted = False

    def reset(self) -> None:
        self.prev.clear()
        self.token_count.clear()


# --- DRY ("Don't Repeat Yourself", ported in llama.cpp from koboldcpp) ---------------------

DRY_MAX_CHAR_LEN = 40  # breaker strings are cut to this many bytes
DRY_MAX_SEQ_LEN = 20  # and their token tails to this many tokens


def dry_sequence_breakers(
    breakers: Iterable[str | bytes],
    n_vocab: int,
    token_to_piece: Callable[[int], bytes],
    tokenize: Callable[[bytes], Sequence[int]],
) -> list[tuple[int, ...]]:
    """Token-level restart sequences (head token first) for string breakers, as llama.cpp
    builds them.

    A token whose text contains the breaker is a single-token breaker; a token whose text
    *ends with a prefix* of the breaker is a head followed by the tokenization of the rest.
    ``token_to_piece`` must render special tokens too (llama.cpp detokenizes with
    ``special=true``); ``tokenize`` must neither add BOS nor parse special tokens.
    """
    pieces = [bytes(token_to_piece(t)) for t in range(n_vocab)]
    out: list[tuple[int, ...]] = []
    seen: dict[int, set[tuple[int, ...]]] = {}
    for raw in breakers:
        s = raw.encode() if isinstance(raw, str) else bytes(raw)
        if not s:
            continue
        s = s[:DRY_MAX_CHAR_LEN]
        for tok, word in enumerate(pieces):
            if s in word:
                out.append((tok,))
                seen.setdefault(tok, set()).add(())
                continue
            pos = word.find(s[:1])
            while pos != -1:
                rest = len(word) - pos
                if rest < len(s) and word[pos:] == s[:rest]:
                    tail = tuple(int(x) for x in tokenize(s[rest:]))[:DRY_MAX_SEQ_LEN]
                    have = seen.setdefault(tok, set())
                    if tail not in have:
                        have.add(tail)
                        out.append((tok, *tail))
                pos = word.find(s[:1], pos + 1)
    return out


@njit(cache=True, error_model="numpy")
def _logf(x):
    return np.float32(math.log(x))


@njit(cache=True, error_model="numpy")
def _dry_kernel(last, heads, offs, tails, id, logit, size, mult, base, allowed, max_exponent):
    """Steps 1-4 of llama.cpp's DRY apply; ``last`` is the history, oldest first.

    Returns False when it returned early (the candidates were not touched).
    """
    n = len(last)  # last_n_repeat
    # rat(i) == last[n - 1 - i]
    # step 1: the nearest restart sequence limits the repetition length
    rep_limit = n
    for i in range(n):
        tok = last[n - 1 - i]
        j = np.searchsorted(heads, tok)
        if j >= len(heads) or heads[j] != tok:
            continue
        longest = -1
        while j < len(heads) and heads[j] == tok:
            seq_len = offs[j + 1] - offs[j]
            if seq_len > longest and seq_len <= i:
                match = True
                for o in range(seq_len):
                    if tails[offs[j] + o] != last[n - 1 - (i - o - 1)]:
                        match = False
                        break
                if match:
                    longest = seq_len
            j += 1
        if longest >= 0:
            rep_limit = i - longest
            break
    if rep_limit < allowed:
        return False
    # step 2: reverse Z-algorithm, repeat[k] = length of the suffix repeated ending at k
    repeat = np.zeros(n, np.int64)
    lst = n - 1
    rt = 0
    lt = 0
    for k in range(1, n):
        if k > rt:
            m = 0
            while m + k < n and last[n - 1 - m] == last[n - 1 - (m + k)]:
                m += 1
            repeat[lst - k] = min(m, rep_limit)
            if m > 0:
                lt = k
                rt = k + m - 1
        else:
            pp = k - lt
            right_len = rt - k + 1
            if repeat[lst - pp] < right_len:
                repeat[lst - k] = min(repeat[lst - pp], rep_limit)
            else:
                i = rt + 1
                while i < n and last[n - 1 - i] == last[n - 1 - (i - k)]:
                    i += 1
                repeat[lst - k] = min(i - k, rep_limit)
                lt = k
                rt = i - 1
    # step 3: the longest repetition each next token would extend
    mt_tok = np.empty(n, np.int32)
    mt_len = np.empty(n, np.int64)
    nm = 0
    for i in range(n - 1):
        rlen = repeat[i]
        if rlen >= allowed:
            tok = last[n - 1 - (n - 2 - i)]
            found = False
            for q in range(nm):
                if mt_tok[q] == tok:
                    found = True
                    if mt_len[q] < rlen:
                        mt_len[q] = rlen
                    break
            if not found:
                mt_tok[nm] = tok
                mt_len[nm] = rlen
                nm += 1
    # step 4: penalise, except single-token breakers
    for q in range(nm):
        tok = mt_tok[q]
        j = np.searchsorted(heads, tok)
        single = False
        while j < len(heads) and heads[j] == tok:
            if offs[j + 1] == offs[j]:
                single = True
                break
            j += 1
        if single:
            continue
        exp = mt_len[q] - allowed
        if max_exponent > 0 and exp > max_exponent:
            exp = max_exponent
        penalty = np.float32(np.float64(mult) * math.pow(np.float64(base), np.float64(exp)))
        if tok >= 0 and tok < size and id[tok] == tok:
            lo, hi = tok, tok + 1
        else:
            lo, hi = 0, size
        for i in range(lo, hi):
            if id[i] == tok:
                logit[i] = logit[i] - penalty
    return True


class DRY(Sampler):
    """DRY repetition penalty: ``multiplier * base ** (length - allowed_length)`` for tokens
    that would extend a repeated sequence, within the last ``penalty_last_n`` tokens.

    ``seq_breakers`` are token sequences that restart the repetition count (a single
    token, or a head token followed by its tail); :func:`dry_sequence_breakers` builds them
    from strings such as llama.cpp's defaults ``["\\n", ":", "\\"", "*"]``.
    """

    name = "dry"

    def __init__(
        self,
        multiplier: float,
        base: float = 1.75,
        allowed_length: int = 2,
        penalty_last_n: int = 64,
        seq_breakers: Iterable[Sequence[int]] = (),
    ) -> None:
        self.multiplier = check_float("dry_multiplier", multiplier)
        self.base = check_float("dry_base", base)
        self.allowed_length = check_int("dry_allowed_length", allowed_length)
        self.penalty_last_n = max(check_int("dry_penalty_last_n", penalty_last_n, lo=0), 0)
        pairs = []
        for seq in seq_breakers:
            seq = [check_int("dry sequence breaker token", t) for t in seq]
            if seq:  # llama.cpp skips empty breakers
                pairs.append((seq[0], tuple(seq[1:])))
        pairs.sort(key=lambda ht: ht[0])  # stable: keeps tails of one head in order
        self.heads = np.array([h for h, _ in pairs], dtype=np.int32)
        self.offs = np.cumsum([0] + [len(t) for _, t in pairs]).astype(np.int64)
        self.tails = np.array([x for _, t in pairs for x in t], dtype=np.int32)
        self.last_tokens: deque[int] = deque(maxlen=max(self.penalty_last_n, 1))
        self._max_exponent = 0
        if self.base > np.float32(1.000001):
            q = np.float32(88.7228391) / _logf(self.base)
            self._max_exponent = int(q) if math.isfinite(q) else -(2**31)

    @property
    def is_noop(self) -> bool:
        return self.multiplier == 0.0 or self.base < 1.0 or self.penalty_last_n == 0

    def accept(self, token: int) -> None:
        if not self.is_noop:
            self.last_tokens.append(int(token))

    def apply(self, cur: TokenDataArray) -> None:
        if self.is_noop or len(self.last_tokens) <= self.allowed_length:
            return
        last = np.fromiter(self.last_tokens, np.int32, len(self.last_tokens))
        touched = _dry_kernel(
            last, self.heads, self.offs, self.tails, cur.id, cur.logit, cur.size,
            self.multiplier, self.base, self.allowed_length, self._max_exponent,
        )  # fmt: skip
        if touched:
            cur.sorted = False

    def reset(self) -> None:
        self.last_tokens.clear()
