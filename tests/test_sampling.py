"""Sampler semantics on hand-checkable cases.

The cases of llama.cpp's tests/test-sampling.cpp are ported as data (their expected
probabilities come from llama.cpp), plus the random-number pieces, the chain's
interface (accept / reset / clone), n_probs reporting and token probabilities.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math

import numpy as np
import pytest

from llamacpy.sampling import (
    DRY,
    XTC,
    Dist,
    Greedy,
    LogitBias,
    MinP,
    Mirostat,
    MirostatV2,
    Mt19937,
    Penalties,
    SamplerChain,
    SamplingError,
    SamplingParams,
    Temp,
    TempExt,
    TokenDataArray,
    TopK,
    TopNSigma,
    TopP,
    Typical,
    build_sampler_chain,
    dry_sequence_breakers,
    token_probabilities,
)
from llamacpy.sampling.rng import discrete_distribution

_libm = ctypes.CDLL(ctypes.util.find_library("m"))
_libm.logf.restype = ctypes.c_float
_libm.logf.argtypes = [ctypes.c_float]


def logf(x: float) -> np.float32:
    return np.float32(_libm.logf(x))


def make_candidates(probs: list[float]) -> TokenDataArray:
    """test-sampling.cpp's sampler_tester: logit = logf(p), p = p."""
    return TokenDataArray(
        np.arange(len(probs), dtype=np.int32),
        np.array([logf(p) for p in probs], np.float32),
        np.array(probs, np.float32),
    )


def check(cur: TokenDataArray, expected: list[float]) -> None:
    assert cur.size == len(expected)
    np.testing.assert_allclose(cur.p[: cur.size], expected, atol=1e-5)


def run(probs: list[float], *samplers) -> TokenDataArray:
    cur = make_candidates(probs)
    for s in samplers:
        s.apply(cur)
    return cur


P4 = [0.1, 0.2, 0.3, 0.4]

# (sampler, probs, expected) from test-sampling.cpp's main(), each followed by dist(0)
WITH_DIST = [
    (Temp(1.0), P4, P4),
    (Temp(0.0), P4, [0.0, 0.0, 0.0, 1.0]),
    (TempExt(1.0, 0.0, 1.0), P4, P4),
    (TempExt(0.0, 0.0, 1.0), P4, [0.0, 0.0, 0.0, 1.0]),
    (TopK(1), P4, [1.0]),
    (TopK(3), P4, [0.44444, 0.33333, 0.22222]),
    (TopK(4), P4, [0.4, 0.3, 0.2, 0.1]),
    (TopK(0), P4, P4),
    (TopP(0.0), P4, [1.0]),
    (TopP(0.7), P4, [0.571429, 0.428571]),
    (TopP(0.8), P4, [0.44444, 0.33333, 0.22222]),
    (TopP(1.0), P4, P4),
    (MinP(0.00), P4, P4),
    (MinP(0.24), P4, P4),
    (MinP(0.26), P4, [0.2 / 0.9, 0.3 / 0.9, 0.4 / 0.9]),
    (MinP(0.49), P4, [0.2 / 0.9, 0.3 / 0.9, 0.4 / 0.9]),
    (MinP(0.51), P4, [0.3 / 0.7, 0.4 / 0.7]),
    (MinP(0.74), P4, [0.3 / 0.7, 0.4 / 0.7]),
    (MinP(0.76), P4, [1.0]),
    (MinP(1.00), P4, [1.0]),
    (TopNSigma(1.0), P4, [0.0, 0.0, 0.428571, 0.571429]),
    (TopNSigma(0.0), P4, P4),
    (TopNSigma(3.0), P4, P4),
]


@pytest.mark.parametrize(
    ("sampler", "probs", "expected"), WITH_DIST, ids=[repr(c[0]) for c in WITH_DIST]
)
def test_llama_cpp_sampler_cases(sampler, probs, expected) -> None:
    check(run(probs, sampler, Dist(0)), expected)


def test_min_p_above_one_keeps_the_top_token() -> None:
    # test-sampling.cpp also runs min_p = 1.05; our parameter check rejects p > 1,
    # so exercise the kernel the way llama.cpp would run it
    s = MinP(1.0)
    s.p = np.float32(1.05)
    check(run(P4, s, Dist(0)), [1.0])


@pytest.mark.parametrize(
    ("threshold", "expected"),
    [(0.09, [0.1]), (0.19, [0.2, 0.1]), (0.29, [0.3, 0.2, 0.1]), (0.39, [0.4, 0.3, 0.2, 0.1])],
)
def test_xtc(threshold, expected) -> None:
    check(run([0.4, 0.3, 0.2, 0.1], XTC(0.99, threshold, 0, 0)), expected)


@pytest.mark.parametrize(
    ("probs", "expected"),
    [([0.97, 0.01, 0.01, 0.01], [0.97]), ([0.4, 0.2, 0.2, 0.2], [0.2, 0.2, 0.2])],
)
def test_typical(probs, expected) -> None:
    check(run(probs, Typical(0.5, 0)), expected)


P5 = [0.2] * 5
PENALTY_CASES = [
    ([0], [0, 0.25, 0.25, 0.25, 0.25], 50.0, 0.0, 0.0),
    ([0, 1, 2], [0, 0, 0, 0.5, 0.5], 50.0, 0.0, 0.0),
    ([0, 1, 2, 0, 0], [0, 0, 0, 0.5, 0.5], 50.0, 0.0, 0.0),
    ([0], [0.000011, 0.249997, 0.249997, 0.249997, 0.249997], 1.0, 5.0, 5.0),
    ([0, 1, 2], [0.000023, 0.000023, 0.000023, 0.499966, 0.499966], 1.0, 5.0, 5.0),
    ([0, 1, 2, 0, 0], [0.000000, 0.000023, 0.000023, 0.499977, 0.499977], 1.0, 5.0, 5.0),
]


@pytest.mark.parametrize(("last", "expected", "repeat", "freq", "present"), PENALTY_CASES)
def test_penalties(last, expected, repeat, freq, present) -> None:
    s = Penalties(len(last), repeat, freq, present)
    for t in last:
        s.accept(t)
    check(run(P5, s, Dist(0)), expected)


DRY_CASES = [
    ([0.25] * 4, [0, 1], [0.25] * 4, 1.0, 1.1, 2, 4, []),
    ([0.25] * 4, [0, 1, 2, 0, 1], [0.296923, 0.296923, 0.109232, 0.296923], 1.0, 1.1, 2, 5, []),
    (P5, [0, 1, 3, 4, 0, 1], P5, 1.0, 1.1, 2, 6, [[3]]),
    (P5, [0, 1, 2, 0, 1], [0.241818, 0.241818, 0.032727, 0.241818, 0.241818], 2.0, 1.1, 2, 5, []),
    (P5, [0, 1, 2, 3, 4, 0, 1], P5, 1.0, 1.1, 4, 7, []),
]


@pytest.mark.parametrize(
    ("probs", "last", "expected", "mult", "base", "allowed", "last_n", "breakers"), DRY_CASES
)
def test_dry(probs, last, expected, mult, base, allowed, last_n, breakers) -> None:
    s = DRY(mult, base, allowed, last_n, breakers)
    for t in last:
        s.accept(t)
    check(run(probs, s, Dist(0)), expected)


def queue_candidates(n_vocab: int) -> TokenDataArray:
    logits = np.array([logf(float(i)) for i in range(n_vocab)], np.float32)
    return TokenDataArray(np.arange(n_vocab, dtype=np.int32), logits)


QUEUE = [
    ("k", 10000, 1.0, 1.0), ("k", 1, 1.0, 1.0), ("p", 10000, 1.0, 1.0), ("p", 10000, 0.0, 1.0),
    ("m", 10000, 1.0, 1.0), ("m", 10000, 1.0, 1e-12), ("k", 100, 1.0, 1.0), ("p", 10000, 0.0003, 1.0),
    ("p", 10000, 0.8, 1.0), ("m", 10000, 1.0, 9997.9 / 9999.0), ("m", 10000, 1.0, 0.1),
    ("kp", 100, 0.8, 0.1), ("km", 100, 0.8, 0.1), ("pk", 100, 0.8, 0.1), ("pm", 100, 0.8, 0.1),
    ("mk", 100, 0.8, 0.1), ("mp", 100, 0.8, 9997.9 / 9999.0), ("mp", 100, 0.8, 0.1),
    ("kpm", 100, 0.8, 0.1), ("kmp", 100, 0.8, 0.1), ("pkm", 100, 0.8, 0.1), ("pmk", 100, 0.8, 0.1),
    ("mkp", 100, 0.8, 0.1), ("mpk", 100, 0.8, 0.1),
]  # fmt: skip


@pytest.mark.parametrize(("seq", "top_k", "top_p", "min_p"), QUEUE)
def test_sampler_queue(seq, top_k, top_p, min_p) -> None:
    """test-sampling.cpp's test_sampler_queue with n_vocab = 10000, logits = logf(id)."""
    n_vocab = 10000
    cur = queue_candidates(n_vocab)
    min_id, max_id = 0, n_vocab - 1
    for s in seq:
        sampler = {"k": TopK(top_k), "p": TopP(top_p, 1), "m": MinP(min_p, 1)}[s]
        sampler.apply(cur)
        Dist(0).apply(cur)
        size = cur.size
        if s == "k":
            expected = min(size, top_k)
            min_id = max(min_id, n_vocab - top_k)
            assert size == expected
            assert cur.id[0] == max_id and cur.id[expected - 1] == min_id
        elif s == "p":
            divisor = n_vocab * (n_vocab - 1) // 2 - min_id * (min_id - 1) // 2
            target = math.ceil(np.float32(top_p) * np.float32(divisor))
            min_id, expected, cumsum = n_vocab, 0, 0
            while True:
                min_id -= 1
                expected += 1
                cumsum += min_id
                if cumsum >= target:
                    break
            if min_id == 1:
                min_id -= 1
                expected += 1
            assert size == expected
            assert not cur.sorted or (cur.id[0] == max_id and cur.id[expected - 1] == min_id)
        else:
            expected = max(math.ceil(np.float32(1.0 - np.float32(min_p)) * n_vocab), 1)
            expected = min(expected, size)
            min_id = max(math.floor(np.float32(min_p) * n_vocab), 1)
            min_id = min(max(min_id, n_vocab - size), n_vocab - 1)
            assert size == expected
            assert not cur.sorted or (cur.id[0] == max_id and cur.id[expected - 1] == min_id)


def sample_dist(s: Dist, logits: list[float]) -> int:
    cur = TokenDataArray.from_logits(np.array(logits, np.float32))
    s.apply(cur)
    assert 0 <= cur.selected < cur.size
    return int(cur.id[cur.selected])


def test_dist_draws_once_even_for_a_single_candidate() -> None:
    singleton, control = Dist(4242), Dist(4242)
    sample_dist(singleton, [0.0])
    sample_dist(control, [0.0, 0.0])
    for _ in range(4):
        assert sample_dist(singleton, [0.0] * 256) == sample_dist(control, [0.0] * 256)


def test_mt19937_matches_the_cxx_standard() -> None:
    r = Mt19937()  # default seed 5489: the standard requires the 10000th output
    for _ in range(9999):
        r.next_u32()
    assert r.next_u32() == 4123659995
    r = Mt19937(42)
    assert [r.next_u32() for _ in range(3)] == [1608637542, 3421126067, 4083286876]
    # libstdc++ canonical conversions (printed by a g++ 12 program)
    r = Mt19937(42)
    assert r.uniform_double() == 0.796542984287846
    assert r.uniform_float() == np.float32(0.95071429)


def test_mt19937_is_numpys_core_with_init_genrand_seeding() -> None:
    state = np.random.RandomState(1234).get_state()  # legacy seeding = init_genrand
    bg = np.random.MT19937()
    bg.state = {"bit_generator": "MT19937", "state": {"key": state[1], "pos": state[2]}}
    r = Mt19937(1234)
    assert [r.next_u32() for _ in range(1000)] == bg.random_raw(1000).tolist()


def test_discrete_distribution() -> None:
    r = Mt19937(1)
    assert discrete_distribution(np.array([1.0], np.float32), 1, r) == 0
    assert r.next_u32() == Mt19937(1).next_u32()  # one weight: no draw
    r = Mt19937(5)
    u = Mt19937(5).uniform_double()
    p = np.array([0.25, 0.25, 0.5], np.float32)
    assert discrete_distribution(p, 3, r) == int(np.searchsorted([0.25, 0.5, 1.0], u))


def test_greedy_picks_the_first_maximum() -> None:
    cur = TokenDataArray.from_logits(np.array([1.0, 3.0, 2.0, 3.0], np.float32))
    Greedy().apply(cur)
    assert cur.selected == 1


def test_logit_bias_direct_and_shuffled() -> None:
    cur = TokenDataArray.from_logits(np.zeros(5, np.float32))
    LogitBias(5, [(1, 2.0), (1, 1.0), (4, -np.inf), (9, 5.0)]).apply(cur)
    assert cur.logit.tolist() == [0.0, 3.0, 0.0, 0.0, -np.inf]
    cur = TokenDataArray(np.array([4, 3, 1], np.int32), np.zeros(3, np.float32))
    LogitBias(5, {1: 2.0, 4: -1.0}).apply(cur)
    assert cur.logit.tolist() == [-1.0, 0.0, 2.0]


def test_penalty_window_forgets_old_tokens() -> None:
    s = Penalties(2, 2.0)
    for t in (0, 1, 2):
        s.accept(t)
    assert s.token_count == {1: 1, 2: 1}
    cur = TokenDataArray.from_logits(np.array([4.0, 4.0, -4.0], np.float32))
    s.apply(cur)
    assert cur.logit.tolist() == [4.0, 2.0, -8.0]


def test_dry_sequence_breakers_from_strings() -> None:
    pieces = {0: b"a:b", 1: b"x\n", 2: b"hello ", 3: b"an", 4: b"and", 5: b"zz", 6: b" a"}
    toks = {b"and": [4], b"nd": [7], b"d": [8]}
    got = dry_sequence_breakers([":", " and", ""], 7, pieces.__getitem__, toks.__getitem__)
    # ':' inside token 0; token 2 ends with ' ' (prefix of ' and'), token 6 ends with ' a'
    assert sorted(got) == sorted([(0,), (2, 4), (6, 7)])


def test_chain_clone_continues_identically_and_reset_replays() -> None:
    rng = np.random.default_rng(0)
    rows = [rng.standard_normal(300).astype(np.float32) * 2 for _ in range(20)]
    params = SamplingParams.create(
        seed=9, penalty_repeat=1.3, xtc_probability=0.5, xtc_threshold=0.05
    )
    chain = build_sampler_chain(params, 300)
    first = [chain.sample(r) for r in rows[:10]]
    twin = chain.clone()
    assert [chain.sample(r) for r in rows[10:]] == [twin.sample(r) for r in rows[10:]]
    chain.reset()
    assert [chain.sample(r) for r in rows[:10]] == first


def test_mirostat_state_is_cloned() -> None:
    rng = np.random.default_rng(1)
    rows = [rng.standard_normal(100).astype(np.float32) * 3 for _ in range(12)]
    for s in (Mirostat(100, 5, 3.0, 0.3), MirostatV2(5, 3.0, 0.3)):
        chain = SamplerChain([s])
        for r in rows[:6]:
            chain.sample(r)
        twin = chain.clone()
        assert s.mu != np.float32(6.0)
        assert [chain.sample(r) for r in rows[6:]] == [twin.sample(r) for r in rows[6:]]


def test_chain_without_a_selecting_sampler_is_a_clear_error() -> None:
    with pytest.raises(SamplingError, match="selected no token"):
        SamplerChain([TopK(5)]).sample(np.zeros(10, np.float32))


def test_sample_with_probs_reports_post_chain_probabilities() -> None:
    logits = np.log(np.array([0.1, 0.5, 0.05, 0.3, 0.05], np.float32))
    chain = SamplerChain([TopK(3), Dist(3)])
    res = chain.sample_with_probs(logits, n_probs=5)
    assert [t.token for t in res.top] == [1, 3, 0]
    np.testing.assert_allclose([t.p for t in res.top], [0.5 / 0.9, 0.3 / 0.9, 0.1 / 0.9], rtol=1e-6)
    assert res.p == next(t.p for t in res.top if t.token == res.token)
    assert math.isclose(res.top[0].logprob, math.log(0.5 / 0.9), rel_tol=1e-6)


def test_probs_sorts_unsorted_candidates_and_drops_zeros() -> None:
    chain = SamplerChain([Temp(0.0), Dist(1)])  # temp 0 leaves one candidate with p = 1
    chain.sample(np.array([0.5, 2.0, 1.0], np.float32))
    assert [(t.token, t.p) for t in chain.probs(3)] == [(1, 1.0)]
    assert chain.cur is not None and chain.cur.id[chain.cur.selected] == 1


def test_token_probabilities_pre_sampling() -> None:
    logits = np.array([1.0, 3.0, 2.0], np.float32)
    top = token_probabilities(logits, 2)
    e = np.exp(logits - 3.0)
    assert [t.token for t in top] == [1, 2]
    np.testing.assert_allclose([t.p for t in top], (e / e.sum())[[1, 2]], rtol=1e-6)
    assert token_probabilities(logits, 0) == ()


def test_nan_logits_are_a_clear_error() -> None:
    row = np.zeros(10, np.float32)
    row[7] = np.nan
    with pytest.raises(SamplingError, match=r"NaN \(token 7\)"):
        build_sampler_chain(SamplingParams(seed=1), 10).sample(row)


def test_empty_inputs() -> None:
    with pytest.raises(SamplingError, match="non-empty"):
        build_sampler_chain(SamplingParams(seed=1), 10).sample(np.zeros(0, np.float32))
    cur = TokenDataArray(np.zeros(0, np.int32), np.zeros(0, np.float32))
    for s in (TopK(5), Greedy(), Dist(1), MinP(0.1), Temp(0.5)):
        s.apply(cur)
    assert cur.size == 0 and cur.selected == -1


def test_repr_shows_configuration() -> None:
    chain = build_sampler_chain(SamplingParams(seed=5, top_k=7), 100)
    text = repr(chain)
    assert "TopK(k=7)" in text and "Dist(seed=5, seed_cur=5)" in text
    assert chain.seed == 5
