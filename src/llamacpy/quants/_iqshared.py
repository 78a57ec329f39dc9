"""Pieces shared by the grid quantizers (IQ1, IQ2, IQ3: :mod:`._iq1quant`,
:mod:`._iq2quant`, :mod:`._iq3quant`): ggml's sign handling of a sub-block and the first
lane of a vector minimum (the neighbour searches)."""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from llamacpy.quants._helpers import F0
from llamacpy.simd import f32x16

_LANES = 16


@njit(cache=True, inline="always")
def signs_and_max(x, o, n, weight, xval, signs, paired):
    """Magnitudes ``xval = |x[o:o + n]|`` and one sign byte per 8 weights to ``signs``;
    returns the largest magnitude (C's ``MAX`` order). ``paired`` (IQ2_XXS, IQ2_XS,
    IQ3_XXS): an even number of signs per 8, the least important weight
    (``weight * x**2``, the first of equals) flipped, and 7 stored sign bits."""
    for k in range(n // 8):
        nflip = 0
        s = 0
        for i in range(8):
            v = x[o + 8 * k + i]
            if v >= F0:
                xval[8 * k + i] = v
            else:
                xval[8 * k + i] = -v
                nflip += 1
                s |= 1 << i
        if paired and nflip % 2:
            imin = 0
            e = o + 8 * k
            mn = weight[8 * k] * x[e] * x[e]
            for i in range(1, 8):
                ax = weight[8 * k + i] * x[e + i] * x[e + i]
                if ax < mn:
                    mn = ax
                    imin = i
            xval[8 * k + imin] = -xval[8 * k + imin]
            s ^= 1 << imin
        signs[k] = s & 127 if paired else s
    mx = xval[0]
    for i in range(1, n):
        mx = mx if mx > xval[i] else xval[i]
    return mx


_V16F = ir.VectorType(ir.FloatType(), _LANES)
_MASK16 = ir.IntType(_LANES)


@intrinsic
def _vmin_lane(typingctx, v):
    """``(min, first lane holding it)`` of an ``f32x16`` with no NaN lane."""
    if v != f32x16:
        return None

    def cg(context, builder, sig, args):
        def fn(name, ret, argtys):
            return cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ret, argtys), name
            )

        reduce = fn("llvm.vector.reduce.fmin.v16f32", ir.FloatType(), [_V16F])
        m = builder.call(reduce, [args[0]], fastmath=("nnan",))
        splat = builder.insert_element(ir.Constant(_V16F, None), m, ir.IntType(32)(0))
        zeros = ir.Constant(ir.VectorType(ir.IntType(32), _LANES), [0] * _LANES)
        splat = builder.shuffle_vector(splat, splat, zeros)
        eq = builder.bitcast(builder.fcmp_ordered("==", args[0], splat), _MASK16)
        cttz = fn("llvm.cttz.i16", _MASK16, [_MASK16, ir.IntType(1)])
        lane = builder.call(cttz, [eq, ir.IntType(1)(0)])
        return cgutils.make_anonymous_struct(builder, [m, builder.zext(lane, ir.IntType(64))])

    return types.Tuple((types.float32, types.int64))(v), cg
