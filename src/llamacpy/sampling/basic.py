"""Selecting and rescaling samplers: greedy, dist, temperature (plain and dynamic), logit bias."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import numpy as np
from numba import njit

from .base import Sampler, check_float, check_int, check_seed, invalid
from .candidates import TokenDataArray, max_logit, temp_kernel
from .rng import Mt19937, rng_seed


@njit(cache=True, error_model="numpy")
def _greedy_kernel(logit, size):
    sel = 0
    for i in range(1, size):
        if logit[i] > logit[sel]:
            sel = i
    return sel


@njit(cache=True, error_model="numpy")
def _dist_kernel(logit, p, size, sorted, rnd):
    """Softmax and the inverse-CDF draw in one pass (llama.cpp's ``#if 1`` branch)."""
    max_l = max_logit(logit, size, sorted)
    sum_cum = 0.0
    for i in range(size):
        e = np.float32(math.exp(logit[i] - max_l))
        p[i] = e
        sum_cum += np.float64(e)
    sum_tgt = sum_cum * rnd
    sum_run = 0.0
    selected = size - 1  # llama.cpp's fallback when nothing reaches the target
    found = False
    for i in range(size):
        if not found:
            sum_run += np.float64(p[i])
            if sum_run >= sum_tgt:
                selected = i
                found = True
        p[i] = np.float32(np.float64(p[i]) / sum_cum)
    return selected


class Greedy(Sampler):
    """Select the first candidate with the highest logit."""

    name = "greedy"

    def apply(self, cur: TokenDataArray) -> None:
        if cur.size > 0:
            cur.selected = int(_greedy_kernel(cur.logit, cur.size))


class Dist(Sampler):
    """Select a candidate at random from softmax(logits), with a seeded ``std::mt19937``.

    ``seed=0xFFFFFFFF`` (LLAMA_DEFAULT_SEED, or -1) draws a random seed; ``seed_cur`` is
    the one in use. Exactly one ``uniform_real_distribution<double>`` draw per call.
    """

    name = "dist"

    def __init__(self, seed: int = 0xFFFFFFFF) -> None:
        self.seed = check_seed("seed", seed)
        self.seed_cur = rng_seed(self.seed)
        self.rng = Mt19937(self.seed_cur)

    def apply(self, cur: TokenDataArray) -> None:
        if cur.size == 0:
            cur.selected = -1
            return
        rnd = self.rng.uniform_double()
        if cur.size == 1:
            cur.selected = 0
            cur.p[0] = 1.0
            return
        cur.selected = int(_dist_kernel(cur.logit, cur.p, cur.size, cur.sorted, rnd))

    def reset(self) -> None:
        self.seed_cur = rng_seed(self.seed)
        self.rng.seed(self.seed_cur)


class Temp(Sampler):
    """Divide logits by ``temp``; ``temp <= 0`` keeps only the (first) maximum."""

    name = "temp"

    def __init__(self, temp: float) -> None:
        self.temp = check_float("temp", temp, allow_inf=False)

    @property
    def is_noop(self) -> bool:
        return bool(self.temp == 1.0)

    def apply(self, cur: TokenDataArray) -> None:
        if self.temp != 1.0:
            temp_kernel(cur.logit, cur.size, self.temp)


@njit(cache=True, error_model="numpy")
def _temp_ext_kernel(logit, p, size, min_temp, max_temp, exponent):
    # called on sorted candidates with p = softmax(logit)
    max_entropy = -np.float32(math.log(np.float32(1.0) / np.float32(size)))
    entropy = np.float32(0.0)
    for i in range(size):
        prob = p[i]
        if prob > 0.0:
            entropy -= prob * np.float32(math.log(prob))
    normalized = entropy / max_entropy
    dyn_temp = min_temp + (max_temp - min_temp) * np.float32(math.pow(normalized, exponent))
    temp_kernel(logit, size, dyn_temp)
    max_l = np.float64(logit[0])
    cum = 0.0
    for i in range(size):
        e = math.exp(np.float64(logit[i]) - max_l)
        p[i] = np.float32(e)
        cum += e
    for i in range(size):
        p[i] = np.float32(np.float64(p[i]) / cum)


class TempExt(Sampler):
    """Temperature with llama.cpp's dynamic range (``dynatemp_range``/``dynatemp_exponent``).

    With ``delta > 0`` the temperature moves in [temp - delta, temp + delta] with the
    normalised entropy of the candidates raised to ``exponent``.
    """

    name = "temp-ext"

    def __init__(self, temp: float, delta: float = 0.0, exponent: float = 1.0) -> None:
        self.temp = check_float("temp", temp)
        self.delta = check_float("dynatemp_range", delta)
        self.exponent = check_float("dynatemp_exponent", exponent)

    @property
    def is_noop(self) -> bool:
        return bool(self.temp == 1.0 and self.delta <= 0.0)

    def apply(self, cur: TokenDataArray) -> None:
        if self.delta > 0:
            if cur.size <= 1:
                return
            min_temp = max(np.float32(0.0), np.float32(self.temp - self.delta))
            max_temp = np.float32(self.temp + self.delta)
            cur.softmax(True)
            _temp_ext_kernel(cur.logit, cur.p, cur.size, min_temp, max_temp, self.exponent)
        elif self.temp != 1.0:
            temp_kernel(cur.logit, cur.size, self.temp)


@njit(cache=True, error_model="numpy")
def _logit_bias_kernel(id, logit, size, tokens, biases):
    n = len(tokens)
    search = np.zeros(n, np.bool_)
    any_search = False
    for j in range(n):
        t = tokens[j]
        if t >= 0 and size > t and id[t] == t:
            logit[t] += biases[j]
        else:
            search[j] = True
            any_search = True
    if not any_search:
        return
    for i in range(size):
        for j in range(n):
            if search[j] and id[i] == tokens[j]:
                logit[i] += biases[j]
                break


class LogitBias(Sampler):
    """Add a bias to chosen tokens' logits (``-inf`` bans a token).

    ``bias`` maps token id to bias, or is a sequence of ``(token, bias)`` pairs (repeated
    tokens add up, as in llama.cpp).
    """

    name = "logit-bias"

    def __init__(
        self, n_vocab: int, bias: Mapping[int, float] | Iterable[tuple[int, float]]
    ) -> None:
        self.n_vocab = check_int("n_vocab", n_vocab, lo=0)
        pairs = list(bias.items()) if isinstance(bias, Mapping) else list(bias)
        tokens, biases = [], []
        for item in pairs:
            try:
                tok, b = item
            except (TypeError, ValueError):
                raise invalid("logit_bias", item, "entries must be (token, bias) pairs") from None
            tokens.append(check_int("logit_bias token", tok))
            fb = float(check_float("logit_bias bias", b, allow_inf=True))
            if fb == math.inf:
                raise invalid("logit_bias bias", b, "+inf is not a bias (use a large finite value)")
            biases.append(fb)
        self.tokens = np.array(tokens, dtype=np.int32)
        self.biases = np.array(biases, dtype=np.float32)

    @property
    def is_noop(self) -> bool:
        return len(self.tokens) == 0

    def apply(self, cur: TokenDataArray) -> None:
        if len(self.tokens):
            _logit_bias_kernel(cur.id, cur.logit, cur.size, self.tokens, self.biases)
