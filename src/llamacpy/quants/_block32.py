"""Whole-block SIMD steps of the 32-value legacy formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), numba.

A block is two 16-lane vectors (:data:`llamacpy.simd.f32x16`): elements ``0..15`` and
``16..31``, which is also how the formats pair nibbles (byte ``j`` holds ``j`` and ``j+16``).
Every step gives the bits of ggml's scalar reference code:

* the reductions skip NaNs as C's ``if (v < min)`` does; where the scalar result depends on
  the order (``+0.0`` vs ``-0.0``, or ``v`` vs ``-v`` for the absolute maximum) the element
  that C keeps, the first one, is looked up;
* float -> int conversions are x86's truncating ``cvttss2si`` (INT_MIN for NaN and values
  out of the int32 range), then narrowed as the C stores narrow.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.cpython.unsafe.numbers import trailing_zeros
from numba.extending import intrinsic

from llamacpy.quants._helpers import F0, F1, F32
from llamacpy.quants._lanes import vblend, vgt, vlt
from llamacpy.simd import (
    f16_to_f32,
    f32_to_f16,
    f32x16,
    i32x16,
    vabs,
    vhmax,
    vload_f32,
    vsplat_f32,
)

_I32 = ir.IntType(32)
_V16I = ir.VectorType(_I32, 16)
_V16F = ir.VectorType(ir.FloatType(), 16)
_FLT_MAX = F32(np.finfo(np.float32).max)


def _vc(c):
    return ir.Constant(_V16I, [c] * 16)


@intrinsic
def vhmin(typingctx, a):
    """Minimum of the 16 lanes (float32; lanes must not be NaN)."""
    if a != f32x16:
        return None

    def cg(context, builder, sig, args):
        fnty = ir.FunctionType(ir.FloatType(), [_V16F])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.vector.reduce.fmin.v16f32")
        return builder.call(fn, [args[0]])

    return types.float32(a), cg


@intrinsic
def veq_bits(typingctx, a, s):
    """Bit ``k`` set where lane ``k`` of ``a`` equals the scalar ``s`` (ordered ``==``)."""
    if a != f32x16:
        return None

    def cg(context, builder, sig, args):
        v = context.cast(builder, args[1], sig.args[1], types.float32)
        sv = builder.insert_element(ir.Constant(_V16F, None), v, ir.Constant(_I32, 0))
        sv = builder.shuffle_vector(sv, sv, ir.Constant(_V16I, [0] * 16))
        m = builder.bitcast(builder.fcmp_ordered("==", args[0], sv), ir.IntType(16))
        return builder.zext(m, ir.IntType(64))

    return types.int64(a, s), cg


@intrinsic
def vnz_bits(typingctx, a):
    """Bit ``k`` set where lane ``k`` of the ``i32x16`` ``a`` is non-zero."""
    if a != i32x16:
        return None

    def cg(context, builder, sig, args):
        m = builder.bitcast(builder.icmp_signed("!=", args[0], _vc(0)), ir.IntType(16))
        return builder.zext(m, ir.IntType(64))

    return types.int64(a), cg


@intrinsic
def vcvtt(typingctx, a):
    """x86 ``cvttss2si`` of each lane: truncation toward zero, INT_MIN for NaN and values
    outside the int32 range (``i32x16``)."""
    if a != f32x16:
        return None

    def cg(context, builder, sig, args):
        v = args[0]
        lo = ir.Constant(_V16F, [-(2.0**31)] * 16)
        hi = ir.Constant(_V16F, [2.0**31] * 16)
        ok = builder.and_(builder.fcmp_ordered(">=", v, lo), builder.fcmp_ordered("<", v, hi))
        safe = builder.select(ok, v, ir.Constant(_V16F, [0.0] * 16))
        return builder.select(ok, builder.fptosi(safe, _V16I), _vc(-(2**31)))

    return i32x16(a), cg


@intrinsic
def vint8_min(typingctx, a, hi):
    """``MIN(hi, (int8_t)a)`` lane by lane (``a`` an ``i32x16``, ``hi`` a constant int)."""
    if a != i32x16:
        return None

    def cg(context, builder, sig, args):
        t = builder.ashr(builder.shl(args[0], _vc(24)), _vc(24))
        h = context.cast(builder, args[1], sig.args[1], types.int32)
        hv = builder.insert_element(ir.Constant(_V16I, None), h, ir.Constant(_I32, 0))
        hv = builder.shuffle_vector(hv, hv, ir.Constant(_V16I, [0] * 16))
        return builder.select(builder.icmp_signed(">", t, hv), hv, t)

    return i32x16(a, hi), cg


@intrinsic
def vstore_u8(typingctx, arr, i, v):
    """Store the low byte of each lane of the ``i32x16`` ``v`` to the 16 bytes at ``&arr[i]``."""
    if v != i32x16:
        return None

    def cg(context, builder, sig, args):
        v16b = ir.VectorType(ir.IntType(8), 16)
        a = context.make_array(sig.args[0])(context, builder, args[0])
        p = builder.bitcast(builder.gep(a.data, [args[1]]), v16b.as_pointer())
        builder.store(builder.trunc(args[2], v16b), p, align=1)
        return context.get_dummy_value()

    return types.none(arr, i, v), cg


@intrinsic
def vqh_bits(typingctx, qh, shift):
    """Lane ``k`` = bit ``k + shift`` of the integer ``qh`` moved to bit 4 (``i32x16``)."""

    def cg(context, builder, sig, args):
        q = context.cast(builder, args[0], sig.args[0], types.int64)
        q = builder.trunc(q, _I32)
        s = context.cast(builder, args[1], sig.args[1], types.int32)
        qv = builder.insert_element(ir.Constant(_V16I, None), q, ir.Constant(_I32, 0))
        qv = builder.shuffle_vector(qv, qv, ir.Constant(_V16I, [0] * 16))
        sv = builder.insert_element(ir.Constant(_V16I, None), s, ir.Constant(_I32, 0))
        sv = builder.shuffle_vector(sv, sv, ir.Constant(_V16I, [0] * 16))
        sv = builder.add(sv, ir.Constant(_V16I, list(range(16))))
        bit = builder.and_(builder.lshr(qv, sv), _vc(1))
        return builder.shl(bit, _vc(4))

    return i32x16(qh, shift), cg


@njit(cache=True, error_model="numpy")
def load_f16h(raw, o):
    """The little-endian IEEE half at byte ``o`` as float32 (hardware conversion)."""
    return f16_to_f32(np.uint16(raw[o]) | (np.uint16(raw[o + 1]) << np.uint16(8)))


@njit(cache=True, error_model="numpy")
def store_f16h(out, o, f):
    """:func:`~llamacpy.quants._helpers.store_f16` with the hardware conversion (same
    rounding); NaNs made ggml's quiet ``0x7e00`` with the sign kept."""
    h = np.int64(f32_to_f16(f))
    if (h & 0x7C00) == 0x7C00 and (h & 0x3FF) != 0:
        h = (h & 0x8000) | 0x7E00
    out[o] = h & 0xFF
    out[o + 1] = h >> 8


@njit(cache=True, error_model="numpy")
def _first(x, o, v):
    """The first of the 32 elements at ``x[o:]`` that equals ``v`` (``==``, so either zero)."""
    m = veq_bits(vload_f32(x, o), v) | (veq_bits(vload_f32(x, o + 16), v) << 16)
    return x[o + trailing_zeros(np.uint64(m))]


@njit(cache=True, error_model="numpy")
def block_minmax(x, o):
    """ggml's ``if (v < min) min = v; if (v > max) max = v;`` over ``x[o:o+32]`` from
    ``min = FLT_MAX, max = -FLT_MAX``; also returns the two halves as vectors."""
    v0 = vload_f32(x, o)
    v1 = vload_f32(x, o + 16)
    mn = vsplat_f32(_FLT_MAX)
    mx = vsplat_f32(-_FLT_MAX)
    mn = vblend(vlt(v0, mn), v0, mn)
    mx = vblend(vgt(v0, mx), v0, mx)
    mn = vblend(vlt(v1, mn), v1, mn)
    mx = vblend(vgt(v1, mx), v1, mx)
    lo = vhmin(mn)
    hi = vhmax(mx)
    if lo == F0:  # +0.0 or -0.0: C keeps the first zero it meets
        lo = _first(x, o, F0)
    if hi == F0:
        hi = _first(x, o, F0)
    return lo, hi, v0, v1


@njit(cache=True, error_model="numpy")
def block_absmax(x, o):
    """ggml's ``if (amax < fabsf(v)) { amax = fabsf(v); max = v; }`` over ``x[o:o+32]`` from
    ``amax = max = 0``: returns ``max`` (the signed element) and the two halves."""
    v0 = vload_f32(x, o)
    v1 = vload_f32(x, o + 16)
    am = vsplat_f32(F0)
    a0 = vabs(v0)
    a1 = vabs(v1)
    am = vblend(vlt(am, a0), a0, am)
    am = vblend(vlt(am, a1), a1, am)
    amax = vhmax(am)
    if not amax > F0:
        return F0, v0, v1
    m = veq_bits(a0, amax) | (veq_bits(a1, amax) << 16)
    return x[o + trailing_zeros(np.uint64(m))], v0, v1


@njit(cache=True, error_model="numpy")
def absmax_scaled(x, o, out, o_d, div):
    """Start of ggml's symmetric blocks: ``d = max / div`` stored as f16 at ``out[o_d:]``;
    returns the two halves times ``1/d`` (``0`` where ``d == 0``)."""
    mx, v0, v1 = block_absmax(x, o)
    d = mx / div
    inv = vsplat_f32(F1 / d if d != F0 else F0)
    store_f16h(out, o_d, d)
    return v0 * inv, v1 * inv


@njit(cache=True, error_model="numpy")
def minmax_scaled(x, o, out, o_d, div):
    """Start of ggml's blocks with a min: ``d = (max - min) / div`` and ``min`` stored as f16
    at ``out[o_d:]``; returns the two halves as ``(v - min) * (1/d)`` (``0`` where ``d == 0``)."""
    mn, mx, v0, v1 = block_minmax(x, o)
    d = (mx - mn) / div
    inv = F1 / d if d != F0 else F0
    store_f16h(out, o_d, d)
    store_f16h(out, o_d + 2, mn)
    vmn = vsplat_f32(mn)
    vinv = vsplat_f32(inv)
    return (v0 - vmn) * vinv, (v1 - vmn) * vinv
