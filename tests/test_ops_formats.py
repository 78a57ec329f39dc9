"""Repacked weight layouts: numba repack == numpy twin, and dequantization from the repacked
layout == the ``gguf`` package's dequantization of the original bytes, for every format."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from llamacpy.errors import ModelError
from llamacpy.gguf import GGMLType
from llamacpy.models.tiny import random_tensor
from llamacpy.ops import dequant, formats, traits

TYPES = list(traits.supported_types())


def _raw(t: GGMLType, nrows: int, ncols: int, seed: int = 0) -> np.ndarray:
    return random_tensor(np.random.default_rng(seed), t, nrows, ncols)


def _ncols(t: GGMLType, n: int = 2) -> int:
    return traits.get(t).layout.qk * n if traits.get(t).layout.qk > 16 else 48


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("nrows", [1, 16, 37])
def test_repack_matches_numpy_twin(t: GGMLType, nrows: int) -> None:
    ncols = _ncols(t)
    raw = np.random.default_rng(nrows).integers(
        0,
        256,
        traits.get(t).layout.src_bytes * nrows * ncols // traits.get(t).layout.qk,
        dtype=np.uint8,
    )
    a = formats.repack(raw, t, nrows, ncols)
    b = formats.repack_numpy(raw, t, nrows, ncols)
    assert a.size == formats.repacked_nbytes(t, nrows, ncols)
    np.testing.assert_array_equal(a, b)


def _reference_dequantize(raw: np.ndarray, t: GGMLType, nrows: int, ncols: int) -> np.ndarray:
    """gguf-py's dequantization, or (for the types it has none for: Q1_0, Q2_0) the quants
    module's, which tests/test_quants.py checks against ggml's."""
    try:
        return gguf.quants.dequantize(raw.reshape(nrows, -1), gguf.GGMLQuantizationType(int(t)))
    except (ValueError, NotImplementedError):
        return traits.get(t).quant.dequantize(raw, nrows * ncols)


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_dequantize_repacked_matches_gguf(t: GGMLType) -> None:
    nrows, ncols = 21, _ncols(t, 3)
    raw = _raw(t, nrows, ncols)
    packed = formats.repack(raw, t, nrows, ncols)
    ours = dequant.dequantize_repacked_numpy(packed, t, nrows, ncols)
    ref = _reference_dequantize(raw, t, nrows, ncols)
    np.testing.assert_array_equal(ours, ref.reshape(nrows, ncols).astype(np.float32))


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_get_row_matches_numpy_twin(t: GGMLType) -> None:
    nrows, ncols = 19, _ncols(t)
    packed = formats.repack(_raw(t, nrows, ncols, seed=3), t, nrows, ncols)
    full = dequant.dequantize_repacked_numpy(packed, t, nrows, ncols)
    row = np.zeros(ncols, np.float32)
    for r in (0, 5, 15, 16, 18):
        dequant.get_row(packed, 0, int(t), ncols, r, row)
        np.testing.assert_array_equal(row, full[r])


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_bytes_short_of_the_tensor_are_a_clear_error(t: GGMLType) -> None:
    nrows, ncols = 3, _ncols(t)
    need = len(_raw(t, nrows, ncols))
    short = np.zeros(need - 1, np.uint8)
    msg = rf"{t.name} tensor has {need - 1} bytes, {need} needed"
    for repack in (formats.repack, formats.repack_numpy):
        with pytest.raises(ModelError, match=msg):
            repack(short, t, nrows, ncols)


def test_unsupported_type_is_a_clear_error() -> None:
    with pytest.raises(ModelError, match="Q8_K is not supported.*supported: F32"):
        formats.layout(GGMLType.Q8_K, tensor="blk.0.attn_q.weight")
    with pytest.raises(ModelError, match="multiple of 32"):
        formats.repack(np.zeros(100, np.uint8), GGMLType.Q4_0, 2, 40)
