"""One traits record per weight format: everything the engine knows about a ggml type.

The role of ggml's ``type_traits`` / ``type_traits_cpu``. A :class:`FormatTraits` holds

* ``layout``: the block (elements ``qk``, bytes in the file), how a 16-row group of blocks
  is repacked (fields, group block bytes: see :mod:`.formats`) and the activation kind its
  kernels consume (``act``: q8 / q8_K / float, see :mod:`.quantize_act`);
* ``matmul``: the compiled kernel ``mm(w, desc, A, t0, t1, g0, g1, out, ot, add)`` over
  repacked weights (its dot-product kernels per token count are bound inside it);
  ``matmul_invariant`` / ``matmul_rows`` (optional): the same with single-token numerics
  for every token, over a token range / over gathered rows (see the fields);
* ``row``: the compiled decoder of one row of one repacked group block
  ``row(w, o, r, out, y0)`` (embedding lookups, the tied output head);
* ``dequant_numpy``: the numpy twin of ``row`` over whole tensors
  (``fields -> float32 [nrows, nblk, qk]`` from :func:`.formats.unpack_fields`);
* ``block_min``: the field of a per-block min (Q4_1, Q5_1), for the numpy matmul twin;
* ``quant`` (property): the :mod:`llamacpy.quants` format (quantize / dequantize of the
  file's blocks) that the quantize tool uses.

Matmul dispatch (:mod:`.matmul`), row decoding (:mod:`.dequant`), repacking
(:mod:`.formats`) and the loaders read the record; no other engine code names a type id or a
block size. A format's record sits next to its kernels (:mod:`.qdot_float`,
:mod:`.qdot_legacy`, :mod:`.qdot_k`, :mod:`.qdot_iq`, :mod:`.qdot_bits`), which
:func:`register` it at import.
:data:`KERNEL_MODULES` says which module holds which formats, so a model imports only the
kernel modules of its own formats (the IQ and K-quant kernels are ~45 ms of a start that
needs neither). Adding a format = its ``quants/`` module + its kernels + its record (and its
name under its module in :data:`KERNEL_MODULES`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ModelError
from ..gguf.constants import GGML_BLOCK_SIZES, GGMLType

# repacked field kinds (see .formats)
ROWS, CHUNK4, XOR80, T, Q5HB, K4SC, Q3SC, IQ4XSSC, IQV, PLANES = range(10)
GROUP = 16  # rows per row group (vector lanes)
# an IQV field (grid / ternary formats decoded to their integer form, see .formats): f16 d per
# row, 16 scale bytes per row (one per 16 weights), 256 4-bit value codes per row, and the
# table of the 16 values + 128 (u8) the codes stand for, four times (one per 128-bit lane)
IQV_D, IQV_SC, IQV_V = 0, GROUP * 2, GROUP * 18
IQV_TAB = IQV_V + GROUP * 128
IQV_BYTES = IQV_TAB + 64

# which activation a format's kernel consumes
ACT_Q8 = 0  # int8, one f32 scale per 32 (ggml's q8_0 / q8_1)
ACT_Q8K = 1  # int8, one f32 scale per 256, sums per 16 (ggml's q8_K)
ACT_F32 = 2  # float32 as is
ACT_F16 = 3  # float32 rounded to f16 precision (ggml converts activations to f16)
ACT_BF16 = 4  # float32 rounded to bf16 precision

# the modules that define format kernels, and the formats whose records each registers
KERNEL_MODULES: dict[str, tuple[GGMLType, ...]] = {
    "qdot_float": (GGMLType.F32, GGMLType.F16, GGMLType.BF16),
    "qdot_legacy": (
        GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0,
        GGMLType.IQ4_NL, GGMLType.MXFP4,
    ),
    "qdot_k": (
        GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K,
        GGMLType.IQ4_XS,
    ),
    "qdot_iq": (
        GGMLType.IQ2_XXS, GGMLType.IQ2_XS, GGMLType.IQ3_XXS, GGMLType.IQ1_S, GGMLType.IQ3_S,
        GGMLType.IQ2_S, GGMLType.IQ1_M, GGMLType.TQ1_0, GGMLType.TQ2_0,
    ),
    "qdot_bits": (GGMLType.NVFP4, GGMLType.Q1_0, GGMLType.Q2_0),
}  # fmt: skip
_HOME = {t: name for name, ts in KERNEL_MODULES.items() for t in ts}


def _field_bytes(kind: int, n: int) -> int:
    """Bytes a field of ``n`` source bytes per row takes in a 16-row group block."""
    if kind == Q5HB:
        return GROUP * 4
    if kind in (K4SC, Q3SC):
        return GROUP * 16
    if kind == IQ4XSSC:
        return GROUP * 8
    if kind == IQV:
        return IQV_BYTES
    return GROUP * n


@dataclass(frozen=True)
class Layout:
    """A block and its repacked form: ``ops`` rows are (kind, src_off, nbytes, dst_off, elem)."""

    type: GGMLType
    qk: int  # elements per (virtual) block
    src_bytes: int  # bytes per block in the GGUF file (per row)
    dst_bytes: int  # bytes per block of a 16-row group after repacking
    act: int
    ops: tuple[tuple[int, int, int, int, int], ...]

    @classmethod
    def of(cls, t: GGMLType, qk: int, act: int, *fields) -> Layout:
        """The layout of ``t`` from its fields ``(kind, src_off, nbytes[, elem])`` in
        repacked order (destination offsets and group block size follow)."""
        src = GGML_BLOCK_SIZES[t][1] * qk // GGML_BLOCK_SIZES[t][0]
        ops, dst = [], 0
        for kind, so, n, *e in fields:
            ops.append((kind, so, n, dst, e[0] if e else 1))
            dst += _field_bytes(kind, n)
        return cls(GGMLType(t), qk, src, dst, act, tuple(ops))

    @property
    def ops_array(self) -> np.ndarray:
        return np.array(self.ops, dtype=np.int64).reshape(-1, 5)


@dataclass(frozen=True)
class FormatTraits:
    """What the engine knows about one weight format (see the module docstring)."""

    layout: Layout
    matmul: Any  # numba kernel
    row: Any  # numba kernel
    dequant_numpy: Callable[[dict], np.ndarray]
    # the unpacked field of a per-block f16 min that ggml's dot product adds as ``m * s``
    # (``s``: the q8_1 activation block's sum), for the numpy twin of the matmul
    block_min: str | None = None
    # a matmul kernel whose arithmetic for a token does not depend on how many tokens one
    # call has (single-token numerics for every token), where ``matmul``'s does (it follows
    # llama.cpp's batched kernels); what a deterministic context runs. None: ``matmul``.
    matmul_invariant: Any = None
    # a kernel ``mm_rows(w, desc, A, rows, n, adiv, a0, g0, g1, out, o0, add)`` over gathered
    # rows (``out[o0 + r] (+)= W . act(A[a0 + r // adiv])`` for ``r`` in ``rows[:n]``; an
    # empty ``rows``: ``r = 0..n-1``) with single-token numerics for every row: one expert's
    # tokens in a mixture of experts. None: ``matmul`` called row by row.
    matmul_rows: Any = None

    @property
    def type(self) -> GGMLType:
        return self.layout.type

    @property
    def id(self) -> int:
        """The ggml type id (what compiled code compares a descriptor's type with)."""
        return int(self.layout.type)

    @property
    def qk(self) -> int:
        return self.layout.qk

    @property
    def act(self) -> int:
        return self.layout.act

    @property
    def quant(self):
        """The :mod:`llamacpy.quants` format of this type."""
        from .. import quants

        return quants.get(self.type)


_TABLE: dict[GGMLType, FormatTraits] = {}


def register(tr: FormatTraits) -> FormatTraits:
    """Add a format's record (once, from the module that defines its kernels)."""
    if tr.type in _TABLE:
        raise ValueError(f"weight format {tr.type.name} registered twice")
    _TABLE[tr.type] = tr
    return tr


def _load(names=KERNEL_MODULES) -> None:
    for name in names:
        importlib.import_module(f"{__package__}.{name}")


def all_traits() -> tuple[FormatTraits, ...]:
    """Every registered format, by type id (imports every kernel module)."""
    _load()
    return tuple(sorted(_TABLE.values(), key=lambda tr: tr.id))


def supported_types() -> tuple[GGMLType, ...]:
    """The weight types the engine runs (no kernel module imported)."""
    return tuple(sorted(_HOME, key=int))


def type_id(t: GGMLType | int, tensor: str | None = None) -> int:
    """The type id of ``t`` (what compiled code compares a descriptor's type with) without
    importing its kernels; a :class:`ModelError` naming the type (and tensor) if the engine
    has no kernels for it."""
    try:
        t = GGMLType(t)
        if t in _HOME:
            return int(t)
    except ValueError:
        pass
    where = f" (tensor {tensor!r})" if tensor else ""
    names = ", ".join(x.name for x in supported_types())
    name = GGMLType(t).name if t in GGMLType._value2member_map_ else str(t)
    raise ModelError(
        f"weight type {name} is not supported by the matmul kernels{where}; supported: {names}"
    )


def get(t: GGMLType | int, tensor: str | None = None) -> FormatTraits:
    """The record of ``t`` (its kernel module imported on first use); a :class:`ModelError`
    naming the type (and tensor) if the engine has no kernels for it."""
    t = GGMLType(type_id(t, tensor))
    if t not in _TABLE:
        _load((_HOME[t],))
    return _TABLE[t]
