"""Adaptive selecting samplers: mirostat v1, mirostat v2 and adaptive-p.

Each draws with ``std::discrete_distribution`` over the candidates' probabilities and
updates its target from the token it chose.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .base import Sampler, check_float, check_int, check_seed
from .candidates import TokenDataArray, cvt_int
from .rng import Mt19937, discrete_distribution, rng_seed
from .truncation import top_k

_F32_NEG_INF = np.float32(-np.inf)


@njit(cache=True, error_model="numpy")
def _mirostat_k(p, size, m, n_vocab, mu):
    """Estimate the Zipf exponent from the top ``m`` probabilities and derive top-k."""
    sum_ti_bi = np.float32(0.0)
    sum_ti_sq = np.float32(0.0)
    i = 0
    while i < m - 1 and i < size - 1:
        t_i = np.float32(math.log(np.float32(i + 2) / np.float32(i + 1)))
        b_i = np.float32(math.log(p[i] / p[i + 1]))
        sum_ti_bi += t_i * b_i
        sum_ti_sq += t_i * t_i
        i += 1
    s_hat = sum_ti_bi / sum_ti_sq
    eps = s_hat - np.float32(1.0)
    num = eps * np.float32(math.pow(np.float32(2.0), mu))
    den = np.float32(1.0) - np.float32(math.pow(np.float32(n_vocab), -eps))
    k = np.float32(math.pow(num / den, np.float32(1.0) / s_hat))
    return max(cvt_int(k), 1)


@njit(cache=True, error_model="numpy")
def _surprise(p):
    return -np.float32(math.log2(p))


@njit(cache=True, error_model="numpy")
def _mirostat_v2_cut(p, size, mu):
    for i in range(size):
        if -np.float32(math.log2(p[i])) > mu:
            return i
    return size


class _MirostatBase(Sampler):
    def __init__(self, seed: int, tau: float, eta: float) -> None:
        self.seed = check_seed("seed", seed)
        self.tau = check_float("mirostat_tau", tau)
        self.eta = check_float("mirostat_eta", eta)
        self.mu = np.float32(np.float32(2.0) * self.tau)
        self.seed_cur = rng_seed(self.seed)
        self.rng = Mt19937(self.seed_cur)

    def _select(self, cur: TokenDataArray) -> None:
        idx = discrete_distribution(cur.p, cur.size, self.rng)
        cur.selected = idx
        e = _surprise(cur.p[idx]) - self.tau
        self.mu = np.float32(self.mu - self.eta * e)

    def reset(self) -> None:
        self.mu = np.float32(np.float32(2.0) * self.tau)
        self.seed_cur = rng_seed(self.seed)
        self.rng.seed(self.seed_cur)


class Mirostat(_MirostatBase):
    """Mirostat 1.0 (Basu et al.): top-k with k adapted to keep surprise near ``tau``."""

    name = "mirostat"

    def __init__(self, n_vocab: int, seed: int, tau: float = 5.0, eta: float = 0.1, m: int = 100):
        super().__init__(seed, tau, eta)
        self.n_vocab = check_int("n_vocab", n_vocab, lo=1)
        self.m = check_int("mirostat m", m, lo=1)

    def apply(self, cur: TokenDataArray) -> None:
        cur.softmax(True)
        top_k(cur, int(_mirostat_k(cur.p, cur.size, self.m, self.n_vocab, self.mu)))
        cur.softmax(True)
        self._select(cur)


class MirostatV2(_MirostatBase):
    """Mirostat 2.0: drop candidates whose surprise exceeds ``mu``, then sample."""

    name = "mirostat-v2"

    def __init__(self, seed: int, tau: float = 5.0, eta: float = 0.1) -> None:
        super().__init__(seed, tau, eta)

    def apply(self, cur: TokenDataArray) -> None:
        cur.softmax(True)
        cur.size = max(int(_mirostat_v2_cut(cur.p, cur.size, self.mu)), 1)
        cur.softmax(True)
        self._select(cur)


_PEAK = np.float32(5.0)
_SHARPNESS = np.float32(10.0)
_INV_WIDTH = np.float32(1.0) / np.float32(0.3)


@njit(cache=True, error_model="numpy")
def _adaptive_transform(logit, p, size, target):
    for i in range(size):
        if logit[i] == _F32_NEG_INF:
            continue
        d = abs((p[i] - target) * _INV_WIDTH)
        logit[i] = _PEAK - _SHARPNESS * d * d / (np.float32(1.0) + d)


def _clamp(x: np.float32, lo: float, hi: float) -> np.float32:
    # std::clamp(v, lo, hi): (v < lo) ? lo : (hi < v) ? hi : v
    return np.float32(lo) if x < lo else (np.float32(hi) if hi < x else x)


class AdaptiveP(Sampler):
    """Adaptive-p: favour tokens whose probability is near ``target``, steering the running
    average of chosen tokens' original probabilities towards it (negative target: plain
    sampling)."""

    name = "adaptive-p"

    def __init__(self, target: float, decay: float = 0.9, seed: int = 0xFFFFFFFF) -> None:
        self.target = check_float("adaptive_target", target, hi=1.0)
        self.decay = _clamp(check_float("adaptive_decay", decay), 0.0, 0.99)
        self.seed = check_seed("seed", seed)
        self.seed_cur = rng_seed(self.seed)
        self.rng = Mt19937(self.seed_cur)
        self._init_state()

    def _init_state(self) -> None:
        one = np.float32(1.0)
        self.weighted_sum = np.float32(self.target / (one - self.decay))
        self.total_weight = np.float32(one / (one - self.decay))
        self.original_probs = np.zeros(0, np.float32)
        self.pending_token_id = -1
        self.pending_token_idx = -1

    def apply(self, cur: TokenDataArray) -> None:
        cur.softmax(False)
        if self.target < 0.0:
            cur.selected = discrete_distribution(cur.p, cur.size, self.rng)
            return
        self.original_probs = cur.p[: cur.size].copy()
        target = _clamp(self.target, 0.0, 1.0)
        if self.total_weight == 0.0:
            adapted = target
        else:
            adapted = np.float32(np.float32(2.0) * target - self.weighted_sum / self.total_weight)
        adapted = _clamp(adapted, 0.0, 1.0)
        _adaptive_transform(cur.logit, cur.p, cur.size, adapted)
        cur.softmax(False)
        idx = discrete_distribution(cur.p, cur.size, self.rng)
        cur.selected = idx
        self.pending_token_id = int(cur.id[idx])
        self.pending_token_idx = idx

    def accept(self, token: int) -> None:
        if self.pending_token_id == int(token) and self.pending_token_id != -1:
            p = self.original_probs[self.pending_token_idx]
            self.weighted_sum = np.float32(p + self.decay * self.weighted_sum)
            self.total_weight = np.float32(np.float32(1.0) + self.decay * self.total_weight)
        self.pending_token_id = -1
        self.pending_token_idx = -1

    def reset(self) -> None:
        self._init_state()
        self.seed_cur = rng_seed(self.seed)
        self.rng.seed(self.seed_cur)
