"""llama.cpp's common sampler: a sampler chain with an optional grammar.

``common_sampler_sample``: the chain samples from the raw logits; the chosen token is
checked against the grammar alone and kept if allowed. Otherwise the logits are built
again, every token the grammar rejects gets -inf, and the chain samples once more (its
random stream advances a second time, as llama.cpp's does). ``common_sampler_accept``:
a generated token advances the grammar, then the chain; prompt tokens reach the chain
only. With the same seed, settings and grammar the tokens are llama.cpp's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .chain import SamplerChain, SampleResult


class CommonSampler:
    """A :class:`SamplerChain` (``chain``) and a grammar matcher (``grammar``, anything with
    ``allows``, ``mask`` and ``accept``: :class:`llamacpy.grammar.GrammarMatcher`)."""

    def __init__(self, chain: SamplerChain, grammar: Any = None) -> None:
        self.chain, self.grammar = chain, grammar
        self.n_resampled = 0  # tokens the grammar rejected on the first draw
        self._masked: np.ndarray | None = None
        self._mask: np.ndarray | None = None

    def sample(self, logits: np.ndarray, *, accept: bool = True) -> int:
        token = self.chain.sample(logits, accept=False)
        g = self.grammar
        if g is not None and not g.allows(token):
            self.n_resampled += 1
            row = np.asarray(logits, np.float32)
            if self._masked is None or len(self._masked) != len(row):
                self._masked = np.empty(len(row), np.float32)
                self._mask = np.empty(len(row), np.bool_)
            mask = g.mask(self._mask)
            np.copyto(self._masked, row)
            self._masked[~mask] = -np.inf
            token = self.chain.sample(self._masked, accept=False)
        if accept:
            self.accept_generated(token)
        return token

    def sample_with_probs(
        self, logits: np.ndarray, n_probs: int, *, accept: bool = True
    ) -> SampleResult:
        """:meth:`sample` (grammar included) with the top ``n_probs`` post-chain
        probabilities of the step that chose the token (the masked one after a rejection)."""
        return self.chain.sample_result(self.sample(logits, accept=accept), n_probs)

    def accept_generated(self, token: int) -> None:
        """A sampled token: the grammar advances, then the chain."""
        if self.grammar is not None:
            self.grammar.accept(token)
        self.chain.accept(token)

    def accept(self, token: int) -> None:
        """A prompt token: the chain only (llama.cpp's ``accept_grammar = false``)."""
        self.chain.accept(token)

    def reset(self) -> None:
        self.chain.reset()
        if self.grammar is not None:
            self.grammar.reset()

    def clone(self) -> CommonSampler:
        g = self.grammar.clone() if self.grammar is not None else None
        return CommonSampler(self.chain.clone(), g)

    def __getattr__(self, name: str) -> Any:  # probs, seed, cur, ...: the chain's
        if name in ("chain", "grammar"):
            raise AttributeError(name)
        return getattr(self.chain, name)

    def __repr__(self) -> str:
        return f"CommonSampler({self.chain!r}, grammar={self.grammar is not None})"
