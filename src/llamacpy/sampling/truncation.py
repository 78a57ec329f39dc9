"""Truncating samplers: top-k, top-p, min-p, typical, top-n-sigma, XTC."""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .base import Sampler, check_float, check_int, check_seed
from .candidates import TokenDataArray, partial_sort_inplace
from .rng import Mt19937, rng_seed
from .sort import bucket_partial_sort, std_sort

_F32_NEG_INF = np.float32(-np.inf)
_F32_MAX = np.float32(np.finfo(np.float32).max)


class TopK(Sampler):
    """Keep the ``k`` highest logits, sorted (``k <= 0`` disables)."""

    name = "top-k"

    def __init__(self, k: int) -> None:
        self.k = check_int("top_k", k)

    @property
    def is_noop(self) -> bool:
        return self.k <= 0

    def apply(self, cur: TokenDataArray) -> None:
        top_k(cur, self.k)


def top_k(cur: TokenDataArray, k: int) -> None:
    """``llama_sampler_top_k_impl``."""
    if k <= 0:
        return
    k = min(k, cur.size)
    if not cur.sorted:
        cur.partial_sort(k)
    cur.size = k


@njit(cache=True, error_model="numpy")
def _top_p_kernel(logit, id, p, size, is_sorted, top_p, min_keep):
    k = size
    use_buf = False
    bl, bi, bp = logit, id, p
    if not is_sorted and size > 1024:
        # adaptive: sort only the top 256 first, everything if they do not reach top_p
        k = min(256, size)
        bl = np.empty(size, np.float32)
        bi = np.empty(size, np.int32)
        bp = np.empty(size, np.float32)
        bucket_partial_sort(logit, id, p, size, k, bl, bi, bp)
        use_buf = True
    elif not is_sorted:
        partial_sort_inplace(logit, id, p, size, size)
    cum = np.float32(0.0)
    last_idx = size
    for i in range(size):
        cum += bp[i]
        if cum >= top_p and i + 1 >= min_keep:
            last_idx = i + 1
            break
        if use_buf and i == k - 1 and k < size:
            k = size
            bucket_partial_sort(logit, id, p, size, k, bl, bi, bp)
    if use_buf:
        logit[:last_idx] = bl[:last_idx]
        id[:last_idx] = bi[:last_idx]
        p[:last_idx] = bp[:last_idx]
    return last_idx


class _ProbabilityMass(Sampler):
    """A sampler keeping candidates up to a probability mass ``p`` (at least ``min_keep`` of
    them; ``p >= 1`` disables it): ``param`` names ``p`` in errors, :meth:`_truncate` keeps."""

    param = "p"

    def __init__(self, p: float, min_keep: int = 0) -> None:
        self.p = check_float(self.param, p, lo=0.0, hi=1.0)
        self.min_keep = check_int("min_keep", min_keep, lo=0)

    @property
    def is_noop(self) -> bool:
        return bool(self.p >= 1.0)

    def apply(self, cur: TokenDataArray) -> None:
        if not self.is_noop:
            self._truncate(cur)

    def _truncate(self, cur: TokenDataArray) -> None:
        raise NotImplementedError


class TopP(_ProbabilityMass):
    """Nucleus sampling: the smallest prefix (by probability) reaching ``p``, at least ``min_keep``."""

    name = "top-p"
    param = "top_p"

    def _truncate(self, cur: TokenDataArray) -> None:
        cur.softmax(False)
        last = _top_p_kernel(cur.logit, cur.id, cur.p, cur.size, cur.sorted, self.p, self.min_keep)
        cur.sorted = True
        cur.size = int(last)


@njit(cache=True, error_model="numpy")
def _min_p_kernel(logit, id, p, size, is_sorted, min_p, min_keep):
    log_p = np.float32(math.log(min_p))
    if not is_sorted:
        max_l = -_F32_MAX
        for i in range(size):
            if max_l < logit[i]:
                max_l = logit[i]
        min_logit = max_l + log_p
        count = 0
        for i in range(size):
            if logit[i] >= min_logit:
                count += 1
        if count > 0 and count >= min_keep:
            w = 0
            for i in range(size):
                if logit[i] >= min_logit:
                    logit[w], id[w], p[w] = logit[i], id[i], p[i]
                    w += 1
            return count, False
        partial_sort_inplace(logit, id, p, size, size)
    min_logit = logit[0] + log_p
    i = 1
    while i < size:
        if logit[i] < min_logit and i >= min_keep:
            break
        i += 1
    return i, True


class MinP(Sampler):
    """Keep candidates whose probability is at least ``p`` times the top one's."""

    name = "min-p"

    def __init__(self, p: float, min_keep: int = 0) -> None:
        self.p = check_float("min_p", p, lo=0.0, hi=1.0)
        self.min_keep = check_int("min_keep", min_keep, lo=0)

    @property
    def is_noop(self) -> bool:
        return bool(self.p <= 0.0)

    def apply(self, cur: TokenDataArray) -> None:
        if self.p <= 0.0 or cur.size == 0:
            return
        size, now_sorted = _min_p_kernel(
            cur.logit, cur.id, cur.p, cur.size, cur.sorted, self.p, self.min_keep
        )
        cur.size = int(size)
        cur.sorted = cur.sorted or bool(now_sorted)


@njit(cache=True, error_model="numpy")
def _typical_kernel(logit, id, p, size, typ_p, min_keep):
    entropy = np.float32(0.0)
    for i in range(size):
        entropy += -p[i] * np.float32(math.log(p[i]))
    shifted = np.empty(size, np.float32)
    for i in range(size):
        shifted[i] = abs(-np.float32(math.log(p[i])) - entropy)
    idx = np.arange(size).astype(np.int32)
    dummy = np.empty(size, np.float32)
    std_sort(shifted, idx, dummy, np.int64(0), size, np.bool_(False))
    cum = np.float32(0.0)
    last_idx = size
    for i in range(size):
        cum += p[idx[i]]
        if cum > typ_p and (min_keep == 0 or i >= min_keep - 1):
            last_idx = i + 1
            break
    nl = np.empty(last_idx, np.float32)
    ni = np.empty(last_idx, np.int32)
    npp = np.empty(last_idx, np.float32)
    for i in range(last_idx):
        j = idx[i]
        nl[i], ni[i], npp[i] = logit[j], id[j], p[j]
    logit[:last_idx] = nl
    id[:last_idx] = ni
    p[:last_idx] = npp
    return last_idx


class Typical(_ProbabilityMass):
    """Locally typical sampling: candidates whose surprise is closest to the entropy."""

    name = "typical"
    param = "typ_p"

    def _truncate(self, cur: TokenDataArray) -> None:
        cur.softmax(True)
        cur.size = int(_typical_kernel(cur.logit, cur.id, cur.p, cur.size, self.p, self.min_keep))
        cur.sorted = False


@njit(cache=True, error_model="numpy")
def _top_n_sigma_kernel(logit, size, n):
    mx = logit[0]
    total = np.float32(0.0)
    valid = 0
    for i in range(size):
        if logit[i] != _F32_NEG_INF:
            if mx < logit[i]:
                mx = logit[i]
            total += logit[i]
            valid += 1
    mean = total / np.float32(valid) if valid > 0 else np.float32(0.0)
    acc = np.float32(0.0)
    for i in range(size):
        if logit[i] != _F32_NEG_INF:
            d = np.float64(logit[i] - mean)
            acc = np.float32(np.float64(acc) + d * d)  # float += pow(double, 2)
    std = np.float32(math.sqrt(acc / np.float32(valid))) if valid > 0 else np.float32(0.0)
    cut = mx - n * std
    for i in range(size):
        if logit[i] < cut:
            logit[i] = _F32_NEG_INF


class TopNSigma(Sampler):
    """Mask logits more than ``n`` standard deviations below the maximum (``n <= 0`` disables)."""

    name = "top-n-sigma"

    def __init__(self, n: float) -> None:
        self.n = check_float("top_n_sigma", n)

    @property
    def is_noop(self) -> bool:
        return bool(self.n <= 0.0)

    def apply(self, cur: TokenDataArray) -> None:
        if self.n <= 0.0 or cur.size <= 1:
            return
        _top_n_sigma_kernel(cur.logit, cur.size, self.n)


@njit(cache=True, error_model="numpy")
def _xtc_cut(p, size, threshold):
    pos_last = 0
    for i in range(size):
        if p[i] >= threshold:
            pos_last = i
        else:
            break
    return pos_last


class XTC(Sampler):
    """Exclude Top Choices: with chance ``probability``, drop all but the least likely of
    the candidates above ``threshold`` (``threshold > 0.5`` disables)."""

    name = "xtc"

    def __init__(
        self, probability: float, threshold: float, min_keep: int = 0, seed: int = 0xFFFFFFFF
    ):
        self.probability = check_float("xtc_probability", probability, lo=0.0, hi=1.0)
        self.threshold = check_float("xtc_threshold", threshold, lo=0.0, hi=1.0)
        self.min_keep = check_int("min_keep", min_keep, lo=0)
        self.seed = check_seed("seed", seed)
        self.seed_cur = rng_seed(self.seed)
        self.rng = Mt19937(self.seed_cur)

    @property
    def is_noop(self) -> bool:
        return bool(self.probability <= 0.0 or self.threshold > 0.5)

    def apply(self, cur: TokenDataArray) -> None:
        if self.probability <= 0.0 or self.threshold > 0.5 or cur.size < 2:
            return
        if self.rng.uniform_float() > self.probability:
            return
        cur.softmax(True)
        pos_last = int(_xtc_cut(cur.p, cur.size, self.threshold))
        if cur.size - pos_last >= self.min_keep and pos_last > 0:
            cur.shift(pos_last)

    def reset(self) -> None:
        self.seed_cur = rng_seed(self.seed)
        self.rng.seed(self.seed_cur)
