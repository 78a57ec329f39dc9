"""Speculative decoding: propose tokens cheaply, verify them in one batch, keep what matches.

Decoding one token reads every weight; verifying a few proposed tokens in one batch costs
little more, so every proposal that matches what the model would have generated is
nearly free. The loop (:class:`~.generation.Generation`) works like llama.cpp's:

1. after sampling token ``t``, a :class:`Proposer` guesses the next tokens ``d1..dk``;
2. ``[t, d1..dk]`` is decoded in one batch with single-token numerics
   (``Context.decode(..., single_numerics=True)``): every row's logits equal what decoding
   the tokens one by one would give;
3. the next token is sampled from the row after ``t`` with the request's sampler chain; while
   it equals the next proposed token, the following row is already there; at the first
   difference the cache drops the remaining proposed tokens (``seq_rm``).

Every token is sampled from the target model's own logits by the same sampler, consuming
the same random numbers in the same order as plain decoding: the output (greedy or sampled,
any seed) is the output of plain decoding; only the time differs.

Proposers:

- ``ngram-simple`` (llama.cpp's): the last ``size_n`` tokens are looked up in the history,
  most recent occurrence first; the ``size_m`` tokens that followed it are proposed.
- ``ngram-map-k`` / ``ngram-map-k4v``: every ``size_n``-gram of the history maps to the
  tokens that followed it, with counts; the continuation seen at least ``min_hits`` times
  (most often; ``k4v`` keeps up to four per key) is proposed, extended greedily.
- ``ngram-mod``: a map from ``n_match``-grams to the next token, chained to draft up to
  ``n_max`` tokens (at least ``n_min``, else nothing).
- ``draft-simple``: a smaller model with the same vocabulary drafts greedily (``-md``),
  stopping when its top probability falls below ``p_min``.

:class:`Speculator` chooses how many proposals to verify from what decodes of each size
cost on this machine and how often proposals are accepted, so a workload that does not
repeat itself falls back to plain decoding.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..errors import UsageError

SPEC_TYPES = (
    "none",
    "draft-simple",
    "ngram-simple",
    "ngram-map-k",
    "ngram-map-k4v",
    "ngram-mod",
    "ngram-cache",
    "prompt-lookup",
    "draft-mtp",
    "draft-eagle3",
)
_NOT_YET = {
    "ngram-cache": "the n-gram lookup caches (-lcs/-lcd)",
    "draft-mtp": "multi-token-prediction heads",
    "draft-eagle3": "EAGLE-3 draft heads",
}


class Proposer(Protocol):
    """Guesses the tokens that follow ``history`` (the prompt, the generated tokens and the
    token just sampled)."""

    name: str
    n_max: int

    def begin(self, prompt: Sequence[int]) -> None: ...

    def propose(self, history: Sequence[int], n: int) -> list[int]: ...


def _last_occurrence(h: np.ndarray, size: int, lo: int, hi: int) -> int:
    """The largest start ``lo <= j <= hi`` where ``h[j:j + size]`` equals the last ``size``
    tokens of ``h`` (-1: none)."""
    if hi < lo:
        return -1
    win = np.lib.stride_tricks.sliding_window_view(h[: hi + size], size)[lo:]
    hits = np.nonzero((win == h[len(h) - size :]).all(axis=1))[0]
    return lo + int(hits[-1]) if hits.size else -1


class NgramSimple:
    """llama.cpp's ``ngram-simple``: the most recent earlier occurrence of the last
    ``size_n`` tokens, and the (at most ``size_m``, at least ``size_n``) tokens after it."""

    name = "ngram-simple"

    def __init__(self, size_n: int = 12, size_m: int = 48) -> None:
        self.size_n, self.size_m = _check_size(size_n, "size-n"), _check_size(size_m, "size-m")
        self.n_max = self.size_m

    def begin(self, prompt: Sequence[int]) -> None:
        pass

    def propose(self, history: Sequence[int], n: int) -> list[int]:
        h = np.asarray(history, np.int64)
        L, sn = len(h), self.size_n
        if sn + self.size_m + 1 >= L - 1:
            return []
        # an earlier window starting at 1 .. L - sn - 2 (not the one that ends with the
        # pattern, as llama.cpp's search)
        j = _last_occurrence(h, sn, 1, L - sn - 2)
        if j < 0:
            return []
        copy = min(self.size_m, L - 1 - (j + sn))
        if copy < sn:
            return []
        return [int(t) for t in h[j + sn : j + sn + min(copy, n)]]


class _NgramTable:
    """A table of what followed each ``n``-gram of the history, built as the history grows
    (each position once); a history that does not continue the last one starts it again.
    A proposal follows the table from the last ``n`` tokens, one token at a time."""

    n: int  # the n-gram length
    n_max: int

    def __init__(self) -> None:
        self._seen, self._hist = 0, []

    def _reset(self) -> None:
        raise NotImplementedError

    def _add(self, key: tuple[int, ...], token: int) -> None:
        raise NotImplementedError

    def _next(self, key: tuple[int, ...]) -> int | None:
        raise NotImplementedError

    def begin(self, prompt: Sequence[int]) -> None:
        self._reset()
        self._seen, self._hist = 0, []
        self._update(prompt)

    def _update(self, history: Sequence[int]) -> None:
        h = [int(t) for t in history]
        if h[: self._seen] != self._hist[: self._seen]:
            self._reset()
            self._seen = 0
        self._hist = h
        for i in range(max(self._seen, self.n), len(h)):
            self._add(tuple(h[i - self.n : i]), h[i])
        self._seen = len(h)

    def _follow(self, history: Sequence[int], n: int) -> list[int]:
        self._update(history)
        key = tuple(self._hist[-self.n :])
        out: list[int] = []
        while len(key) == self.n and len(out) < min(n, self.n_max):
            t = self._next(key)
            if t is None:
                break
            out.append(t)
            key = (*key[1:], t)
        return out


class NgramMap(_NgramTable):
    """``ngram-map-k`` (``values`` 1) and ``ngram-map-k4v`` (``values`` 4): each
    ``size_n``-gram of the history maps to the tokens that followed it, counted (up to
    ``values`` different ones); a proposal follows the continuation seen most often, while
    it was seen at least ``min_hits`` times."""

    def __init__(
        self, size_n: int = 12, size_m: int = 48, min_hits: int = 1, values: int = 1
    ) -> None:
        super().__init__()
        self.n, self.n_max = _check_size(size_n, "size-n"), _check_size(size_m, "size-m")
        if min_hits < 1:
            raise UsageError(f"ngram min hits must be at least 1, not {min_hits}")
        self.min_hits, self.values = int(min_hits), int(values)
        self.name = "ngram-map-k" if values == 1 else "ngram-map-k4v"
        self._table: dict[tuple[int, ...], dict[int, int]] = defaultdict(dict)

    def _reset(self) -> None:
        self._table.clear()

    def _add(self, key: tuple[int, ...], token: int) -> None:
        seen = self._table[key]
        if token in seen or len(seen) < self.values:
            seen[token] = seen.get(token, 0) + 1

    def _next(self, key: tuple[int, ...]) -> int | None:
        seen = self._table.get(key)
        if not seen:
            return None
        t, hits = max(seen.items(), key=lambda kv: kv[1])
        return t if hits >= self.min_hits else None

    def propose(self, history: Sequence[int], n: int) -> list[int]:
        return self._follow(history, n)


class NgramMod(_NgramTable):
    """llama.cpp's ``ngram-mod``: ``n_match``-grams map to the token that followed them
    last; a proposal chains lookups, up to ``n_max`` tokens, and is dropped when shorter
    than ``n_min``."""

    name = "ngram-mod"

    def __init__(self, n_match: int = 24, n_max: int = 64, n_min: int = 48) -> None:
        super().__init__()
        self.n = _check_size(n_match, "n-match")
        if not 0 <= n_min <= 1024 or not 0 <= n_max <= 1024:
            raise UsageError("ngram n-min and n-max must be between 0 and 1024 inclusive")
        self.n_max, self.n_min = int(n_max), int(n_min)
        self._table: dict[tuple[int, ...], int] = {}

    def _reset(self) -> None:
        self._table.clear()

    def _add(self, key: tuple[int, ...], token: int) -> None:
        self._table[key] = token

    def _next(self, key: tuple[int, ...]) -> int | None:
        return self._table.get(key)

    def propose(self, history: Sequence[int], n: int) -> list[int]:
        out = self._follow(history, n)
        return out if len(out) >= min(self.n_min, n) else []


class PromptLookup:
    """llama-cpp-python's ``LlamaPromptLookupDecoding``: the longest of the last
    ``max_ngram_size`` .. 1 tokens that occurred earlier in the history (most recent
    occurrence), and the ``num_pred_tokens`` tokens that followed it."""

    name = "prompt-lookup"

    def __init__(self, max_ngram_size: int = 2, num_pred_tokens: int = 10) -> None:
        self.max_ngram_size = _check_size(max_ngram_size, "max_ngram_size")
        self.n_max = _check_size(num_pred_tokens, "num_pred_tokens")

    def begin(self, prompt: Sequence[int]) -> None:
        pass

    def propose(self, history: Sequence[int], n: int) -> list[int]:
        h = np.asarray(history, np.int64)
        L = len(h)
        for size in range(min(self.max_ngram_size, L - 1), 0, -1):
            j = _last_occurrence(h, size, 0, L - 1 - size)
            if j >= 0:
                j += size
                return [int(t) for t in h[j : j + min(n, self.n_max)]]
        return []


class LlamaPromptLookupDecoding(PromptLookup):
    """llama-cpp-python's name for :class:`PromptLookup`
    (``Llama(..., draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10))``)."""


class CallableProposer:
    """A llama-cpp-python draft model: any callable ``(input_ids: int array) -> token ids``
    (``LlamaDraftModel``'s protocol), proposing at most ``n_max`` tokens."""

    name = "callable"

    def __init__(self, fn: Any, n_max: int = 16) -> None:
        if not callable(fn):
            raise UsageError(
                f"draft_model must be a proposer or a callable (input_ids) -> token ids, "
                f"not {type(fn).__name__}"
            )
        self.fn, self.n_max = fn, int(n_max)

    def begin(self, prompt: Sequence[int]) -> None:
        pass

    def propose(self, history: Sequence[int], n: int) -> list[int]:
        out = np.asarray(self.fn(np.asarray(history, np.intc))).reshape(-1)
        return [int(t) for t in out[:n]]


def as_proposer(obj: Any) -> Proposer:
    """A proposer as given, or a llama-cpp-python draft model wrapped as one."""
    if hasattr(obj, "propose") and hasattr(obj, "n_max"):
        return obj
    return CallableProposer(obj)


class DraftModel:
    """``draft-simple``: a smaller model of the same vocabulary drafts greedily, token by
    token, while its top probability is at least ``p_min``; its cache keeps the common
    prefix between proposals."""

    name = "draft-simple"

    def __init__(self, session: Any, n_max: int = 3, p_min: float = 0.0) -> None:
        if n_max < 1:
            raise UsageError(f"--spec-draft-n-max must be at least 1, not {n_max}")
        if not 0.0 <= p_min <= 1.0:
            raise UsageError(f"--spec-draft-p-min must be in [0, 1], not {p_min}")
        self.session = session  # a generation.Session over the draft model's context
        self.n_max, self.p_min = int(n_max), float(p_min)

    def begin(self, prompt: Sequence[int]) -> None:
        pass

    def propose(self, history: Sequence[int], n: int) -> list[int]:
        s = self.session
        n = min(n, self.n_max, s.n_ctx - len(history) - 1)
        if n <= 0 or len(history) >= s.n_ctx:
            return []
        s.ingest(list(history))
        row = s.last_logits
        out: list[int] = []
        while len(out) < n:
            assert row is not None
            t = int(np.argmax(row))
            if self.p_min > 0.0:
                z = row.astype(np.float64) - float(row[t])
                if 1.0 / float(np.exp(z).sum()) < self.p_min:
                    break
            out.append(t)
            if len(out) < n:
                row = s.decode([t])
        return out


def check_draft_vocab(target: Any, draft: Any) -> None:
    """A draft model must speak the target's vocabulary (llama.cpp's checks: same size up to
    a small margin, same BOS/EOS, same text for every token id they share)."""
    nt, nd = int(target.n_vocab), int(draft.n_vocab)
    if abs(nt - nd) > 128:
        raise UsageError(
            f"the draft model's vocabulary has {nd} tokens and the target's {nt}: "
            "speculative decoding needs the same vocabulary"
        )
    if (target.bos, target.eos) != (draft.bos, draft.eos):
        raise UsageError(
            f"the draft model's BOS/EOS tokens ({draft.bos}, {draft.eos}) differ from the "
            f"target's ({target.bos}, {target.eos}): speculative decoding needs the same "
            "vocabulary"
        )
    for i in range(min(nt, nd)):
        if target.token_to_piece(i, True) != draft.token_to_piece(i, True):
            raise UsageError(
                f"token {i} is {target.token_to_piece(i, True)!r} in the target model but "
                f"{draft.token_to_piece(i, True)!r} in the draft model: speculative "
                "decoding needs the same vocabulary"
            )


def _check_size(v: int, what: str) -> int:
    if not 1 <= int(v) <= 1024:
        raise UsageError(f"ngram {what} must be between 1 and 1024 inclusive, not {v}")
    return int(v)


@dataclass
class SpecStats:
    """Counters of one generation (or of a server slot): proposed and accepted tokens,
    verification rounds."""

    n_drafted: int = 0
    n_accepted: int = 0
    n_rounds: int = 0

    @property
    def acceptance(self) -> float:
        return self.n_accepted / self.n_drafted if self.n_drafted else 0.0

    def add(self, other: SpecStats) -> None:
        self.n_drafted += other.n_drafted
        self.n_accepted += other.n_accepted
        self.n_rounds += other.n_rounds


class DecodeCost:
    """What a decode of ``n`` tokens costs on this machine (seconds, a moving average per
    size), learnt from the decodes it is told about; shared by the speculators of a
    server's slots."""

    def __init__(self) -> None:
        self._cost: dict[int, float] = {}
        self._spiked: set[int] = set()

    def __call__(self, n: int) -> float:
        """Measured, else interpolated between measured sizes, else ``1 + (n - 1) / 2``
        units scaled to the nearest size measured (an optimistic guess, which the first
        such decode corrects)."""
        c = self._cost
        if n in c:
            return c[n]
        lo = max((m for m in c if m < n), default=None)
        hi = min((m for m in c if m > n), default=None)
        if lo is not None and hi is not None:
            f = (n - lo) / (hi - lo)
            return c[lo] + f * (c[hi] - c[lo])
        near = lo if lo is not None else hi
        unit = c[near] / (1 + (near - 1) / 2) if near is not None else 1.0
        return unit * (1 + (n - 1) / 2)

    def timed(self, n_tokens: int, seconds: float) -> None:
        """A decode of ``n_tokens`` took ``seconds`` (a spike -- a kernel loaded on first
        use, a page fault, another process -- counts as at most twice the estimate, and the
        first one of a size not at all)."""
        old = self._cost.get(n_tokens)
        if self._cost and seconds > 2.0 * self(n_tokens):
            if old is None and n_tokens not in self._spiked:
                self._spiked.add(n_tokens)
                return
            seconds = 2.0 * self(n_tokens)
        self._cost[n_tokens] = seconds if old is None else 0.7 * old + 0.3 * seconds


class Speculator:
    """A proposer plus the choice of how many of its tokens to verify.

    Verifying ``k`` proposals costs a decode of ``k`` more tokens, which on a CPU is not
    free: from what decodes of each size cost here (:class:`DecodeCost`) and the rate at
    which proposals are accepted (:meth:`record`), the speculator verifies the ``k`` that
    maximises the expected tokens per second -- ``(1 + a + ... + a^k) / cost(k + 1)`` alone
    (``a``: the acceptance rate, the cost including the proposer's own time), the batch's
    tokens over its cost in a server step -- zero, a plain decode, when speculation would
    lose. The evidence fades while it does not speculate, so it tries again later.
    ``adaptive=False`` verifies every proposal (up to ``n_max``); ``n_min``: a proposal
    shorter than this is not verified. :attr:`stats` counts every round."""

    PRIOR = (4.0, 5.0)  # pseudo-counts (accepted, tried) of the acceptance rate: 0.8
    FADE = 0.97  # per plain decode, the weight left to earlier evidence

    def __init__(
        self,
        proposer: Proposer,
        n_min: int = 0,
        adaptive: bool = True,
        cost: DecodeCost | None = None,
    ) -> None:
        if n_min < 0:
            raise UsageError(f"--spec-draft-n-min must be at least 0, not {n_min}")
        self.proposer, self.n_min, self.adaptive = proposer, int(n_min), bool(adaptive)
        self.n_max = int(proposer.n_max)
        self.stats = SpecStats()
        self.cost = cost if cost is not None else DecodeCost()
        self._hits, self._tries = 0.0, 0.0
        self._draft_cost = 0.0  # seconds per proposed token (a draft model's decodes)

    @property
    def acceptance_rate(self) -> float:
        """The current estimate of the chance that a proposed token is accepted."""
        h, t = self.PRIOR
        return (h + self._hits) / (t + self._tries)

    def begin(self, prompt: Sequence[int]) -> None:
        self.proposer.begin(prompt)

    def timed(self, n_tokens: int, seconds: float) -> None:
        self.cost.timed(n_tokens, seconds)

    def propose(
        self, history: Sequence[int], room: int, rows: int = 1, tokens: float = 1.0
    ) -> list[int]:
        """The proposals to verify after ``history``, at most ``room`` (empty: decode
        plainly), in a decode that has ``rows`` rows without them (this sequence's own
        included) expected to give ``tokens`` tokens."""
        n = min(room, self.n_max)
        if n < max(self.n_min, 1):
            return []
        t0 = time.perf_counter()
        draft = self.proposer.propose(history, n)[:n]
        if draft:
            dt = (time.perf_counter() - t0) / len(draft)
            self._draft_cost = dt if not self._draft_cost else 0.8 * self._draft_cost + 0.2 * dt
        k = self._best_length(len(draft), rows, tokens) if self.adaptive else len(draft)
        if k < max(self.n_min, 1):
            self._hits *= self.FADE
            self._tries *= self.FADE
            return []
        return draft[:k]

    def expected(self, k: int) -> float:
        """Expected tokens from verifying ``k`` proposals (the sampled token included)."""
        a = self.acceptance_rate
        return sum(a**i for i in range(k + 1))

    def _best_length(self, n: int, rows: int, tokens: float) -> int:
        a, cost = self.acceptance_rate, self.cost
        best, best_k = tokens / cost(rows), 0
        gain = tokens
        for k in range(1, n + 1):
            gain += a**k
            rate = gain / (cost(rows + k) + k * self._draft_cost)
            if rate > best:
                best, best_k = rate, k
        return best_k

    def record(self, n_drafted: int, n_accepted: int) -> None:
        """One verification round's outcome."""
        st = self.stats
        st.n_drafted += n_drafted
        st.n_accepted += n_accepted
        st.n_rounds += 1
        # a geometric run: n_accepted successes, then one failure unless all were accepted
        self._hits = 0.9 * self._hits + n_accepted
        self._tries = 0.9 * self._tries + n_accepted + (n_accepted < n_drafted)


def make_proposer(
    spec_type: str,
    *,
    draft_session: Any = None,
    draft_n_max: int = 3,
    draft_p_min: float = 0.0,
    simple: tuple[int, int] = (12, 48),
    map_k: tuple[int, int, int] = (12, 48, 1),
    map_k4v: tuple[int, int, int] = (12, 48, 1),
    mod: tuple[int, int, int] = (24, 64, 48),
    lookup: tuple[int, int] = (2, 10),
) -> Proposer | None:
    """The proposer of a ``--spec-type`` name (None for ``none``)."""
    t = spec_type.strip().lower()
    if t not in SPEC_TYPES:
        raise UsageError(f"--spec-type {spec_type!r}: expected one of {', '.join(SPEC_TYPES)}")
    if t in _NOT_YET:
        raise UsageError(f"--spec-type {t}: {_NOT_YET[t]} are not supported yet")
    if t == "none":
        return None
    if t == "draft-simple":
        if draft_session is None:
            raise UsageError("--spec-type draft-simple needs a draft model (-md FILE)")
        return DraftModel(draft_session, draft_n_max, draft_p_min)
    if t == "ngram-simple":
        return NgramSimple(*simple)
    if t == "prompt-lookup":
        return PromptLookup(*lookup)
    if t == "ngram-map-k":
        return NgramMap(*map_k, values=1)
    if t == "ngram-map-k4v":
        return NgramMap(*map_k4v, values=4)
    return NgramMod(*mod)
