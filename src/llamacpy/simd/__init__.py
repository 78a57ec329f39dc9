"""A tiny SIMD vocabulary for numba kernels: 16-lane vectors as first-class numba values.

Numba has no vector types; LLVM does. This module registers two numba types whose LLVM
representation is a vector register (``i32x16`` = ``<16 x i32>``, also used as 64 raw bytes,
and ``f32x16`` = ``<16 x float>``) and ``@intrinsic`` operations on them, so that kernels are
written like C with intrinsics but stay plain Python compiled by numba at run time (and cached
on disk). Where the CPU has the instruction (AVX-512 VNNI ``vpdpbusd``, AVX-512BW
``vpshufb``) the intrinsic is emitted directly; otherwise a generic LLVM IR expansion with the
same result is emitted, so every kernel runs on any CPU numba targets (slower).

Loads and stores take ``(array, index)`` and touch the bytes starting at ``&array[index]``
(no bounds check: callers own the arithmetic). Also here: atomics and a pause hint for the
spin barrier of :mod:`llamacpy.ops.threads`, and scalar f16 conversions.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils, config
from numba.core.codegen import get_host_cpu_features
from numba.extending import intrinsic, models, overload, register_model

__all__ = ["HAS_AVX512BW", "HAS_AVX512F", "HAS_VNNI", "f32x16", "i32x16"]


def _target_features() -> set[str]:
    feats = config.CPU_FEATURES if config.CPU_FEATURES is not None else get_host_cpu_features()
    return {f[1:] for f in str(feats).split(",") if f.startswith("+")}


_FEATURES = _target_features()
HAS_VNNI = "avx512vnni" in _FEATURES and "avx512bw" in _FEATURES
HAS_AVX512BW = "avx512bw" in _FEATURES
HAS_AVX512F = "avx512f" in _FEATURES


class VecType(types.Type):
    """A 16-lane vector held in registers (numba value type)."""

    def __init__(self, elem: types.Type, n: int) -> None:
        self.elem, self.n = elem, n
        super().__init__(name=f"vec_{elem}x{n}")


i32x16 = VecType(types.int32, 16)
f32x16 = VecType(types.float32, 16)


@register_model(VecType)
class _VecModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        be = ir.VectorType(dmm.lookup(fe_type.elem).get_value_type(), fe_type.n)
        super().__init__(dmm, fe_type, be)


_I8, _I16, _I32, _I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
_F32, _F16 = ir.FloatType(), ir.HalfType()
_V16I = ir.VectorType(_I32, 16)
_V16F = ir.VectorType(_F32, 16)
_V16H = ir.VectorType(_F16, 16)
_V64B = ir.VectorType(_I8, 64)
_V16B = ir.VectorType(_I8, 16)


def _fn(builder, name, ret, args):
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, args), name)


def _ptr(context, builder, aryty, ary, idx, to):
    """Pointer to ``&ary[idx]`` cast to ``to*``."""
    a = context.make_array(aryty)(context, builder, ary)
    p = builder.gep(a.data, [idx])
    return builder.bitcast(p, to.as_pointer())


def _splat(builder, scalar, vty):
    v = builder.insert_element(ir.Constant(vty, None), scalar, ir.Constant(_I32, 0))
    mask = ir.Constant(ir.VectorType(_I32, vty.count), [0] * vty.count)
    return builder.shuffle_vector(v, v, mask)


def _const(vty, c):
    return ir.Constant(vty, [c] * vty.count)


def _to_i32(context, builder, val, ty):
    return context.cast(builder, val, ty, types.int32)


# ----------------------------------------------------------------------------- loads / stores
@intrinsic
def vload_i32(typingctx, arr, i):
    """64 bytes at ``&arr[i]`` as ``i32x16``."""

    def cg(context, builder, sig, args):
        p = _ptr(context, builder, sig.args[0], args[0], args[1], _V16I)
        return builder.load(p, align=1)

    return i32x16(arr, i), cg


@intrinsic
def vload_f32(typingctx, arr, i):
    """64 bytes at ``&arr[i]`` as ``f32x16``."""

    def cg(context, builder, sig, args):
        p = _ptr(context, builder, sig.args[0], args[0], args[1], _V16F)
        return builder.load(p, align=1)

    return f32x16(arr, i), cg


@intrinsic
def vload_f16(typingctx, arr, i):
    """16 IEEE halves (32 bytes at ``&arr[i]``) widened to ``f32x16``."""

    def cg(context, builder, sig, args):
        p = _ptr(context, builder, sig.args[0], args[0], args[1], _V16H)
        return builder.fpext(builder.load(p, align=1), _V16F)

    return f32x16(arr, i), cg


@intrinsic
def vload_bf16(typingctx, arr, i):
    """16 bfloat16 values (32 bytes at ``&arr[i]``) widened to ``f32x16``."""

    def cg(context, builder, sig, args):
        p = _ptr(context, builder, sig.args[0], args[0], args[1], ir.VectorType(_I16, 16))
        w = builder.zext(builder.load(p, align=1), _V16I)
        return builder.bitcast(builder.shl(w, _const(_V16I, 16)), _V16F)

    return f32x16(arr, i), cg


@intrinsic
def vload_u8(typingctx, arr, i):
    """16 bytes at ``&arr[i]``, zero-extended to ``i32x16``."""

    def cg(context, builder, sig, args):
        p = _ptr(context, builder, sig.args[0], args[0], args[1], _V16B)
        return builder.zext(builder.load(p, align=1), _V16I)

    return i32x16(arr, i), cg


@intrinsic
def vload_i8(typingctx, arr, i):
    """16 bytes at ``&arr[i]``, sign-extended to ``i32x16``."""

    def cg(context, builder, sig, args):
        p = _ptr(context, builder, sig.args[0], args[0], args[1], _V16B)
        return builder.sext(builder.load(p, align=1), _V16I)

    return i32x16(arr, i), cg


@intrinsic
def vload_i16(typingctx, arr, i):
    """16 int16 (32 bytes at ``&arr[i]``), sign-extended to ``i32x16``."""

    def cg(context, builder, sig, args):
        p = _ptr(context, builder, sig.args[0], args[0], args[1], ir.VectorType(_I16, 16))
        return builder.sext(builder.load(p, align=1), _V16I)

    return i32x16(arr, i), cg


@intrinsic
def vbcast4(typingctx, arr, i):
    """The 4 bytes at ``&arr[i]`` repeated in every lane (``i32x16``)."""

    def cg(context, builder, sig, args):
        p = _ptr(context, builder, sig.args[0], args[0], args[1], _I32)
        return _splat(builder, builder.load(p, align=1), _V16I)

    return i32x16(arr, i), cg


@intrinsic
def vstore_f32(typingctx, arr, i, v):
    """Store ``f32x16`` to the 64 bytes at ``&arr[i]``."""

    def cg(context, builder, sig, args):
        p = _ptr(context, builder, sig.args[0], args[0], args[1], _V16F)
        builder.store(args[2], p, align=1)
        return context.get_dummy_value()

    return types.none(arr, i, v), cg


@intrinsic
def vstore_i32(typingctx, arr, i, v):
    """Store ``i32x16`` to the 64 bytes at ``&arr[i]``."""

    def cg(context, builder, sig, args):
        p = _ptr(context, builder, sig.args[0], args[0], args[1], _V16I)
        builder.store(args[2], p, align=1)
        return context.get_dummy_value()

    return types.none(arr, i, v), cg


@intrinsic
def vstore_f16(typingctx, arr, i, v):
    """Round ``f32x16`` to IEEE halves (nearest even) and store 32 bytes at ``&arr[i]``."""

    def cg(context, builder, sig, args):
        p = _ptr(context, builder, sig.args[0], args[0], args[1], _V16H)
        builder.store(builder.fptrunc(args[2], _V16H), p, align=1)
        return context.get_dummy_value()

    return types.none(arr, i, v), cg


@intrinsic
def vstore_bf16(typingctx, arr, i, v):
    """Round ``f32x16`` to bfloat16 and store 32 bytes at ``&arr[i]``: nearest even, and a NaN
    made quiet (``(bits >> 16) | 64``) as ggml's ``ggml_compute_fp32_to_bf16`` does."""
    if v != f32x16:
        return None

    def cg(context, builder, sig, args):
        u = builder.bitcast(args[2], _V16I)
        hi = builder.lshr(u, _const(_V16I, 16))
        odd = builder.and_(hi, _const(_V16I, 1))
        rounded = builder.lshr(
            builder.add(u, builder.add(odd, _const(_V16I, 0x7FFF))), _const(_V16I, 16)
        )
        mag = builder.and_(u, _const(_V16I, 0x7FFFFFFF))
        nan = builder.icmp_unsigned(">", mag, _const(_V16I, 0x7F800000))
        r = builder.select(nan, builder.or_(hi, _const(_V16I, 64)), rounded)
        p = _ptr(context, builder, sig.args[0], args[0], args[1], ir.VectorType(_I16, 16))
        builder.store(builder.trunc(r, ir.VectorType(_I16, 16)), p, align=1)
        return context.get_dummy_value()

    return types.none(arr, i, v), cg


# ----------------------------------------------------------------------------- constructors
@intrinsic
def vsplat_f32(typingctx, x):
    """``f32x16`` with every lane = ``x``."""

    def cg(context, builder, sig, args):
        v = context.cast(builder, args[0], sig.args[0], types.float32)
        return _splat(builder, v, _V16F)

    return f32x16(x), cg


@intrinsic
def vsplat_i32(typingctx, x):
    """``i32x16`` with every lane = ``x``."""

    def cg(context, builder, sig, args):
        return _splat(builder, _to_i32(context, builder, args[0], sig.args[0]), _V16I)

    return i32x16(x), cg


@intrinsic
def vzero_f32(typingctx):
    def cg(context, builder, sig, args):
        return _const(_V16F, 0.0)

    return f32x16(), cg


@intrinsic
def vzero_i32(typingctx):
    def cg(context, builder, sig, args):
        return _const(_V16I, 0)

    return i32x16(), cg


# ----------------------------------------------------------------------------- arithmetic
def _binop(name):
    def make(typingctx, a, b):
        if not (isinstance(a, VecType) and a == b):
            return None

        def cg(context, builder, sig, args):
            return getattr(builder, name)(args[0], args[1])

        return a(a, b), cg

    return intrinsic(make)


_vfadd, _vfsub, _vfmul = _binop("fadd"), _binop("fsub"), _binop("fmul")
_vfdiv = _binop("fdiv")
_viadd, _visub, _vimul = _binop("add"), _binop("sub"), _binop("mul")
_viand, _vior, _vixor = _binop("and_"), _binop("or_"), _binop("xor")


def _arith_overload(op, fop, iop):
    @overload(op)
    def _ov(a, b):
        if isinstance(a, VecType) and a == b:
            if a == f32x16 and fop is not None:
                return lambda a, b: fop(a, b)
            if a == i32x16 and iop is not None:
                return lambda a, b: iop(a, b)
        return None


import operator as _op  # noqa: E402

_arith_overload(_op.add, _vfadd, _viadd)
_arith_overload(_op.sub, _vfsub, _visub)
_arith_overload(_op.mul, _vfmul, _vimul)
_arith_overload(_op.truediv, _vfdiv, None)
_arith_overload(_op.and_, None, _viand)
_arith_overload(_op.or_, None, _vior)
_arith_overload(_op.xor, None, _vixor)


@intrinsic
def vfma(typingctx, a, b, c):
    """``a * b + c`` fused, lane by lane (``f32x16``)."""

    def cg(context, builder, sig, args):
        return builder.call(_fn(builder, "llvm.fma.v16f32", _V16F, [_V16F] * 3), args)

    return f32x16(a, b, c), cg


@intrinsic
def vmax(typingctx, a, b):
    def cg(context, builder, sig, args):
        return builder.call(_fn(builder, "llvm.maxnum.v16f32", _V16F, [_V16F] * 2), args)

    return f32x16(a, b), cg


@intrinsic
def vabs(typingctx, a):
    def cg(context, builder, sig, args):
        return builder.call(_fn(builder, "llvm.fabs.v16f32", _V16F, [_V16F]), args)

    return f32x16(a), cg


@intrinsic
def vsrl(typingctx, a, n):
    """Logical right shift of each 32-bit lane by ``n``."""

    def cg(context, builder, sig, args):
        s = _splat(builder, _to_i32(context, builder, args[1], sig.args[1]), _V16I)
        return builder.lshr(args[0], s)

    return i32x16(a, n), cg


@intrinsic
def vsll(typingctx, a, n):
    """Left shift of each 32-bit lane by ``n``."""

    def cg(context, builder, sig, args):
        s = _splat(builder, _to_i32(context, builder, args[1], sig.args[1]), _V16I)
        return builder.shl(args[0], s)

    return i32x16(a, n), cg


@intrinsic
def vand_k(typingctx, a, k):
    """Bitwise and of each 32-bit lane with the scalar ``k``."""

    def cg(context, builder, sig, args):
        return builder.and_(
            args[0], _splat(builder, _to_i32(context, builder, args[1], sig.args[1]), _V16I)
        )

    return i32x16(a, k), cg


@intrinsic
def vround_f16(typingctx, a):
    """Each lane rounded to the nearest IEEE half (ties to even), as storing f16 does."""

    def cg(context, builder, sig, args):
        return builder.fpext(builder.fptrunc(args[0], _V16H), _V16F)

    return f32x16(a), cg


@intrinsic
def vcvt(typingctx, a):
    """``i32x16`` -> ``f32x16`` (exact below 2**24)."""

    def cg(context, builder, sig, args):
        return builder.sitofp(args[0], _V16F)

    return f32x16(a), cg


@intrinsic
def vhsum(typingctx, a):
    """Sum of the 16 lanes (float32)."""

    def cg(context, builder, sig, args):
        fn = _fn(builder, "llvm.vector.reduce.fadd.v16f32", _F32, [_F32, _V16F])
        # reassoc: a tree reduction (halves added pairwise), not 16 dependent adds
        return builder.call(fn, [ir.Constant(_F32, -0.0), args[0]], fastmath=("reassoc",))

    return types.float32(a), cg


@intrinsic
def vhmax(typingctx, a):
    """Maximum of the 16 lanes (float32)."""

    def cg(context, builder, sig, args):
        fn = _fn(builder, "llvm.vector.reduce.fmax.v16f32", _F32, [_V16F])
        return builder.call(fn, [args[0]])

    return types.float32(a), cg


@intrinsic
def vhsum_i(typingctx, a):
    """Sum of the 16 lanes (int32)."""

    def cg(context, builder, sig, args):
        fn = _fn(builder, "llvm.vector.reduce.add.v16i32", _I32, [_V16I])
        return builder.call(fn, [args[0]])

    return types.int32(a), cg


@intrinsic
def vlane(typingctx, a, i):
    """Lane ``i`` of a vector as a scalar."""
    elem = a.elem if isinstance(a, VecType) else None
    if elem is None:
        return None

    def cg(context, builder, sig, args):
        idx = _to_i32(context, builder, args[1], sig.args[1])
        return builder.extract_element(args[0], idx)

    return elem(a, i), cg


@intrinsic
def vldexp(typingctx, a, n):
    """``a * 2**n`` lane by lane, ``n`` an integral ``f32x16`` (AVX-512 ``vscalefps``)."""

    def cg(context, builder, sig, args):
        ni = builder.fptosi(args[1], _V16I)
        fn = _fn(builder, "llvm.ldexp.v16f32.v16i32", _V16F, [_V16F, _V16I])
        return builder.call(fn, [args[0], ni])

    return f32x16(a, n), cg


@intrinsic
def vselect_gt(typingctx, a, b, x, y):
    """``x`` where ``a > b`` (ordered), else ``y``, lane by lane (``f32x16``)."""

    def cg(context, builder, sig, args):
        c = builder.fcmp_ordered(">", args[0], args[1])
        return builder.select(c, args[2], args[3])

    return f32x16(a, b, x, y), cg


@intrinsic
def vdpbusd(typingctx, acc, a, b):
    """``acc`` + per 32-bit lane the sum of 4 products ``u8(a) * s8(b)`` (VNNI ``vpdpbusd``)."""

    def cg(context, builder, sig, args):
        acc, a, b = args
        if HAS_VNNI:
            fn = _fn(builder, "llvm.x86.avx512.vpdpbusd.512", _V16I, [_V16I] * 3)
            return builder.call(fn, [acc, a, b])
        v64 = ir.VectorType(_I32, 64)
        prod = builder.mul(
            builder.zext(builder.bitcast(a, _V64B), v64),
            builder.sext(builder.bitcast(b, _V64B), v64),
        )
        out = acc
        for j in range(4):
            part = builder.shuffle_vector(
                prod, prod, ir.Constant(_V16I, [4 * i + j for i in range(16)])
            )
            out = builder.add(out, part)
        return out

    return i32x16(acc, a, b), cg


@intrinsic
def vshuffle_bytes(typingctx, table, idx):
    """Byte table lookup: byte ``k`` = ``table[idx[k] & 15]`` within each 16-byte lane.

    ``table`` holds the same 16 bytes in each 128-bit lane; ``idx`` bytes must be < 16.
    """

    def cg(context, builder, sig, args):
        t, i = args
        if HAS_AVX512BW:
            fn = _fn(builder, "llvm.x86.avx512.pshuf.b.512", _V64B, [_V64B, _V64B])
            r = builder.call(fn, [builder.bitcast(t, _V64B), builder.bitcast(i, _V64B)])
            return builder.bitcast(r, _V16I)
        tb = builder.bitcast(t, _V64B)
        ib = builder.bitcast(i, _V64B)
        out = ir.Constant(_V64B, [0] * 64)
        for k in range(16):
            val = builder.extract_element(tb, ir.Constant(_I32, k))
            hit = builder.icmp_unsigned("==", ib, _const(_V64B, k))
            out = builder.select(hit, _splat(builder, val, _V64B), out)
        return builder.bitcast(out, _V16I)

    return i32x16(table, idx), cg


@intrinsic
def vperm_f32(typingctx, table, idx):
    """Float table lookup: lane ``k`` = ``table[idx[k] & 15]`` (``f32x16`` table, ``i32x16``
    indices; AVX-512F ``vpermps``)."""
    if not (table == f32x16 and idx == i32x16):
        return None

    def cg(context, builder, sig, args):
        t, i = args
        i = builder.and_(i, _const(_V16I, 15))
        if HAS_AVX512F:
            fn = _fn(builder, "llvm.x86.avx512.permvar.sf.512", _V16F, [_V16F, _V16I])
            return builder.call(fn, [t, i])
        out = ir.Constant(_V16F, None)
        for k in range(16):
            j = builder.extract_element(i, ir.Constant(_I32, k))
            out = builder.insert_element(out, builder.extract_element(t, j), ir.Constant(_I32, k))
        return out

    return f32x16(table, idx), cg


# ----------------------------------------------------------------------------- scalars
@intrinsic
def fmaf(typingctx, a, b, c):
    """float32 ``a * b + c`` with one rounding (C ``fmaf``)."""

    def cg(context, builder, sig, args):
        vals = [context.cast(builder, v, t, types.float32) for v, t in zip(args, sig.args)]
        return builder.call(_fn(builder, "llvm.fma.f32", _F32, [_F32] * 3), vals)

    return types.float32(a, b, c), cg


@intrinsic
def f16_to_f32(typingctx, bits):
    """IEEE half given as its 16 bits (any integer type) -> float32."""

    def cg(context, builder, sig, args):
        v = args[0]
        w = v.type.width
        v = builder.trunc(v, _I16) if w > 16 else (builder.zext(v, _I16) if w < 16 else v)
        return builder.fpext(builder.bitcast(v, _F16), _F32)

    return types.float32(bits), cg


@intrinsic
def f32_to_f16(typingctx, x):
    """float32 -> IEEE half bits (uint16), rounding to nearest even."""

    def cg(context, builder, sig, args):
        v = context.cast(builder, args[0], sig.args[0], types.float32)
        return builder.bitcast(builder.fptrunc(v, _F16), _I16)

    return types.uint16(x), cg


@intrinsic
def bits_to_f32(typingctx, bits):
    """The float32 whose IEEE bits are the low 32 bits of an integer."""

    def cg(context, builder, sig, args):
        v = args[0]
        w = v.type.width
        v = builder.trunc(v, _I32) if w > 32 else (builder.zext(v, _I32) if w < 32 else v)
        return builder.bitcast(v, _F32)

    return types.float32(bits), cg


@intrinsic
def f32_to_bits(typingctx, x):
    """The IEEE bits of a float32, as uint32."""

    def cg(context, builder, sig, args):
        v = context.cast(builder, args[0], sig.args[0], types.float32)
        return builder.bitcast(v, _I32)

    return types.uint32(x), cg


@intrinsic
def load_u32(typingctx, arr, i):
    """The 4 bytes at ``&arr[i]`` as a uint32 (unaligned)."""

    def cg(context, builder, sig, args):
        return builder.load(_ptr(context, builder, sig.args[0], args[0], args[1], _I32), align=1)

    return types.uint32(arr, i), cg


@intrinsic
def store_u32(typingctx, arr, i, x):
    """Store the low 32 bits of ``x`` in the 4 bytes at ``&arr[i]`` (unaligned)."""

    def cg(context, builder, sig, args):
        v = context.cast(builder, args[2], sig.args[2], types.uint32)
        builder.store(v, _ptr(context, builder, sig.args[0], args[0], args[1], _I32), align=1)
        return context.get_dummy_value()

    return types.none(arr, i, x), cg


@intrinsic
def load_f32(typingctx, arr, i):
    """The float32 stored in the 4 bytes at ``&arr[i]``."""

    def cg(context, builder, sig, args):
        return builder.load(_ptr(context, builder, sig.args[0], args[0], args[1], _F32), align=1)

    return types.float32(arr, i), cg


@intrinsic
def load_f16(typingctx, arr, i):
    """The IEEE half stored in the 2 bytes at ``&arr[i]``, as float32."""

    def cg(context, builder, sig, args):
        h = builder.load(_ptr(context, builder, sig.args[0], args[0], args[1], _F16), align=1)
        return builder.fpext(h, _F32)

    return types.float32(arr, i), cg


@intrinsic
def store_f32(typingctx, arr, i, x):
    """Store float32 ``x`` in the 4 bytes at ``&arr[i]``."""

    def cg(context, builder, sig, args):
        v = context.cast(builder, args[2], sig.args[2], types.float32)
        builder.store(v, _ptr(context, builder, sig.args[0], args[0], args[1], _F32), align=1)
        return context.get_dummy_value()

    return types.none(arr, i, x), cg


@intrinsic
def store_f16(typingctx, arr, i, x):
    """Store ``x`` rounded to an IEEE half (nearest even) in the 2 bytes at ``&arr[i]``."""

    def cg(context, builder, sig, args):
        v = context.cast(builder, args[2], sig.args[2], types.float32)
        p = _ptr(context, builder, sig.args[0], args[0], args[1], _F16)
        builder.store(builder.fptrunc(v, _F16), p, align=1)
        return context.get_dummy_value()

    return types.none(arr, i, x), cg


@intrinsic
def round_f16(typingctx, x):
    """float32 rounded to the nearest IEEE half and back (what storing as f16 keeps)."""

    def cg(context, builder, sig, args):
        v = context.cast(builder, args[0], sig.args[0], types.float32)
        return builder.fpext(builder.fptrunc(v, _F16), _F32)

    return types.float32(x), cg


# ----------------------------------------------------------------------------- atomics
@intrinsic
def atomic_add(typingctx, arr, i, v):
    """``arr[i] += v`` atomically (sequentially consistent); returns the old value."""
    if not isinstance(arr, types.Array):
        return None
    dtype = arr.dtype

    def cg(context, builder, sig, args):
        p = _ptr(context, builder, sig.args[0], args[0], args[1], context.get_value_type(dtype))
        val = context.cast(builder, args[2], sig.args[2], dtype)
        return builder.atomic_rmw("add", p, val, "seq_cst")

    return dtype(arr, i, v), cg


@intrinsic
def atomic_load(typingctx, arr, i):
    """``arr[i]`` read atomically (acquire)."""
    if not isinstance(arr, types.Array):
        return None
    dtype = arr.dtype

    def cg(context, builder, sig, args):
        lty = context.get_value_type(dtype)
        p = _ptr(context, builder, sig.args[0], args[0], args[1], lty)
        return builder.load_atomic(p, "acquire", align=dtype.bitwidth // 8)

    return dtype(arr, i), cg


@intrinsic
def atomic_store(typingctx, arr, i, v):
    """``arr[i] = v`` atomically (release)."""
    if not isinstance(arr, types.Array):
        return None
    dtype = arr.dtype

    def cg(context, builder, sig, args):
        lty = context.get_value_type(dtype)
        p = _ptr(context, builder, sig.args[0], args[0], args[1], lty)
        val = context.cast(builder, args[2], sig.args[2], dtype)
        builder.store_atomic(val, p, "release", align=dtype.bitwidth // 8)
        return context.get_dummy_value()

    return types.none(arr, i, v), cg


@intrinsic
def sched_yield(typingctx):
    """Give the CPU to another thread (libc ``sched_yield``, resolved when the code is linked)."""

    def cg(context, builder, sig, args):
        builder.call(_fn(builder, "sched_yield", _I32, []), [])
        return context.get_dummy_value()

    return types.none(), cg


@intrinsic
def prefetch(typingctx, arr, i):
    """Hint the cache to fetch the line at ``&arr[i]`` (read, keep in all levels)."""

    def cg(context, builder, sig, args):
        p = _ptr(context, builder, sig.args[0], args[0], args[1], _I8)
        fn = _fn(builder, "llvm.prefetch.p0", ir.VoidType(), [_I8.as_pointer(), _I32, _I32, _I32])
        builder.call(fn, [p, ir.Constant(_I32, 0), ir.Constant(_I32, 3), ir.Constant(_I32, 1)])
        return context.get_dummy_value()

    return types.none(arr, i), cg


@intrinsic
def cycles(typingctx):
    """The CPU's cycle counter (``rdtsc``), for cheap in-kernel profiling."""

    def cg(context, builder, sig, args):
        return builder.call(_fn(builder, "llvm.readcyclecounter", _I64, []), [])

    return types.int64(), cg


@intrinsic
def cpu_relax(typingctx):
    """A spin-wait hint (x86 ``pause``); a no-op elsewhere."""

    def cg(context, builder, sig, args):
        if "sse2" in _FEATURES:
            builder.call(_fn(builder, "llvm.x86.sse2.pause", ir.VoidType(), []), [])
        return context.get_dummy_value()

    return types.none(), cg
