"""The reader and writer on both real models, cross-checked with the `gguf` package."""

from __future__ import annotations

import hashlib
from pathlib import Path

import gguf
import numpy as np
import pytest

from llamacpy.gguf import GGUFReader, GGUFWriter, copy_to_writer

pytestmark = pytest.mark.real_model


def _sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while b := f.read(1 << 20):
            h.update(b)
    return h.hexdigest()


@pytest.mark.parametrize("model", ["smollm2_path", "gemma3_path"])
def test_read_write_back_is_byte_identical(model: str, request, tmp_path: Path) -> None:
    src: Path = request.getfixturevalue(model)
    out = tmp_path / "copy.gguf"
    with GGUFReader(src) as r:
        copy_to_writer(r, GGUFWriter(out)).write()
    assert out.stat().st_size == src.stat().st_size
    assert _sha(out) == _sha(src)


@pytest.mark.parametrize("model", ["smollm2_path", "gemma3_path"])
def test_agrees_with_gguf_package(model: str, request) -> None:
    src: Path = request.getfixturevalue(model)
    ref = gguf.GGUFReader(src)
    with GGUFReader(src) as r:
        ref_fields = {k: f for k, f in ref.fields.items() if not k.startswith("GGUF.")}
        assert list(ref_fields) == list(r.fields)
        for key, f in ref_fields.items():
            ours = r.fields[key]
            assert int(f.types[0]) == int(ours.type), key
            expected = f.contents()
            if isinstance(ours.value, np.ndarray):
                np.testing.assert_array_equal(ours.value, np.asarray(expected), err_msg=key)
            else:
                assert ours.value == expected, key
        assert [t.name for t in r.tensors] == [t.name for t in ref.tensors]
        for ours, theirs in zip(r.tensors, ref.tensors):
            assert int(ours.type) == int(theirs.tensor_type)
            assert list(ours.shape) == [int(d) for d in theirs.shape]
            assert ours.data_offset == theirs.data_offset
            assert ours.nbytes == theirs.n_bytes
            assert np.shares_memory(ours.raw, ours.raw)  # a view, not a copy
            np.testing.assert_array_equal(
                ours.raw, np.asarray(theirs.data).reshape(-1).view(np.uint8)
            )


def test_open_copies_no_weights(smollm2_path: Path) -> None:
    with GGUFReader(smollm2_path) as r:
        t = r.tensor("blk.0.ffn_down.weight")
        base = t.data
        while isinstance(base, np.ndarray) and base.base is not None:
            base = base.base
        assert not isinstance(base, np.ndarray)  # bottom of the view chain is the mapping
        assert t.data.shape == (576, 1536 // 32 * 20)
