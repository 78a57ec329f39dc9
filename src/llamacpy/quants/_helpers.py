"""Scalar helpers shared by the format modules, each in a numba and a numpy flavour.

Everything here mirrors ggml bit for bit:

* ``nearest_int`` is ggml's magic-number rounding (``x + 12582912.f``, then the low mantissa
  bits): round-half-to-even for ``|x| < 2**22``, and the same deterministic garbage as C for
  anything larger.
* ``fp32_to_fp16`` / ``fp16_to_fp32`` are ggml's portable (non-F16C) conversions: IEEE
  round-to-nearest-even, every NaN becomes the quiet NaN ``0x7e00`` (sign kept).
* ``fp32_to_bf16`` rounds to nearest even and forces NaNs quiet (``ggml_compute_fp32_to_bf16``).

Numba kernels are compiled lazily and cached on disk (``cache=True``);
:mod:`llamacpy.kernel_cache` makes the cache of a kernel expire when its module or any kernel
module it imports changes.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import intrinsic

from llamacpy.quants._errors import QuantError

F32 = np.float32
F0 = F32(0.0)
F1 = F32(1.0)
GROUP_MAX_EPS = F32(1e-15)
_MAGIC = F32(12582912.0)  # 1.5 * 2**23
_SCALE_TO_INF = F32(2.0**112)
_SCALE_TO_ZERO = F32(2.0**-110)
_EXP_SCALE = F32(2.0**-112)
_HALF = F32(0.5)
_2P23 = F32(2.0**23)
_2P31 = F32(2.0**31)


# ----------------------------------------------------------------------------- bit casts


@intrinsic
def f32_bits(typingctx, x):
    """The IEEE bits of a float32 as uint32 (a reinterpreting cast, like a C union)."""
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.uint32))

    return types.uint32(types.float32), codegen


@intrinsic
def bits_f32(typingctx, x):
    """The float32 whose IEEE bits are the low 32 bits of the integer ``x``."""
    if not isinstance(x, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        v = args[0]
        i32 = context.get_value_type(types.uint32)
        if x.bitwidth > 32:
            v = builder.trunc(v, i32)
        elif x.bitwidth < 32:
            v = builder.zext(v, i32)
        return builder.bitcast(v, context.get_value_type(types.float32))

    return types.float32(x), codegen


# ----------------------------------------------------------------------------- numba scalars


@njit(cache=True, error_model="numpy")
def nearest_int(fval):
    """ggml's ``nearest_int``: round half to even via the 1.5*2**23 trick (float32 in)."""
    i = np.int64(f32_bits(fval + _MAGIC))
    return (i & 0x007FFFFF) - 0x00400000


@njit(cache=True, error_model="numpy")
def f2i(x):
    """C's float -> int conversion as x86-64 compiles it (``cvttss2si``): truncation toward
    zero, and INT_MIN for NaN and values outside the int32 range."""
    if x != x or x >= _2P31 or x < -_2P31:
        return -2147483648
    return np.int64(x)


@njit(cache=True, error_model="numpy")
def roundf(x):
    """C ``roundf`` of a float32 (half away from zero), as float32."""
    a = abs(x)
    if not a < _2P23:  # already integral, or inf/NaN
        return x
    r = F32(np.int64(a))
    if a - r >= _HALF:
        r += F1
    return -r if x < F0 else r


@njit(cache=True, error_model="numpy")
def int8(v):
    """The value a C store of int ``v`` into an ``int8_t`` leaves (low byte, signed)."""
    return ((v + 128) & 0xFF) - 128


@njit(cache=True, error_model="numpy")
def fp32_to_fp16(f):
    """float32 -> IEEE half bits (int), exactly as ``ggml_compute_fp32_to_fp16``."""
    base = (abs(f) * _SCALE_TO_INF) * _SCALE_TO_ZERO
    w = np.int64(f32_bits(f))
    shl1_w = (w << 1) & 0xFFFFFFFF
    sign = w & 0x80000000
    bias = shl1_w & 0xFF000000
    if bias < 0x71000000:
        bias = 0x71000000
    base = bits_f32((bias >> 1) + 0x07800000) + base
    bits = np.int64(f32_bits(base))
    nonsign = ((bits >> 13) & 0x00007C00) + (bits & 0x00000FFF)
    return (sign >> 16) | (0x7E00 if shl1_w > 0xFF000000 else nonsign)


@njit(cache=True, error_model="numpy")
def fp16_to_fp32(h):
    """IEEE half bits (int) -> float32, exactly as ``ggml_compute_fp16_to_fp32``."""
    w = np.int64(h) << 16
    sign = w & 0x80000000
    two_w = (w << 1) & 0xFFFFFFFF
    if two_w < (1 << 27):
        v = bits_f32((two_w >> 17) | (126 << 23)) - _HALF
    else:
        v = bits_f32((two_w >> 4) + (0xE0 << 23)) * _EXP_SCALE
    return bits_f32(sign | np.int64(f32_bits(v)))


@njit(cache=True, error_model="numpy")
def load_f16(raw, o):
    """The little-endian half at byte ``o`` of ``raw`` as float32."""
    return fp16_to_fp32(np.int64(raw[o]) | (np.int64(raw[o + 1]) << 8))


@njit(cache=True, error_model="numpy")
def store_f16(out, o, f):
    """Store float32 ``f`` as a little-endian half at byte ``o`` of ``out``; returns the bits."""
    h = fp32_to_fp16(f)
    out[o] = h & 0xFF
    out[o + 1] = h >> 8
    return h


@njit(cache=True, error_model="numpy")
def fp32_to_bf16(f):
    """float32 -> bfloat16 bits (int), exactly as ``ggml_compute_fp32_to_bf16``."""
    u = np.int64(f32_bits(f))
    if (u & 0x7FFFFFFF) > 0x7F800000:
        return (u >> 16) | 64
    return ((u + (0x7FFF + ((u >> 16) & 1))) >> 16) & 0xFFFF


# ----------------------------------------------------------------------------- numpy twins


def nearest_int_np(v: np.ndarray) -> np.ndarray:
    """Vectorized ``nearest_int`` of a float32 array (int32 result)."""
    bits = (np.asarray(v, dtype=np.float32) + _MAGIC).view(np.int32)
    return (bits & 0x007FFFFF) - 0x00400000


def fp32_to_fp16_np(v: np.ndarray) -> np.ndarray:
    """Vectorized ggml fp32 -> fp16 conversion, as uint16 bits (numpy rounds the same way;
    only NaNs differ: ggml makes every NaN the quiet NaN 0x7e00 with the sign kept)."""
    v = np.asarray(v, dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        h = v.astype(np.float16).view(np.uint16)
    nan = np.isnan(v)
    if nan.any():
        h = np.where(nan, (v.view(np.uint32) >> 16).astype(np.uint16) & 0x8000 | 0x7E00, h)
    return h


def fp16_to_fp32_np(h: np.ndarray) -> np.ndarray:
    """Vectorized fp16 bits (or float16 values) -> float32."""
    return np.asarray(h).view(np.float16).astype(np.float32)


def fp32_to_bf16_np(v: np.ndarray) -> np.ndarray:
    """Vectorized ``ggml_compute_fp32_to_bf16`` (uint16 bits)."""
    u = np.asarray(v, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (u + (0x7FFF + ((u >> 16) & 1))) >> 16
    quiet = (u >> 16) | 64
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, quiet, rounded).astype(np.uint16)


def f2i_np(v: np.ndarray) -> np.ndarray:
    """Vectorized :func:`f2i` (int64 result)."""
    v = np.asarray(v, dtype=np.float32)
    ok = (v < _2P31) & (v >= -_2P31)
    with np.errstate(invalid="ignore"):
        return np.where(ok, np.trunc(np.where(ok, v, F0)).astype(np.int64), -2147483648)


def int8_np(v: np.ndarray) -> np.ndarray:
    """The int8 a C store of int ``v`` into an ``int8_t`` leaves (low byte, signed)."""
    return ((np.asarray(v, dtype=np.int64) + 128) & 0xFF) - 128


def roundf_np(v: np.ndarray) -> np.ndarray:
    """Vectorized C ``roundf`` (half away from zero) of a float32 array, as float32."""
    a = np.abs(v)
    t = np.floor(a)
    t = np.where(a - t >= _HALF, t + F1, t)
    return np.where(a < _2P23, np.copysign(t, v), v).astype(np.float32)


# ----------------------------------------------------------------------------- array plumbing


def readonly(a: np.ndarray) -> np.ndarray:
    """A read-only view, so every numba kernel sees one array type (one compilation)."""
    v = a.view()
    v.flags.writeable = False
    return v


def as_blocks(raw, n: int, block_size: int, type_size: int, name: str) -> np.ndarray:
    """Validate ``raw`` (any buffer) and return its first ``n`` elements' bytes as a read-only
    contiguous flat uint8 array."""
    n = int(n)
    if n < 0 or n % block_size:
        raise QuantError(f"{name}: {n} elements is not a multiple of the block size {block_size}")
    arr = np.frombuffer(raw, dtype=np.uint8) if not isinstance(raw, np.ndarray) else raw
    if arr.dtype != np.uint8:
        arr = np.ascontiguousarray(arr).view(np.uint8)
    arr = np.ascontiguousarray(arr).reshape(-1)
    need = n // block_size * type_size
    if arr.size < need:
        raise QuantError(f"{name}: {n} elements need {need} bytes, got {arr.size}")
    return readonly(arr[:need])


def as_rows(x, block_size: int, name: str) -> np.ndarray:
    """``x`` as a read-only C-contiguous float32 2-D array of rows (the last axis)."""
    a = np.asarray(x)
    if a.dtype != np.float32:
        a = a.astype(np.float32)
    if a.ndim == 0:
        a = a.reshape(1)
    n_per_row = a.shape[-1]
    if n_per_row % block_size:
        raise QuantError(
            f"{name}: row length {n_per_row} is not a multiple of the block size {block_size}"
        )
    return readonly(np.ascontiguousarray(a).reshape(-1, n_per_row))


def as_imatrix(imatrix, rows: np.ndarray, name: str) -> tuple[np.ndarray, int]:
    """Importance weights as (groups, n_per_row) float32 plus rows per group.

    ``imatrix`` is per column: shape ``(n_per_row,)`` applies to every row; a leading shape
    ``(g, n_per_row)`` gives one vector per matrix of a stacked (3-D, e.g. MoE) tensor, as
    llama-quantize does per expert.
    """
    qw = np.ascontiguousarray(np.asarray(imatrix, dtype=np.float32))
    n_per_row = rows.shape[1]
    if qw.ndim == 0 or qw.shape[-1] != n_per_row:
        raise QuantError(f"{name}: imatrix has shape {qw.shape}, expected (..., {n_per_row})")
    qw = qw.reshape(-1, n_per_row)
    if rows.shape[0] % qw.shape[0]:
        raise QuantError(
            f"{name}: {qw.shape[0]} imatrix vectors do not divide {rows.shape[0]} rows"
        )
    return readonly(qw), rows.shape[0] // qw.shape[0]


def out_shape(x_shape: tuple[int, ...], block_size: int, type_size: int) -> tuple[int, ...]:
    """Shape of the quantized bytes of an array: the last axis becomes bytes per row."""
    if not x_shape:
        x_shape = (1,)
    return (*x_shape[:-1], x_shape[-1] // block_size * type_size)


def _caller_array(out, shape: tuple[int, ...], dtype, name: str, unit: str) -> np.ndarray:
    """A new ``dtype`` array of ``shape``, or ``out`` (writable, C-contiguous, that dtype and
    as many elements, any shape) viewed with that shape; anything else is a QuantError."""
    if out is None:
        return np.empty(shape, dtype=dtype)
    n = int(np.prod(shape, dtype=np.int64))
    if not (
        isinstance(out, np.ndarray)
        and out.dtype == dtype
        and out.flags.c_contiguous
        and out.flags.writeable
        and out.size == n
    ):
        kind = np.dtype(dtype).name
        raise QuantError(f"{name}: out must be a writable C-contiguous {kind} array of {n}{unit}")
    return out.reshape(shape)


def dequantize_out(out, n: int, name: str) -> np.ndarray:
    """The flat float32 array a dequantizer writes ``n`` values to: a new one, or a view of
    ``out`` (a writable C-contiguous float32 array of ``n`` elements, any shape), so that a
    caller that converts many chunks can reuse one buffer instead of faulting in fresh pages
    every time."""
    return _caller_array(out, (n,), np.float32, name, "")


def run_dequantize(kernel, raw, n: int, block_size: int, type_size: int, name: str, out=None):
    """Validate, then run a numba ``kernel(raw_u8, y)`` that fills the float32 ``y`` (new, or
    ``out``: see :func:`dequantize_out`); returns ``y`` (``out`` itself when given)."""
    blocks = as_blocks(raw, n, block_size, type_size, name)
    y = dequantize_out(out, int(n), name)
    kernel(blocks, y)
    return y if out is None else out


def quantize_out(out, shape: tuple[int, ...], name: str) -> np.ndarray:
    """The uint8 array of ``shape`` a quantizer writes to: a new one, or a view of ``out`` (a
    writable C-contiguous uint8 array with as many bytes, any shape), so that a caller can
    have the bytes written where they go (ggml's ``ggml_quantize_chunk`` writes to its
    caller's memory too)."""
    return _caller_array(out, shape, np.uint8, name, " bytes")


def run_quantize(
    ref_kernel, impl_kernel, x, imatrix, block_size: int, type_size: int, name: str, out=None
):
    """Validate, then run ``ref_kernel(x_flat, out_flat)`` (no imatrix: ggml's
    ``quantize_row_*_ref`` over all rows as one) or ``impl_kernel(rows, qw, rows_per_qw, out)``
    (ggml's ``quantize_row_*_impl`` row by row). Returns uint8 of shape ``(..., row_bytes)``,
    or ``out`` itself when given (see :func:`quantize_out`)."""
    rows = as_rows(x, block_size, name)
    dst = quantize_out(out, (rows.shape[0], rows.shape[1] // block_size * type_size), name)
    if imatrix is None or impl_kernel is None:
        ref_kernel(rows.reshape(-1), dst.reshape(-1))
    else:
        qw, rows_per_qw = as_imatrix(imatrix, rows, name)
        impl_kernel(rows, qw, rows_per_qw, dst)
    return out if out is not None else dst.reshape(out_shape(np.shape(x), block_size, type_size))


def run_quantize_np(ref_np, impl_np, x, imatrix, block_size: int, type_size: int, name: str):
    """numpy-twin driver: ``ref_np(blocks (nb, block_size)) -> (nb, type_size) uint8`` and
    ``impl_np(rows, qw_rows) -> (nrows, row_bytes) uint8`` (``qw_rows`` has one weight row per
    data row)."""
    rows = np.array(as_rows(x, block_size, name))
    with np.errstate(all="ignore"):  # inf/NaN intermediates are part of ggml's arithmetic
        if imatrix is None or impl_np is None:
            out = ref_np(rows.reshape(-1, block_size))
        else:
            qw, rows_per_qw = as_imatrix(imatrix, rows, name)
            out = impl_np(rows, np.repeat(qw, rows_per_qw, axis=0))
    return np.ascontiguousarray(out).reshape(out_shape(np.shape(x), block_size, type_size))


def blocks_np(raw, n: int, block_size: int, dtype: np.dtype, name: str) -> np.ndarray:
    """``raw`` as an array of structured blocks (for the numpy twins)."""
    return as_blocks(raw, n, block_size, dtype.itemsize, name).view(dtype)
