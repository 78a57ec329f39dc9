"""The candidate array samplers work on (llama.cpp's ``llama_token_data_array``) and the
shared kernels: partial sort, softmax, temperature.

Arithmetic follows llama-sampler.cpp operation by operation in float32 (double where it
uses double), and transcendental functions run in numba, which calls the C library's
``expf``/``logf`` like llama.cpp does (numpy's SIMD ``exp`` differs in the last bit).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .sort import bucket_partial_sort, partial_sort_top

_F32_NEG_INF = np.float32(-np.inf)


class TokenDataArray:
    """Candidates as parallel arrays: ``id`` (int32), ``logit`` and ``p`` (float32).

    Only the first ``size`` entries are live. ``sorted`` means ordered by descending
    logit; ``selected`` is the index (not the token id) a selecting sampler picked, or -1.
    Samplers may replace the arrays (XTC drops a prefix, top-p copies a sorted buffer).
    """

    __slots__ = ("id", "logit", "p", "selected", "size", "sorted")

    def __init__(self, id: np.ndarray, logit: np.ndarray, p: np.ndarray | None = None) -> None:
        self.id = np.ascontiguousarray(id, dtype=np.int32)
        self.logit = np.ascontiguousarray(logit, dtype=np.float32)
        self.p = (
            np.zeros(len(self.id), np.float32) if p is None else np.ascontiguousarray(p, np.float32)
        )
        if not (len(self.id) == len(self.logit) == len(self.p)):
            raise ValueError("id, logit and p must have the same length")
        self.size = len(self.id)
        self.sorted = False
        self.selected = -1

    @classmethod
    def from_logits(cls, logits: np.ndarray, workspace: Workspace | None = None) -> TokenDataArray:
        """Token ``i`` gets logit ``logits[i]`` (one row of the model's output), p = 0.

        With a ``workspace`` its buffers are reused (no allocation, no page faults).
        Raises ValueError for NaN logits (a broken model output, not a distribution).
        """
        logits = np.asarray(logits)
        if logits.ndim != 1 or len(logits) == 0:
            raise ValueError(f"logits must be one non-empty row (1-D), got shape {logits.shape}")
        if logits.dtype != np.float32 or not logits.flags.c_contiguous:
            logits = np.ascontiguousarray(logits, dtype=np.float32)
        n = len(logits)
        ws = workspace if workspace is not None else Workspace()
        ids, lg, p = ws.buffers(n)
        bad = _fill_kernel(logits, ids, lg, p)
        if bad >= 0:
            raise ValueError(f"logits contain NaN (token {bad}): the model output is broken")
        cur = cls.__new__(cls)
        cur.id, cur.logit, cur.p = ids, lg, p
        cur.size, cur.sorted, cur.selected = n, False, -1
        return cur

    def copy(self) -> TokenDataArray:
        other = TokenDataArray.__new__(TokenDataArray)
        other.id = self.id[: self.size].copy()
        other.logit = self.logit[: self.size].copy()
        other.p = self.p[: self.size].copy()
        other.size, other.sorted, other.selected = self.size, self.sorted, self.selected
        return other

    def shift(self, n: int) -> None:
        """Drop the first ``n`` candidates (``cur_p->data += n``), keeping the order."""
        self.id, self.logit, self.p = self.id[n:], self.logit[n:], self.p[n:]
        self.size -= n
        if self.selected >= 0:
            self.selected -= n

    def replace(self, id: np.ndarray, logit: np.ndarray, p: np.ndarray, size: int) -> None:
        self.id, self.logit, self.p, self.size = id, logit, p, size

    def partial_sort(self, npartial: int) -> None:
        """Keep the top ``npartial`` candidates, sorted (``..._partial_sort_inplace``)."""
        partial_sort_inplace(self.logit, self.id, self.p, self.size, npartial)
        self.size = npartial
        self.sorted = True

    def softmax(self, do_sort: bool) -> None:
        """``llama_sampler_softmax_impl``: sort first if asked, then p = softmax(logit)."""
        if self.size == 0:
            raise ValueError("softmax of an empty candidate array")
        if do_sort and not self.sorted:
            self.partial_sort(self.size)
        softmax_kernel(self.logit, self.p, self.size, self.sorted)

    def token_id(self, index: int) -> int:
        return int(self.id[index])

    def __len__(self) -> int:
        return self.size

    def __repr__(self) -> str:
        head = ", ".join(
            f"{int(self.id[i])}:{float(self.logit[i]):.4g}/{float(self.p[i]):.4g}"
            for i in range(min(self.size, 6))
        )
        more = ", ..." if self.size > 6 else ""
        return f"TokenDataArray(size={self.size}, sorted={self.sorted}, selected={self.selected}, [{head}{more}])"


class Workspace:
    """Reusable candidate buffers for one sampler chain (grown on demand)."""

    __slots__ = ("id", "logit", "p")

    def __init__(self) -> None:
        self.id = np.empty(0, np.int32)
        self.logit = np.empty(0, np.float32)
        self.p = np.empty(0, np.float32)

    def buffers(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if len(self.id) < n:
            self.id = np.empty(n, np.int32)
            self.logit = np.empty(n, np.float32)
            self.p = np.empty(n, np.float32)
        return self.id[:n], self.logit[:n], self.p[:n]


@njit(cache=True, error_model="numpy")
def _fill_kernel(row, id, logit, p):
    """id = arange, logit = row, p = 0; returns the first NaN position or -1."""
    nan = False
    for i in range(len(row)):  # kept branch-free so that it vectorises
        x = row[i]
        id[i] = i
        logit[i] = x
        p[i] = 0.0
        nan |= x != x
    if nan:
        for i in range(len(row)):
            if row[i] != row[i]:
                return i
    return -1


@njit(cache=True, error_model="numpy")
def partial_sort_inplace(logit, id, p, size, npartial):
    """Top ``npartial`` of the first ``size`` records, sorted, into the first slots."""
    if npartial <= 128:
        partial_sort_top(logit, id, p, size, npartial)  # std::partial_sort
        return
    tk = np.empty(size, np.float32)
    ta = np.empty(size, np.int32)
    tb = np.empty(size, np.float32)
    bucket_partial_sort(logit, id, p, size, npartial, tk, ta, tb)
    logit[:npartial] = tk[:npartial]
    id[:npartial] = ta[:npartial]
    p[:npartial] = tb[:npartial]


@njit(cache=True, error_model="numpy")
def max_logit(logit, size, sorted):
    """``max_l`` as llama.cpp computes it: the first one if sorted, else std::max scan."""
    m = logit[0]
    if not sorted:
        for i in range(1, size):
            if m < logit[i]:
                m = logit[i]
    return m


@njit(cache=True, error_model="numpy")
def softmax_kernel(logit, p, size, sorted):
    max_l = max_logit(logit, size, sorted)
    cum = np.float32(0.0)
    for i in range(size):
        e = np.float32(math.exp(logit[i] - max_l))
        p[i] = e
        cum += e
    for i in range(size):
        p[i] = p[i] / cum


@njit(cache=True, error_model="numpy")
def temp_kernel(logit, size, temp):
    """``llama_sampler_temp_impl``: divide by temp, or keep only the first max if temp <= 0."""
    if size == 0:
        return
    if temp <= np.float32(0.0):
        max_i = 0
        max_l = logit[0]
        for i in range(1, size):
            if logit[i] > max_l:
                logit[max_i] = _F32_NEG_INF
                max_i = i
                max_l = logit[i]
            else:
                logit[i] = _F32_NEG_INF
        return
    for i in range(size):
        logit[i] = logit[i] / temp


@njit(cache=True, error_model="numpy")
def cvt_int(x):
    """C ``int(float)`` on x86: truncation, INT_MIN for NaN and out-of-range values."""
    if x != x or x >= 2147483648.0 or x < -2147483648.0:
        return -2147483648
    return int(x)
