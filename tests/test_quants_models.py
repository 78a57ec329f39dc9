"""llamacpy.quants on every tensor of both real models, cross-checked with gguf-py."""

from __future__ import annotations

from pathlib import Path

import gguf
import gguf.quants as gq
import numpy as np
import pytest

import llamacpy.quants as Q
from llamacpy.gguf import GGUFReader

pytestmark = pytest.mark.real_model

MODELS = ["smollm2_path", "gemma3_path"]
CHUNK = 1 << 22


def assert_same_bits(a: np.ndarray, b: np.ndarray, what: str) -> None:
    a = np.asarray(a, dtype=np.float32).reshape(-1)
    b = np.asarray(b, dtype=np.float32).reshape(-1)
    same = (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))
    assert same.all(), f"{what}: {(~same).sum()} of {a.size} values differ"


@pytest.mark.parametrize("model", MODELS)
def test_dequantize_every_tensor(model: str, request) -> None:
    path: Path = request.getfixturevalue(model)
    seen: dict[str, int] = {}
    with GGUFReader(path) as r:
        for info in r.tensors:
            fmt = Q.get(info.type, tensor=info.name)
            ours = Q.dequantize(info)
            assert ours.shape == info.np_shape and ours.dtype == np.float32
            ours = ours.reshape(-1, info.shape[0])
            data = np.asarray(info.data).reshape(ours.shape[0], -1)  # one row of bytes per row
            gtype = gguf.GGMLQuantizationType(int(info.type))
            step = max(1, CHUNK // info.shape[0])  # compare in chunks of rows to save memory
            for r0 in range(0, ours.shape[0], step):
                rows = data[r0 : r0 + step]
                part = ours[r0 : r0 + step]
                what = f"{info.name} rows {r0}+"
                assert_same_bits(part, fmt.dequantize_numpy(rows.view(np.uint8), part.size), what)
                assert_same_bits(part, gq.dequantize(rows, gtype), what)
            seen[info.type.name] = seen.get(info.type.name, 0) + 1
    expected = {"smollm2_path": {"F32", "Q4_1", "Q8_0"}, "gemma3_path": {"F32", "Q8_0", "Q5_0",
                "Q4_K", "Q6_K"}}[model]  # fmt: skip
    assert set(seen) == expected


def _real_weights(path: Path, rows: int) -> np.ndarray:
    """The first ``rows`` rows of the model's largest 2-D tensor, dequantized."""
    with GGUFReader(path) as r:
        info = max((t for t in r.tensors if len(t.shape) == 2), key=lambda t: t.n_elements)
        row_bytes = info.nbytes // info.shape[1]
        return Q.dequantize(info.raw[: rows * row_bytes], info.type, (rows, info.shape[0]))


@pytest.mark.parametrize("model", MODELS)
def test_quantize_real_weights_equals_gguf_py(model: str, request) -> None:
    x = _real_weights(request.getfixturevalue(model), 512)
    for name in ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "BF16"]:
        expected = gq.quantize(x, gguf.GGMLQuantizationType[name]).view(np.uint8)
        assert np.array_equal(Q.quantize(x, name), expected), name


@pytest.mark.parametrize("model", MODELS)
def test_quantize_real_weights_twins_agree(model: str, request) -> None:
    x = _real_weights(request.getfixturevalue(model), 32)[:, :512]  # K-quants: 256 | row
    im = np.mean(x * x, axis=0) + np.float32(1e-3)  # an imatrix-like column weighting
    for name in ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ4_NL", "IQ4_XS", "Q4_1"]:
        fmt = Q.get(name)
        assert np.array_equal(fmt.quantize(x), fmt.quantize_numpy(x)), name
        assert np.array_equal(fmt.quantize(x, im), fmt.quantize_numpy(x, im)), name
