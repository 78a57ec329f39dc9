"""The registry every format module adds itself to."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from llamacpy.gguf.constants import GGML_BLOCK_SIZES, GGMLType
from llamacpy.quants._errors import UnsupportedQuantTypeError

Dequantizer = Callable[..., np.ndarray]
Quantizer = Callable[..., np.ndarray]


@dataclass(frozen=True)
class QuantFormat:
    """One ggml tensor type: its block layout and (de)quantizers.

    ``dequantize(raw, n, out=None)`` turns the bytes of ``n`` elements into float32 (numba;
    written to ``out``, a float32 array of ``n`` elements, when given);
    ``quantize(x, imatrix=None, out=None)`` turns a float array whose last axis is a row into
    uint8 of shape ``(..., bytes_per_row)`` (numba; written to ``out``, a uint8 array with as
    many bytes, when given), with the same bytes llama.cpp's ``ggml_quantize_chunk`` writes. The ``*_numpy`` twins are independent vectorized
    implementations of the same functions (slower; used to cross-check; no ``out``).
    ``vec_dot_type`` is the type ggml's CPU backend converts activations to for dot products
    with this type.
    """

    ggml_type: GGMLType
    block_dtype: np.dtype
    dequantize: Dequantizer
    dequantize_numpy: Dequantizer
    quantize: Quantizer | None
    quantize_numpy: Quantizer | None
    vec_dot_type: GGMLType | None

    @property
    def name(self) -> str:
        return self.ggml_type.name

    @property
    def block_size(self) -> int:
        return GGML_BLOCK_SIZES[self.ggml_type][0]

    @property
    def type_size(self) -> int:
        return GGML_BLOCK_SIZES[self.ggml_type][1]

    def row_nbytes(self, n_per_row: int) -> int:
        return n_per_row // self.block_size * self.type_size


_FORMATS: dict[GGMLType, QuantFormat] = {}

# the format modules, imported (and so registered) on the first lookup: importing the package
# for one helper (the engine's repacking needs ``_iqcodes``) does not load every format
FORMAT_MODULES = ("floats", "iq1_m", "iq1_s", "iq2_s", "iq2_xs", "iq2_xxs", "iq3_s",
                  "iq3_xxs", "iq4_nl", "iq4_xs", "mxfp4", "nvfp4", "q1_0", "q2_0", "q2_k", "q3_k",
                  "q4_0", "q4_1",
                  "q4_k", "q5_0", "q5_1", "q5_k", "q6_k", "q8_0", "q8_1", "q8_k", "tq1_0",
                  "tq2_0")  # fmt: skip
_loaded = False


def _load_all() -> None:
    global _loaded
    if not _loaded:
        for name in FORMAT_MODULES:
            importlib.import_module(f"llamacpy.quants.{name}")
        _loaded = True


def register(fmt: QuantFormat) -> QuantFormat:
    """Add a format (called once by each format module at import)."""
    expected = GGML_BLOCK_SIZES[fmt.ggml_type][1]
    assert fmt.block_dtype.itemsize == expected, (fmt.name, fmt.block_dtype.itemsize, expected)
    assert fmt.ggml_type not in _FORMATS, fmt.name
    _FORMATS[fmt.ggml_type] = fmt
    return fmt


def get(ggml_type: GGMLType | int | str, *, tensor: str | None = None) -> QuantFormat:
    """The format of a ggml type (enum, id or name such as ``"Q4_K"``).

    Raises :class:`UnsupportedQuantTypeError` naming the type (and ``tensor`` if given).
    """
    key: Any = ggml_type
    try:
        key = GGMLType[ggml_type.upper()] if isinstance(ggml_type, str) else GGMLType(ggml_type)
    except (KeyError, ValueError):
        raise UnsupportedQuantTypeError(ggml_type, tensor=tensor) from None
    _load_all()
    fmt = _FORMATS.get(key)
    if fmt is None:
        raise UnsupportedQuantTypeError(key, tensor=tensor)
    return fmt


def formats() -> dict[GGMLType, QuantFormat]:
    """All registered formats, by type."""
    _load_all()
    return dict(_FORMATS)
