"""``CommonSampler``: every sampling entry point honours the grammar."""

from __future__ import annotations

import numpy as np

from llamacpy.grammar.matcher import GrammarMatcher, GrammarVocab
from llamacpy.sampling import CommonSampler, Dist, SamplerChain, TopK

VOCAB = GrammarVocab([b"a", b"b", b"c", b"</s>"], [3])


def _sampler() -> CommonSampler:
    return CommonSampler(
        SamplerChain([TopK(0), Dist(1)]), GrammarMatcher('root ::= "b" "c"', VOCAB)
    )


def test_sample_with_probs_is_constrained_by_the_grammar() -> None:
    logits = np.array([20.0, 0.0, 0.0, 0.0], np.float32)  # "a" nearly certain, not allowed
    s = _sampler()
    res = s.sample_with_probs(logits, n_probs=4)
    assert res.token == 1 and s.n_resampled == 1
    assert [t.token for t in res.top] == [1] and res.p == 1.0
    res = s.sample_with_probs(logits, n_probs=4)  # the grammar advanced: "c" is next
    assert res.token == 2 and [t.token for t in res.top] == [2]
    res = s.sample_with_probs(logits, n_probs=4)  # then only the end
    assert res.token == 3


def test_sample_with_probs_without_accept_leaves_the_grammar() -> None:
    s = _sampler()
    logits = np.zeros(4, np.float32)
    assert s.sample_with_probs(logits, 2, accept=False).token == 1
    assert s.sample_with_probs(logits, 2, accept=False).token == 1
    plain = SamplerChain([TopK(0), Dist(1)]).sample_with_probs(
        np.array([0, 0, 9, 0], np.float32), 1
    )
    assert plain.token == 2  # the chain alone is unconstrained
