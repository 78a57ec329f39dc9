"""Float operations as ggml's x86 kernels take them, for the numpy references of the kernel
tests (``test_ops_iq``, ``test_ops_bits``)."""

from __future__ import annotations

import numpy as np

F32 = np.float32


def fma32(a, b, c):
    """float32 ``a * b + c`` rounded once (the product is exact in long double)."""
    ld = np.longdouble
    return (ld(a) * ld(b) + ld(c)).astype(F32)


def hsum_float_8(a):
    """ggml's hsum_float_8 over the last axis (8 lanes), float32."""
    return ((a[..., 4] + a[..., 0]) + (a[..., 6] + a[..., 2])) + (
        (a[..., 5] + a[..., 1]) + (a[..., 7] + a[..., 3])
    )
