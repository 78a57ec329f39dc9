"""Threads inside one compiled call: a parallel region of ``n_threads`` workers and a barrier.

A decode step runs as one numba call: ``for tid in prange(n_threads): worker(tid, ...)``
starts one worker per thread (numba's pool splits ``n_threads`` iterations over as many
threads, one each), and the workers meet at :func:`barrier` between dependent stages
(matmul, then attention, ...). That costs one parallel-region launch per step instead of one
per operation. The barrier spins with a pause hint, then yields the CPU, so a preempted
thread on a busy machine is not starved by its spinning partner.

``state`` is an int64 array of at least :data:`BARRIER_WORDS` words, zeroed before the region.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..simd import atomic_add, atomic_load, atomic_store, cpu_relax, cycles, sched_yield

BARRIER_WORDS = 32  # count and generation on separate cache lines
_SPINS_BEFORE_YIELD = 2000


def new_barrier() -> np.ndarray:
    return np.zeros(BARRIER_WORDS, dtype=np.int64)


@njit(cache=True, inline="always")
def barrier(state, n_threads):
    """Wait until all ``n_threads`` workers have arrived (full memory fence)."""
    if n_threads == 1:
        return
    gen = atomic_load(state, 16)
    if atomic_add(state, 0, 1) == n_threads - 1:
        atomic_store(state, 0, 0)
        atomic_add(state, 16, 1)
    else:
        spins = 0
        while atomic_load(state, 16) == gen:
            cpu_relax()
            spins += 1
            if spins >= _SPINS_BEFORE_YIELD:
                sched_yield()
                spins = 0


@njit(cache=True, inline="always")
def tick(prof, tid, stage, t0):
    """Add the cycles since ``t0`` to ``prof[tid, stage]``; returns the new time stamp."""
    t = cycles()
    prof[tid, stage] += t - t0
    return t


@njit(cache=True, inline="always")
def timed_barrier(state, n_threads, prof, tid, t0):
    """:func:`barrier`, its waiting time counted in ``prof[tid, WAIT]``."""
    barrier(state, n_threads)
    return tick(prof, tid, WAIT, t0)


WAIT = 15  # profile slot of barrier waits


@njit(cache=True, inline="always")
def split(n, tid, n_threads):
    """The range ``[lo, hi)`` of ``n`` items that worker ``tid`` owns (contiguous, balanced)."""
    base = n // n_threads
    rem = n % n_threads
    lo = tid * base + min(tid, rem)
    hi = lo + base + (1 if tid < rem else 0)
    return lo, hi
