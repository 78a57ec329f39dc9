"""Random numbers exactly as llama.cpp draws them (libstdc++ ``std::mt19937``).

llama.cpp seeds one ``std::mt19937`` per random sampler (dist, xtc, mirostat, ...) and
draws through libstdc++'s distributions, so seed parity needs all three pieces:

* the Mersenne Twister itself (``std::mt19937(seed)`` uses ``init_genrand``; numpy's
  ``MT19937(seed)`` hashes the seed with SeedSequence, so it yields a different stream);
* ``std::generate_canonical``: a ``double`` consumes two 32-bit draws, a ``float`` one;
* ``std::discrete_distribution``: normalised cumulative weights in double, last one
  forced to 1.0, then ``lower_bound`` of one canonical double. With fewer than two
  weights it returns 0 *without* drawing.
"""

from __future__ import annotations

import secrets

import numpy as np
from numba import njit

LLAMA_DEFAULT_SEED = 0xFFFFFFFF  # "pick a random seed"

_N = 624
_M = 397
_POS = _N  # state[_POS] holds the read position


@njit(cache=True, error_model="numpy")
def _mt_seed(state: np.ndarray, seed: int) -> None:
    state[0] = seed & 0xFFFFFFFF
    for i in range(1, _N):
        prev = state[i - 1]
        state[i] = (
            np.uint32(1812433253) * (prev ^ (prev >> np.uint32(30))) + np.uint32(i)
        ) & 0xFFFFFFFF
    state[_POS] = _N


@njit(cache=True, error_model="numpy")
def _mt_twist(state: np.ndarray) -> None:
    upper = np.uint32(0x80000000)
    lower = np.uint32(0x7FFFFFFF)
    matrix = np.uint32(0x9908B0DF)
    for i in range(_N):
        y = (state[i] & upper) | (state[(i + 1) % _N] & lower)
        v = state[(i + _M) % _N] ^ (y >> np.uint32(1))
        if y & np.uint32(1):
            v ^= matrix
        state[i] = v
    state[_POS] = 0


@njit(cache=True, error_model="numpy")
def mt_next_u32(state: np.ndarray) -> np.uint32:
    """Next tempered 32-bit output; ``state`` is uint32[625] (624 words + position)."""
    if state[_POS] >= _N:
        _mt_twist(state)
    y = state[state[_POS]]
    state[_POS] += 1
    y ^= y >> np.uint32(11)
    y ^= (y << np.uint32(7)) & np.uint32(0x9D2C5680)
    y ^= (y << np.uint32(15)) & np.uint32(0xEFC60000)
    y ^= y >> np.uint32(18)
    return y


@njit(cache=True, error_model="numpy")
def mt_canonical_double(state: np.ndarray) -> float:
    """``std::generate_canonical<double, 53>``: (u1 + u2 * 2**32) / 2**64, kept below 1."""
    u1 = np.float64(mt_next_u32(state))
    u2 = np.float64(mt_next_u32(state))
    r = (u1 + u2 * 4294967296.0) / 18446744073709551616.0
    if r >= 1.0:
        r = np.nextafter(1.0, 0.0)
    return r


@njit(cache=True, error_model="numpy")
def mt_canonical_float(state: np.ndarray) -> np.float32:
    """``std::generate_canonical<float, 24>``: float(u) / 2**32, kept below 1."""
    r = np.float32(mt_next_u32(state)) / np.float32(4294967296.0)
    if r >= np.float32(1.0):
        r = np.nextafter(np.float32(1.0), np.float32(0.0))
    return r


class Mt19937:
    """``std::mt19937`` with libstdc++'s seeding; cheap to copy (``clone``)."""

    __slots__ = ("state",)

    def __init__(self, seed: int = 5489) -> None:
        self.state = np.empty(_N + 1, dtype=np.uint32)
        _mt_seed(self.state, int(seed) & 0xFFFFFFFF)

    def seed(self, seed: int) -> None:
        _mt_seed(self.state, int(seed) & 0xFFFFFFFF)

    def next_u32(self) -> int:
        return int(mt_next_u32(self.state))

    def uniform_double(self) -> float:
        """``std::uniform_real_distribution<double>(0, 1)(rng)``."""
        return float(mt_canonical_double(self.state))

    def uniform_float(self) -> np.float32:
        """``std::uniform_real_distribution<float>(0, 1)(rng)``."""
        return mt_canonical_float(self.state)

    def clone(self) -> Mt19937:
        other = Mt19937.__new__(Mt19937)
        other.state = self.state.copy()
        return other


def rng_seed(seed: int) -> int:
    """The seed a sampler actually uses: ``LLAMA_DEFAULT_SEED`` means a fresh random one."""
    if seed == LLAMA_DEFAULT_SEED:
        return secrets.randbits(32)
    return seed & 0xFFFFFFFF


@njit(cache=True, error_model="numpy")
def _discrete_index(p: np.ndarray, size: int, u: float) -> int:
    total = 0.0
    for i in range(size):
        total += np.float64(p[i])
    cum = 0.0
    # lower_bound over the normalised partial sums; the last one is exactly 1.0
    for i in range(size - 1):
        cum += np.float64(p[i]) / total
        if not (cum < u):
            return i
    return size - 1


def discrete_distribution(p: np.ndarray, size: int, rng: Mt19937) -> int:
    """``std::discrete_distribution<int>(p, p + size)(rng)``."""
    if size < 2:
        return 0
    return int(_discrete_index(p, size, mt_canonical_double(rng.state)))
