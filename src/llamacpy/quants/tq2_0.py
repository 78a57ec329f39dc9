"""TQ2_0: ternary super-blocks of 256 weights, 2.06 bits each: 64 bytes of 2-bit codes ``q``
(byte ``m`` of each 32-byte half holds elements ``m + 32 * l`` of that half at bits ``2 l``)
then an f16 ``d``: ``x = (q - 1) * d``.

Quantization is ggml's ``quantize_row_tq2_0_ref`` (``d`` = the block's largest ``|x|``, ``q``
= ``lroundf(x / d) + 1``); llama.cpp ignores importance weights for TQ2_0, and so does
:func:`quantize`.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from llamacpy.gguf.constants import GGMLType
from llamacpy.quants._helpers import (
    F0,
    F1,
    F32,
    fp32_to_fp16_np,
    roundf_np,
    run_quantize,
    run_quantize_np,
    store_f16,
)
from llamacpy.quants._iqgrid import QK, register_format, u16
from llamacpy.simd import vabs, vhmax, vhsum, vload_f32, vmax, vzero_f32

TYPE = GGMLType.TQ2_0
BLOCK = np.dtype([("qs", "u1", (QK // 4,)), ("d", "<f2")])
TYPE_SIZE = BLOCK.itemsize
NSUB = 1
C = 1.0
VALUES = (-1, 0, 1, 2)  # q - 1 for every 2-bit q (3 is never written, but may be read)


@njit(cache=True, inline="always")
def decode(raw, o, v, sc):
    """The block at ``raw[o:]``: ``q - 1`` to ``v`` (``sc``: 1)."""
    sc[0] = 1
    for h in range(2):
        for l in range(4):
            for m in range(32):
                v[128 * h + 32 * l + m] = ((np.int64(raw[o + 32 * h + m]) >> (2 * l)) & 3) - 1
    return u16(raw, o + QK // 4)


@njit(cache=True, inline="always")
def mult(d, s):
    return d


def mult_numpy(d, s):
    return np.broadcast_to(d, s.shape).astype(np.float32)


def decode_numpy(b: np.ndarray):
    """``decode`` over structured blocks: (d bits, values [n, 256], scales [n, 1])."""
    q = b["qs"].astype(np.int64).reshape(-1, 2, 1, 32) >> (2 * np.arange(4))[:, None]
    v = (q & 3) - 1  # [n, 2, 4, 32]
    return b["d"], v.reshape(-1, QK), np.ones((len(b), 1), np.int64)


# ----------------------------------------------------------------------------- quantize

_2P31 = F32(2.0**31)
_HALF = F32(0.5)


@njit(cache=True, inline="always")
def trit_code(v):
    """The low byte of ``lroundf(v) + 1`` (ggml's digit; only its low bits are stored).

    glibc's ``lroundf`` rounds half away from zero and gives ``LONG_MIN`` for NaN and
    anything outside the ``long`` range. From ``2**31`` on every float is a multiple of 256,
    as is ``LONG_MIN``, so the byte is then 1.
    """
    if not abs(v) < _2P31:
        return 1
    t = np.int32(v)  # truncation toward zero, exact here
    r = t + (np.int32(1) if v > F0 else np.int32(-1)) if abs(v - F32(t)) >= _HALF else t
    return (r + 1) & 0xFF


@njit(cache=True, inline="always")
def absmax_scale(x, o, out, o_d):
    """ggml's ternary block scale: ``d`` = the largest ``|x|`` of ``x[o:o + 256]``, stored
    as f16 at ``out[o_d]``; returns ``1 / d`` (0 for ``d == 0``).

    Sixteen lanes at a time; a block with a NaN or an infinity takes C's sequential ``MAX``
    instead (where a NaN is kept only when last, and resets the maximum otherwise).
    """
    mv = vzero_f32()
    chk = vzero_f32()
    for j in range(0, QK, 16):
        a = vabs(vload_f32(x, o + j))
        mv = vmax(mv, a)
        chk = chk + (a - a)  # NaN from here on if any lane is inf or NaN
    amax = vhmax(mv)
    if vhsum(chk) != F0:
        amax = F0
        for j in range(QK):
            a = abs(x[o + j])
            amax = amax if amax > a else a
    store_f16(out, o_d, amax)
    return F1 / amax if amax != F0 else F0


@njit(cache=True, parallel=True, error_model="numpy")
def _quantize_ref_kernel(x, out):
    for i in prange(x.size // QK):
        o, ob = i * QK, i * TYPE_SIZE
        inv = absmax_scale(x, o, out, ob + QK // 4)
        for h in range(2):
            for m in range(32):
                q = 0
                for n in range(4):
                    q |= (trit_code(x[o + 128 * h + 32 * n + m] * inv) & 3) << (2 * n)
                out[ob + 32 * h + m] = q


def quantize(x, imatrix=None, out=None) -> np.ndarray:
    """Quantize rows (last axis) to TQ2_0 bytes, as llama.cpp's ``quantize_tq2_0`` (numba);
    ``imatrix`` is accepted and ignored, as in llama.cpp."""
    return run_quantize(_quantize_ref_kernel, None, x, None, QK, TYPE_SIZE, TYPE.name, out)


def trit_code_np(v: np.ndarray) -> np.ndarray:
    """Vectorized :func:`trit_code` (int64)."""
    ok = np.abs(v) < _2P31
    r = roundf_np(np.where(ok, v, F0)).astype(np.int64)
    return np.where(ok, (r + 1) & 0xFF, 1)


def ternary_np(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(f16 bits of d, trit codes) of (nb, 256) blocks, as the TQ ``_ref`` quantizers."""
    amax = np.zeros(blocks.shape[0], np.float32)
    for j in range(QK):  # C's MAX, in order: a NaN survives only when last
        a = np.abs(blocks[:, j])
        amax = np.where(amax > a, amax, a)
    inv = np.where(amax != F0, F1 / np.where(amax != F0, amax, F1), F0).astype(np.float32)
    return fp32_to_fp16_np(amax), trit_code_np(blocks * inv[:, None])


def _ref_np(blocks: np.ndarray) -> np.ndarray:
    d, t = ternary_np(blocks)
    q = ((t.reshape(-1, 2, 4, 32) & 3) << (2 * np.arange(4))[:, None]).sum(axis=2)
    out = np.zeros(len(blocks), dtype=BLOCK)
    out["qs"] = q.reshape(-1, QK // 4)
    out["d"] = d.view(np.float16)
    return out.view(np.uint8).reshape(-1, TYPE_SIZE)


def quantize_numpy(x, imatrix=None) -> np.ndarray:
    """Vectorized numpy twin of :func:`quantize`."""
    return run_quantize_np(_ref_np, None, x, None, QK, TYPE_SIZE, TYPE.name)


FORMAT = register_format(TYPE, BLOCK, NSUB, C, decode_numpy, mult_numpy, quantize, quantize_numpy)
dequantize, dequantize_numpy = FORMAT.dequantize, FORMAT.dequantize_numpy
