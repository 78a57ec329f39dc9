"""Q2_0: blocks of 64 weights, one f16 scale ``d`` and 2-bit codes ``q``: ``x = (q - 1) * d``
(codes 0..3 are -1, 0, 1, 2 times ``d``). Bits ``2 (j % 4)`` of byte ``j // 4`` hold
element ``j``.

:func:`quantize` is ggml's ``quantize_row_q2_0_ref`` (``quantize_q2_0`` runs it row by row
when given an importance matrix, which it does not use): ``d`` = the block's largest ``|x|``
(NaNs skipped), ``q = (int) roundf(x / d) + 1`` clamped to 0..3, with x86's conversion of
NaN and out-of-range values to ``INT_MIN`` (code 0).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from llamacpy.gguf.constants import GGML_BLOCK_SIZES, GGMLType
from llamacpy.quants._block32 import load_f16h, store_f16h
from llamacpy.quants._helpers import (
    F0,
    F1,
    blocks_np,
    f2i,
    f2i_np,
    fp16_to_fp32_np,
    fp32_to_fp16_np,
    roundf,
    roundf_np,
    run_dequantize,
    run_quantize,
    run_quantize_np,
)
from llamacpy.quants._registry import QuantFormat, register

TYPE = GGMLType.Q2_0
QK, TYPE_SIZE = GGML_BLOCK_SIZES[TYPE]
BLOCK = np.dtype([("d", "<f2"), ("qs", "u1", (QK // 4,))])
assert BLOCK.itemsize == TYPE_SIZE
# the four codes' multipliers of d
_LEVELS = np.array([-1.0, 0.0, 1.0, 2.0], np.float32)


@njit(cache=True, parallel=True, error_model="numpy")
def _dequantize_kernel(raw, y):
    for i in prange(y.size // QK):
        o = i * TYPE_SIZE
        d = load_f16h(raw, o)
        for k in range(QK // 4):
            q = raw[o + 2 + k]
            for j in range(4):
                y[i * QK + 4 * k + j] = _LEVELS[(q >> (2 * j)) & 3] * d


def dequantize(raw, n: int, out: np.ndarray | None = None) -> np.ndarray:
    """The first ``n`` elements stored in ``raw`` (Q2_0 blocks) as float32 (numba), in
    ``out`` if given."""
    return run_dequantize(_dequantize_kernel, raw, n, QK, TYPE_SIZE, TYPE.name, out)


def dequantize_numpy(raw, n: int) -> np.ndarray:
    """Vectorized numpy twin of :func:`dequantize`."""
    b = blocks_np(raw, n, QK, BLOCK, TYPE.name)
    q = (b["qs"][:, :, None] >> (2 * np.arange(4, dtype=np.uint8))) & 3
    with np.errstate(invalid="ignore"):  # 0 * inf is NaN in C too
        return (_LEVELS[q.reshape(len(b), QK)] * fp16_to_fp32_np(b["d"])[:, None]).reshape(-1)


# ----------------------------------------------------------------------------- quantize


@njit(cache=True, inline="always")
def _code(v):
    """``(int) roundf(v) + 1`` clamped to 0..3."""
    q = f2i(roundf(v)) + 1
    return 0 if q < 0 else (3 if q > 3 else q)


@njit(cache=True, parallel=True, error_model="numpy")
def _quantize_ref_kernel(x, out):
    """``quantize_row_q2_0_ref``, one block per step."""
    for i in prange(x.size // QK):
        o, ob = i * QK, i * TYPE_SIZE
        amax = F0
        for j in range(QK):
            a = abs(x[o + j])
            if a > amax:
                amax = a
        inv = F1 / amax if amax > F0 else F0
        store_f16h(out, ob, amax)
        for k in range(QK // 4):
            q = 0
            for j in range(4):
                q |= _code(x[o + 4 * k + j] * inv) << (2 * j)
            out[ob + 2 + k] = q


def quantize(x, imatrix=None, out=None) -> np.ndarray:
    """Quantize rows (last axis) to Q2_0 bytes, as llama.cpp's ``quantize_q2_0`` (numba;
    an importance matrix is accepted and, as in ggml, not used)."""
    return run_quantize(_quantize_ref_kernel, None, x, None, QK, TYPE_SIZE, TYPE.name, out)


def _ref_np(blocks: np.ndarray) -> np.ndarray:
    a = np.abs(blocks)
    amax = np.where(np.isnan(a), F0, a).max(axis=1)
    inv = np.where(amax > F0, F1 / np.where(amax > F0, amax, F1), F0).astype(np.float32)
    q = np.clip(f2i_np(roundf_np(blocks * inv[:, None])) + 1, 0, 3).astype(np.uint8)
    out = np.zeros(len(blocks), dtype=BLOCK)
    out["d"] = fp32_to_fp16_np(amax).view(np.float16)
    out["qs"] = (q.reshape(-1, QK // 4, 4) << (2 * np.arange(4, dtype=np.uint8))).sum(
        axis=2, dtype=np.uint8
    )
    return out.view(np.uint8).reshape(-1, TYPE_SIZE)


def quantize_numpy(x, imatrix=None) -> np.ndarray:
    """Vectorized numpy twin of :func:`quantize`."""
    return run_quantize_np(_ref_np, None, x, None, QK, TYPE_SIZE, TYPE.name)


FORMAT = register(
    QuantFormat(TYPE, BLOCK, dequantize, dequantize_numpy, quantize, quantize_numpy, GGMLType.Q8_0)
)
