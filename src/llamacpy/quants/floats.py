"""F32, F16 and BF16: plain floating-point "blocks" of one element.

Conversions are ggml's: fp32 -> fp16 rounds to nearest even and turns every NaN into the quiet
NaN ``0x7e00`` (sign kept); fp32 -> bf16 rounds to nearest even and forces NaNs quiet
(``(bits >> 16) | 64``). Widening to float32 is exact.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from llamacpy.gguf.constants import GGMLType
from llamacpy.quants._block32 import load_f16h
from llamacpy.quants._helpers import (
    as_blocks,
    as_rows,
    bits_f32,
    dequantize_out,
    fp16_to_fp32_np,
    fp32_to_bf16,
    fp32_to_bf16_np,
    fp32_to_fp16,
    fp32_to_fp16_np,
    out_shape,
    quantize_out,
    run_dequantize,
)
from llamacpy.quants._registry import QuantFormat, register
from llamacpy.simd import vload_bf16, vload_f16, vload_f32, vstore_bf16, vstore_f32

F32_BLOCK = np.dtype("<f4")
F16_BLOCK = np.dtype("<f2")
BF16_BLOCK = np.dtype([("bits", "<u2")])


def _raw(raw, n: int, size: int, name: str) -> np.ndarray:
    return as_blocks(raw, n, 1, size, name)


def _rows(x, name: str) -> np.ndarray:
    return as_rows(x, 1, name).reshape(-1)


def _shape(x, size: int) -> tuple[int, ...]:
    return out_shape(np.shape(x), 1, size)


# ----------------------------------------------------------------------------- F32


def dequantize_f32(raw, n: int, out: np.ndarray | None = None) -> np.ndarray:
    """F32 bytes -> float32 (a copy, in ``out`` if given; nothing to compute, so no numba
    kernel)."""
    src = _raw(raw, n, 4, "F32").view(np.float32)
    if out is None:
        return src.copy()
    np.copyto(dequantize_out(out, int(n), "F32"), src)
    return out


def quantize_f32(x, imatrix=None, out=None) -> np.ndarray:
    """float array -> F32 bytes (in ``out`` if given, see ``quantize_out``)."""
    rows = _rows(x, "F32")
    if out is None:
        return np.array(rows).view(np.uint8).reshape(_shape(x, 4))
    np.copyto(quantize_out(out, (rows.size * 4,), "F32").view(np.float32), rows)
    return out


# ----------------------------------------------------------------------------- F16


@njit(cache=True, parallel=True, error_model="numpy")
def _f16_dequantize_kernel(raw, y):
    """16 halves per step (hardware conversion, as ggml's ``ggml_fp16_to_fp32_row``)."""
    n = y.size
    for i in prange(n // 16):
        vstore_f32(y, 16 * i, vload_f16(raw, 32 * i))
    for i in range(n // 16 * 16, n):
        y[i] = load_f16h(raw, 2 * i)


@njit(cache=True, parallel=True, error_model="numpy")
def _f16_quantize_kernel(x, out):
    for i in prange(x.size):
        out[i] = fp32_to_fp16(x[i])


def dequantize_f16(raw, n: int, out: np.ndarray | None = None) -> np.ndarray:
    """F16 bytes -> float32 (numba), in ``out`` if given."""
    return run_dequantize(_f16_dequantize_kernel, raw, n, 1, 2, "F16", out)


def dequantize_f16_numpy(raw, n: int) -> np.ndarray:
    """numpy twin of :func:`dequantize_f16`."""
    return fp16_to_fp32_np(_raw(raw, n, 2, "F16"))


def quantize_f16(x, imatrix=None, out=None) -> np.ndarray:
    """float array -> F16 bytes, as ggml's ``ggml_fp32_to_fp16_row`` (numba), in ``out`` if
    given (see ``quantize_out``)."""
    rows = _rows(x, "F16")
    dst = quantize_out(out, (rows.size * 2,), "F16")
    _f16_quantize_kernel(rows, dst.view(np.uint16))
    return out if out is not None else dst.reshape(_shape(x, 2))


def quantize_f16_numpy(x, imatrix=None) -> np.ndarray:
    """numpy twin of :func:`quantize_f16`."""
    return fp32_to_fp16_np(_rows(x, "F16")).view(np.uint8).reshape(_shape(x, 2))


# ----------------------------------------------------------------------------- BF16


@njit(cache=True, parallel=True, error_model="numpy")
def _bf16_dequantize_kernel(raw, y):
    """16 values per step: each one's bits moved to the top half of a float32."""
    h = raw.view(np.uint16)
    n = y.size
    for i in prange(n // 16):
        vstore_f32(y, 16 * i, vload_bf16(raw, 32 * i))
    for i in range(n // 16 * 16, n):
        y[i] = bits_f32(np.uint32(h[i]) << 16)


@njit(cache=True, parallel=True, error_model="numpy")
def _bf16_quantize_kernel(x, out):
    """16 values per SIMD step (ggml's rounding and NaN rule, as :func:`fp32_to_bf16`) into
    the uint16 ``out``."""
    for i in prange(x.size // 16):
        vstore_bf16(out, 16 * i, vload_f32(x, 16 * i))
    for i in range(x.size // 16 * 16, x.size):
        out[i] = fp32_to_bf16(x[i])


def dequantize_bf16(raw, n: int, out: np.ndarray | None = None) -> np.ndarray:
    """BF16 bytes -> float32 (numba), in ``out`` if given."""
    return run_dequantize(_bf16_dequantize_kernel, raw, n, 1, 2, "BF16", out)


def dequantize_bf16_numpy(raw, n: int) -> np.ndarray:
    """numpy twin of :func:`dequantize_bf16`."""
    return (_raw(raw, n, 2, "BF16").view(np.uint16).astype(np.uint32) << 16).view(np.float32)


def quantize_bf16(x, imatrix=None, out=None) -> np.ndarray:
    """float array -> BF16 bytes, as ggml's ``ggml_fp32_to_bf16_row_ref`` (numba), in ``out``
    if given (see ``quantize_out``)."""
    rows = _rows(x, "BF16")
    dst = quantize_out(out, (rows.size * 2,), "BF16")
    _bf16_quantize_kernel(rows, dst.view(np.uint16))
    return out if out is not None else dst.reshape(_shape(x, 2))


def quantize_bf16_numpy(x, imatrix=None) -> np.ndarray:
    """numpy twin of :func:`quantize_bf16`."""
    return fp32_to_bf16_np(_rows(x, "BF16")).view(np.uint8).reshape(_shape(x, 2))


F32_FORMAT = register(
    QuantFormat(
        GGMLType.F32,
        F32_BLOCK,
        dequantize_f32,
        dequantize_f32,
        quantize_f32,
        quantize_f32,
        GGMLType.F32,
    )
)
F16_FORMAT = register(
    QuantFormat(
        GGMLType.F16,
        F16_BLOCK,
        dequantize_f16,
        dequantize_f16_numpy,
        quantize_f16,
        quantize_f16_numpy,
        GGMLType.F16,
    )
)
BF16_FORMAT = register(
    QuantFormat(
        GGMLType.BF16,
        BF16_BLOCK,
        dequantize_bf16,
        dequantize_bf16_numpy,
        quantize_bf16,
        quantize_bf16_numpy,
        GGMLType.BF16,
    )
)
