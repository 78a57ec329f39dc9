"""The sampler chain, one sampling step end to end, and token probabilities for logprobs."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from numba import njit

from .base import Sampler, SamplingError
from .candidates import TokenDataArray, Workspace, softmax_kernel
from .sort import partial_sort, std_sort


@dataclass(frozen=True, slots=True)
class TokenProb:
    """One candidate as reported for logprobs: token id and probability."""

    token: int
    p: float

    @property
    def logprob(self) -> float:
        return math.log(self.p) if self.p > 0.0 else -math.inf


@dataclass(frozen=True, slots=True)
class SampleResult:
    """The chosen token, its probability and the top ``n_probs`` candidates."""

    token: int
    p: float
    top: tuple[TokenProb, ...]


class SamplerChain(Sampler):
    """Samplers applied in order; the last one(s) must select a token (dist, greedy, mirostat).

    ``sample(logits)`` is ``llama_sampler_sample``: build candidates from one logits row,
    apply the chain, take the selected token and ``accept`` it. The candidates of the last
    step stay available for :meth:`probs` (the post-sampling probabilities llama.cpp's
    server reports with ``post_sampling_probs``).
    """

    name = "chain"

    def __init__(self, samplers: Iterable[Sampler] = ()) -> None:
        self.samplers: list[Sampler] = []
        self._active: list[Sampler] = []  # samplers minus llama.cpp's "empty" ones
        for s in samplers:
            self.add(s)
        self.cur: TokenDataArray | None = None
        self.n_sample = 0
        self._ws = Workspace()

    def add(self, sampler: Sampler) -> SamplerChain:
        if not isinstance(sampler, Sampler):
            raise SamplingError(f"not a sampler: {sampler!r}")
        self.samplers.append(sampler)
        if not sampler.is_noop:
            self._active.append(sampler)
        return self

    def apply(self, cur: TokenDataArray) -> None:
        for s in self._active:
            s.apply(cur)

    def accept(self, token: int) -> None:
        for s in self._active:
            s.accept(token)
        self.n_sample += 1

    def reset(self) -> None:
        for s in self.samplers:
            s.reset()

    def clone(self) -> SamplerChain:
        out = SamplerChain(s.clone() for s in self.samplers)
        out.cur = self.cur.copy() if self.cur is not None else None
        out.n_sample = self.n_sample
        return out

    @property
    def seed(self) -> int:
        """``llama_sampler_get_seed``: the seed in use by the last dist / mirostat sampler
        (``0xFFFFFFFF`` when there is none)."""
        for s in reversed(self.samplers):
            if isinstance(s, SamplerChain):
                seed = s.seed
            elif s.name in ("dist", "mirostat", "mirostat-v2"):
                seed = int(s.seed_cur)  # type: ignore[attr-defined]
            else:
                continue
            if seed != 0xFFFFFFFF:
                return seed
        return 0xFFFFFFFF

    def sample(self, logits: np.ndarray, *, accept: bool = True) -> int:
        """Sample one token from a logits row (and accept it unless ``accept=False``)."""
        try:
            cur = TokenDataArray.from_logits(logits, self._ws)
        except ValueError as e:
            raise SamplingError(str(e)) from None
        self.apply(cur)
        if not 0 <= cur.selected < cur.size:
            names = " -> ".join(s.name for s in self.samplers) or "(empty)"
            raise SamplingError(
                f"the sampler chain [{names}] selected no token (selected={cur.selected}, "
                f"{cur.size} candidates left); end it with dist, greedy or mirostat"
            )
        self.cur = cur
        token = int(cur.id[cur.selected])
        if accept:
            self.accept(token)
        return token

    def sample_with_probs(
        self, logits: np.ndarray, n_probs: int, *, accept: bool = True
    ) -> SampleResult:
        """Sample a token and report the top ``n_probs`` post-chain probabilities."""
        return self.sample_result(self.sample(logits, accept=accept), n_probs)

    def sample_result(self, token: int, n_probs: int) -> SampleResult:
        """``token`` (the last one sampled), its post-chain probability and the top
        ``n_probs`` candidates of the last step."""
        top = self.probs(n_probs)
        cur = self.cur
        assert cur is not None
        p = next((float(cur.p[i]) for i in range(cur.size) if int(cur.id[i]) == token), 0.0)
        return SampleResult(token, p, top)

    def probs(self, n_probs: int) -> tuple[TokenProb, ...]:
        """Top ``n_probs`` candidates of the last step by post-chain probability.

        As llama.cpp's server does it: sort the final candidates by ``p`` (``std::sort``)
        unless already sorted, stop at the first zero probability.
        """
        cur = self.cur
        if cur is None:
            raise SamplingError("probs() needs a previous sample() call")
        if n_probs < 0:
            raise SamplingError(
                f"invalid n_probs={n_probs!r}: must be >= 0", param="n_probs", value=n_probs
            )
        if not cur.sorted:
            sort_by_p(cur)
        out = []
        for i in range(min(n_probs, cur.size)):
            p = float(cur.p[i])
            if p == 0.0:
                break
            out.append(TokenProb(int(cur.id[i]), p))
        return tuple(out)

    def __repr__(self) -> str:
        return "SamplerChain(" + " -> ".join(repr(s) for s in self.samplers) + ")"


def sort_by_p(cur: TokenDataArray) -> None:
    """``common_sampler_get_candidates(do_sort=true)``: sort by descending p, keep selection."""
    n = cur.size
    sel_id = int(cur.id[cur.selected]) if 0 <= cur.selected < n else None
    std_sort(cur.p, cur.id, cur.logit, 0, n, True)
    if sel_id is not None:
        cur.selected = int(np.argmax(cur.id[:n] == sel_id))
    cur.sorted = True


@njit(cache=True, error_model="numpy")
def _token_probs_kernel(logit, id, p, n, n_top):
    if n_top > 0:
        partial_sort(logit, id, p, np.int64(0), n_top, n, np.bool_(True))
        softmax_kernel(logit, p, n, np.bool_(True))
    else:
        softmax_kernel(logit, p, n, np.bool_(False))


def token_probabilities(logits: np.ndarray, n_top: int) -> tuple[TokenProb, ...]:
    """Pre-sampling probabilities: softmax of the raw logits, top ``n_top`` by logit.

    llama.cpp's server reports these for ``n_probs`` when ``post_sampling_probs`` is off.
    """
    if n_top < 0:
        raise SamplingError(
            f"invalid n_probs={n_top!r}: must be >= 0", param="n_probs", value=n_top
        )
    cur = TokenDataArray.from_logits(logits)
    if cur.size == 0:
        return ()
    n_top = min(n_top, cur.size)
    _token_probs_kernel(cur.logit, cur.id, cur.p, cur.size, n_top)
    return tuple(TokenProb(int(cur.id[i]), float(cur.p[i])) for i in range(n_top))
