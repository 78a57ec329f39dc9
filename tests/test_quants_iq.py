"""The grid and ternary formats (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, TQ1_0,
TQ2_0) against ggml's ``to_float`` (fixture made by scripts/make_iq_fixtures.py from
libggml-base: random blocks, moderate / denormal / huge / inf / NaN / signed-zero scales)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import gguf
import gguf.quants as gq
import numpy as np
import pytest

import llamacpy.quants as Q
from llamacpy.quants import _iqgrid

FIXTURE = Path(__file__).parent / "fixtures" / "quants" / "iq_dequant.npz"
TYPES = ["IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "TQ1_0", "TQ2_0"]
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


@cache
def _fixture() -> dict[str, np.ndarray]:
    with np.load(FIXTURE) as z:
        return {k: z[k] for k in z.files}


def _same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))


@pytest.mark.parametrize("name", TYPES)
def test_dequantize_equals_ggml_to_float(name):
    raw, ref = _fixture()[f"raw/{name}"], _fixture()[f"ggml/{name}"]
    fmt = Q.get(name)
    assert ref.size == raw.size // fmt.type_size * 256
    for dequantize in (fmt.dequantize, fmt.dequantize_numpy):
        ours = dequantize(raw, ref.size)
        assert _same(ours, ref).all(), f"{(~_same(ours, ref)).sum()} of {ref.size} differ"
    assert np.isnan(ref).any() and np.isinf(ref).any()  # the special scales are covered


@pytest.mark.parametrize("name", TYPES)
def test_dequantize_equals_gguf_py(name):
    raw = _fixture()[f"raw/{name}"]
    fmt = Q.get(name)
    expected = gq.dequantize(raw.reshape(-1, fmt.type_size), gguf.GGMLQuantizationType[name])
    assert _same(fmt.dequantize(raw, expected.size), expected.reshape(-1).astype(np.float32)).all()


@pytest.mark.parametrize("name", TYPES)
def test_every_index_and_sign_pattern_decodes(name):
    """All-ones and all-zeros index, sign and scale bits (the grids' last and first points)."""
    fmt = Q.get(name)
    for fill in (0x00, 0xFF):
        raw = np.full(fmt.type_size * 2, fill, np.uint8)
        ours = fmt.dequantize(raw, 512)
        assert _same(ours, fmt.dequantize_numpy(raw, 512)).all()


def test_grids_have_one_entry_per_index_value():
    widths = {"iq2xxs_grid": 8, "iq2xs_grid": 9, "iq2s_grid": 10, "iq3xxs_grid": 8,
              "iq3s_grid": 9, "iq1s_grid": 11}  # fmt: skip
    for name, bits in widths.items():
        assert _iqgrid.grid(name, bits).shape[0] == 1 << bits
        with pytest.raises(AssertionError, match=name):
            _iqgrid.grid(name, bits + 1)


@pytest.mark.parametrize("name", TYPES)
def test_short_buffer_names_the_format_and_tensor(name):
    fmt = Q.get(name)

    class Info:
        type = fmt.ggml_type
        np_shape = (2, 256)
        raw = np.zeros(2 * fmt.type_size - 1, np.uint8)

    Info.name = "blk.7.ffn_down.weight"
    need = 2 * fmt.type_size
    with pytest.raises(Q.QuantError, match=rf"{name}: 512 elements need {need} bytes.*ffn_down"):
        Q.dequantize(Info())
    with pytest.raises(Q.QuantError, match="not a multiple of the block size 256"):
        fmt.dequantize(np.zeros(fmt.type_size, np.uint8), 128)
