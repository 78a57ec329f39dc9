"""A grammar as one sampler of a chain (llama.cpp's ``llama_sampler_init_grammar``, the way
llama-cpp-python adds a grammar to its chain): ``apply`` gives -inf to every candidate the
grammar rejects, ``accept`` advances it."""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import Sampler
from .candidates import TokenDataArray


class GrammarSampler(Sampler):
    """``matcher``: anything with ``mask``, ``accept``, ``reset`` and ``clone``
    (:class:`llamacpy.grammar.GrammarMatcher`)."""

    name = "grammar"

    def __init__(self, matcher: Any) -> None:
        self.matcher = matcher
        self._mask: np.ndarray | None = None

    def apply(self, cur: TokenDataArray) -> None:
        self._mask = self.matcher.mask(self._mask)
        ids = cur.id[: cur.size]
        allowed = np.zeros(len(ids), np.bool_)
        known = ids < len(self._mask)  # logits rows may be wider than the vocabulary
        allowed[known] = self._mask[ids[known]]
        cur.logit[: cur.size][~allowed] = -np.inf

    def accept(self, token: int) -> None:
        self.matcher.accept(token)

    def reset(self) -> None:
        self.matcher.reset()

    def clone(self) -> GrammarSampler:
        return GrammarSampler(self.matcher.clone())
