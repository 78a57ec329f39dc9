"""ggml's ``ggml_validate_row_data``: no NaN or infinity in float data or in block scales.

llama-quantize checks every input tensor as it reads it and every chunk it quantizes; a
model with a NaN weight (or a block scale that overflowed) is refused instead of written.
"""

from __future__ import annotations

import numpy as np

from ..gguf.constants import GGMLType

# float size -> (same-size unsigned type, magnitude mask, bits of +inf)
_BITS = {
    2: (np.uint16, 0x7FFF, 0x7C00),
    4: (np.uint32, 0x7FFF_FFFF, 0x7F80_0000),
    8: (np.uint64, 0x7FFF_FFFF_FFFF_FFFF, 0x7FF0_0000_0000_0000),
}


def _count(values: np.ndarray) -> tuple[int, int]:
    """(NaNs, infinities) among float values, from their bits: one integer pass when all are
    finite (numpy's float16 ``isnan``/``isinf`` on a strided block field are ~10x slower)."""
    ut, mask, inf = _BITS[values.dtype.itemsize]
    mag = values.view(ut) & ut(mask)
    if mag.size == 0 or mag.max() < inf:
        return 0, 0
    return int(np.count_nonzero(mag > inf)), int(np.count_nonzero(mag == inf))


def invalid_data(t: GGMLType, raw: np.ndarray) -> str | None:
    """None when the bytes of ``t`` values pass ggml's check, else what is wrong.

    Float types check every value; block types check their float scale fields (``d``,
    ``dmin``, ``m``, ``s``). Types :mod:`llamacpy.quants` does not describe are not checked.
    """
    from .. import quants

    raw = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    if t == GGMLType.BF16:
        bits = raw.view("<u2") & 0x7FFF
        nans, infs = int(np.count_nonzero(bits > 0x7F80)), int(np.count_nonzero(bits == 0x7F80))
        return _message(nans, infs, "BF16 values")
    if t == GGMLType.F64:
        return _message(*_count(raw.view("<f8")), "F64 values")
    try:
        dtype = quants.get(t).block_dtype
    except quants.UnsupportedQuantTypeError:
        return None
    if raw.size % dtype.itemsize:
        return f"{raw.size} bytes is not a whole number of {t.name} blocks"
    blocks = raw.view(dtype)
    if dtype.names is None:  # F16, F32: plain values
        return _message(*_count(blocks), f"{t.name} values")
    for name in dtype.names:
        field = dtype.fields[name][0]
        if field.kind == "f" and field.shape == ():
            msg = _message(*_count(blocks[name]), f"'{name}' scales of {t.name} blocks")
            if msg:
                return msg
    return None


def _message(nans: int, infs: int, what: str) -> str | None:
    if nans:
        return f"found {nans} NaN(s) in the {what}"
    if infs:
        return f"found {infs} infinit{'y' if infs == 1 else 'ies'} in the {what}"
    return None
