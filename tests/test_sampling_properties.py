"""Property-based invariants of the samplers, the chain and the sort replicas."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from llamacpy.sampling import (
    Dist,
    Greedy,
    MinP,
    SamplerChain,
    SamplingParams,
    TokenDataArray,
    TopK,
    TopP,
    build_sampler_chain,
)
from llamacpy.sampling.sort import bucket_partial_sort, partial_sort, partial_sort_top, std_sort

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

finite = st.floats(-40, 40, width=32, allow_nan=False)
logit_values = st.one_of(finite, finite.map(lambda x: round(x)), st.just(float("-inf")))


@st.composite
def logits_rows(draw, min_size=1, max_size=300):
    row = draw(arrays(np.float32, st.integers(min_size, max_size), elements=logit_values))
    if not np.isfinite(row).any():
        row[draw(st.integers(0, len(row) - 1))] = draw(finite)
    return row


params = st.builds(
    SamplingParams,
    seed=st.integers(0, 2**32 - 2),
    top_k=st.integers(-1, 60),
    top_p=st.floats(0, 1),
    min_p=st.floats(0, 1),
    typ_p=st.sampled_from([1.0, 0.9, 0.5]),
    temp=st.sampled_from([0.0, 0.3, 0.8, 1.0, 2.5]),
    dynatemp_range=st.sampled_from([0.0, 0.5]),
    xtc_probability=st.floats(0, 1),
    xtc_threshold=st.floats(0.01, 0.6),
    top_n_sigma=st.sampled_from([-1.0, 1.0, 3.0]),
    penalty_repeat=st.sampled_from([1.0, 1.3]),
    penalty_freq=st.sampled_from([0.0, 0.5]),
    penalty_present=st.sampled_from([0.0, 0.5]),
    dry_multiplier=st.sampled_from([0.0, 0.8]),
    min_keep=st.integers(0, 3),
    mirostat=st.sampled_from([0, 0, 0, 1, 2]),
    samplers=st.permutations(["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"]),
)  # fmt: skip


@SETTINGS
@given(p=params, rows=st.lists(logits_rows(), min_size=1, max_size=4))
def test_chain_picks_a_possible_token_and_probabilities_sum_to_one(p, rows) -> None:
    n_vocab = max(len(r) for r in rows)
    chain = build_sampler_chain(p, n_vocab, dry_seq_breakers=[[0]])
    for row in rows:
        full = np.full(n_vocab, -np.inf, np.float32)
        full[: len(row)] = row
        token = chain.sample(full)
        cur = chain.cur
        assert 0 <= cur.selected < cur.size
        assert np.isfinite(full[token])  # never a -inf (impossible) token
        assert abs(float(cur.p[: cur.size].astype(np.float64).sum()) - 1.0) < 1e-4
        top = chain.probs(5)
        assert all(a.p >= b.p for a, b in itertools.pairwise(top))


@SETTINGS
@given(row=logits_rows())
def test_greedy_is_argmax(row) -> None:
    cur = TokenDataArray.from_logits(row)
    Greedy().apply(cur)
    assert cur.id[cur.selected] == int(np.argmax(row))


@SETTINGS
@given(row=logits_rows(), k=st.integers(1, 400))
def test_top_k_keeps_the_k_largest_sorted(row, k) -> None:
    cur = TokenDataArray.from_logits(row)
    TopK(k).apply(cur)
    assert cur.size == min(k, len(row)) and cur.sorted
    kept = cur.logit[: cur.size]
    assert np.array_equal(kept, np.sort(row)[::-1][: cur.size])
    assert np.array_equal(row[cur.id[: cur.size]], kept)
    assert len(set(cur.id[: cur.size].tolist())) == cur.size


@SETTINGS
@given(row=logits_rows(), p=st.floats(0, 1), min_keep=st.integers(0, 5))
def test_top_p_and_min_p_keep_a_sorted_prefix(row, p, min_keep) -> None:
    for sampler in (TopP(p, min_keep), MinP(p, min_keep)):
        cur = TokenDataArray.from_logits(row)
        sampler.apply(cur)
        assert 1 <= cur.size <= len(row)
        assert cur.size >= min(max(min_keep, 1), len(row)) or p == 0.0
        assert np.max(cur.logit[: cur.size]) == np.max(row)  # the best token survives
        if cur.sorted:
            kept = cur.logit[: cur.size]
            assert np.array_equal(kept, np.sort(row)[::-1][: cur.size])


@SETTINGS
@given(row=logits_rows(), seed=st.integers(0, 2**32 - 2))
def test_dist_probabilities(row, seed) -> None:
    chain = SamplerChain([Dist(seed)])
    token = chain.sample(row)
    cur = chain.cur
    e = np.exp(row.astype(np.float64) - row.max())
    np.testing.assert_allclose(cur.p[: cur.size], e / e.sum(), rtol=1e-5, atol=1e-7)
    assert np.isfinite(row[token])


keys = arrays(
    np.float32, st.integers(1, 400), elements=st.one_of(finite, st.integers(-3, 3).map(float))
)


@SETTINGS
@given(k=keys, desc=st.booleans(), frac=st.floats(0, 1))
def test_sort_replicas_sort(k, desc, frac) -> None:
    n = len(k)
    key, ids, other = k.copy(), np.arange(n, dtype=np.int32), k.copy()
    std_sort(key, ids, other, 0, n, desc)
    ref = np.sort(k)[::-1] if desc else np.sort(k)
    assert np.array_equal(key, ref) and np.array_equal(k[ids], key) and np.array_equal(other, key)
    m = max(1, int(frac * n))
    key, ids, other = k.copy(), np.arange(n, dtype=np.int32), k.copy()
    partial_sort(key, ids, other, 0, m, n, True)
    assert np.array_equal(key[:m], np.sort(k)[::-1][:m])
    assert sorted(ids.tolist()) == list(range(n))


@SETTINGS
@given(
    k=arrays(np.float32, st.integers(1, 3000), elements=st.integers(-6, 6).map(float)),
    m=st.integers(1, 128),
)
def test_partial_sort_top_equals_std_partial_sort_on_the_kept_prefix(k, m) -> None:
    n, m = len(k), min(m, len(k))
    ref = (k.copy(), np.arange(n, dtype=np.int32), -k)
    partial_sort(*ref, 0, m, n, True)
    got = (k.copy(), np.arange(n, dtype=np.int32), -k)
    partial_sort_top(*got, n, m)
    for r, g in zip(ref, got):
        assert np.array_equal(r[:m], g[:m])  # same records in the same order, ties included


big_keys = arrays(
    np.float32, st.integers(1, 3000),
    elements=st.one_of(finite, st.sampled_from([float("inf"), float("-inf"), 1e30, -1e30, 9.99, -10.0])),
)  # fmt: skip


@SETTINGS
@given(k=big_keys, frac=st.floats(0, 1))
def test_bucket_partial_sort_gets_the_top_values(k, frac) -> None:
    n = len(k)
    m = max(1, int(frac * n))
    ok, oa, ob = np.empty(n, np.float32), np.empty(n, np.int32), np.empty(n, np.float32)
    nhave = bucket_partial_sort(k, np.arange(n, dtype=np.int32), k, n, m, ok, oa, ob)
    assert m <= nhave <= n
    # +inf and huge logits land in bucket 0 (x86 float->int), exactly like llama.cpp,
    # so only values the bucket histogram ranks correctly are compared
    ranked = k[(k > -1e9) & (k < 1e9)]
    if len(ranked) == n:
        assert np.array_equal(ok[:m], np.sort(k)[::-1][:m])
    assert np.array_equal(k[oa[:nhave]], ok[:nhave])
