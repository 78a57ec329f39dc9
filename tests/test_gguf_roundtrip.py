"""Property tests: random metadata and tensors survive GGUFWriter -> GGUFReader unchanged,
rewriting what was read is byte-identical, and files interoperate with llama.cpp's gguf-py.
"""

from __future__ import annotations

import logging
import math
import os
import struct
import tempfile
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llamacpy.errors import GGUFError
from llamacpy.gguf import GGMLType, GGUFReader, GGUFValueType, GGUFWriter, copy_to_writer
from llamacpy.gguf.constants import GGML_BLOCK_SIZES, INTEGER_RANGES, SCALAR_DTYPES

VT = GGUFValueType
SCALAR_TYPES = list(SCALAR_DTYPES)
STRUCT_FORMATS = {
    VT.UINT8: "<B", VT.INT8: "<b", VT.UINT16: "<H", VT.INT16: "<h", VT.UINT32: "<I",
    VT.INT32: "<i", VT.FLOAT32: "<f", VT.BOOL: "<?", VT.UINT64: "<Q", VT.INT64: "<q",
    VT.FLOAT64: "<d",
}  # fmt: skip
NP_DTYPES = {t: np.dtype(bool) if t == VT.BOOL else SCALAR_DTYPES[t] for t in SCALAR_TYPES}
TENSOR_TYPES = [GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q4_0, GGMLType.Q8_0,
                GGMLType.Q4_K, GGMLType.I32]  # fmt: skip
SETTINGS = settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,  # `workdir` is meant to be shared by examples
    ],
)
logging.getLogger("gguf").setLevel(logging.WARNING)


# ----------------------------------------------------------------------------- strategies
def scalar(t: GGUFValueType) -> st.SearchStrategy:
    if t in INTEGER_RANGES:
        lo, hi = INTEGER_RANGES[t]
        return st.integers(lo, hi)
    if t == VT.BOOL:
        return st.booleans()
    return st.floats(width=32 if t == VT.FLOAT32 else 64)  # NaN and inf included


# Valid Unicode, and invalid UTF-8 as the reader decodes it (lone surrogates, surrogateescape).
valid_text = st.text(max_size=12)
any_text = valid_text | st.binary(max_size=12).map(lambda b: b.decode("utf-8", "surrogateescape"))


# A value spec: (vtype, value given to the writer, elem_type). Nested arrays are lists of
# inner arrays whose element type the writer infers: numpy arrays (their dtype), non-empty
# lists of strings, non-empty lists of arrays.
@st.composite
def inner_array(draw, depth: int, text: st.SearchStrategy, homogeneous: GGUFValueType | None):
    kinds = [*SCALAR_TYPES, VT.STRING] + ([VT.ARRAY] if depth < 3 else [])
    etype = homogeneous if homogeneous is not None else draw(st.sampled_from(kinds))
    if etype == VT.STRING:
        return draw(st.lists(text, min_size=1, max_size=4))
    if etype == VT.ARRAY:
        sub = draw(st.sampled_from([*SCALAR_TYPES, VT.STRING]))
        return draw(st.lists(inner_array(depth + 1, text, sub), min_size=1, max_size=3))
    return np.array(draw(st.lists(scalar(etype), max_size=5)), dtype=NP_DTYPES[etype])


@st.composite
def value_spec(draw, text: st.SearchStrategy = any_text, interop: bool = False, min_size: int = 0):
    # draw the kind first so that strings, string arrays and nested arrays are common
    kind = draw(st.sampled_from(["scalar", "string", "array", "strings", "nested"]))
    if kind == "string":
        return VT.STRING, draw(text), None
    if kind == "scalar":
        vtype = draw(st.sampled_from(SCALAR_TYPES))
        return vtype, draw(scalar(vtype)), None
    vtype = VT.ARRAY
    etype = {"strings": VT.STRING, "nested": VT.ARRAY}.get(kind) or draw(
        st.sampled_from(SCALAR_TYPES)
    )
    if etype == VT.STRING:
        return vtype, draw(st.lists(text, min_size=min_size, max_size=5)), etype
    if etype == VT.ARRAY:
        # gguf-py records the element types of the first inner array only: keep them alike
        inner_type = draw(st.sampled_from([*SCALAR_TYPES, VT.STRING])) if interop else None
        items = st.lists(inner_array(1, text, inner_type), min_size=min_size, max_size=3)
        if interop:  # and it cannot hold empty inner arrays
            items = items.filter(lambda v: all(len(x) for x in v))
        return vtype, draw(items), etype
    values = draw(st.lists(scalar(etype), min_size=min_size, max_size=8))
    return vtype, np.array(values, dtype=NP_DTYPES[etype]), etype


keys = st.text(min_size=1, max_size=20).filter(lambda k: k != "general.alignment")
metadata = st.dictionaries(keys, value_spec(), max_size=8)
# gguf-py adds general.architecture itself and lists pseudo-keys GGUF.version etc.
gguf_py_keys = keys.filter(lambda k: k != "general.architecture" and not k.startswith("GGUF."))
interop_metadata = st.dictionaries(gguf_py_keys, value_spec(valid_text, interop=True), max_size=8)


@st.composite
def tensor_specs(draw, types=TENSOR_TYPES):
    """[(name, type, ggml shape, data seed)]; names are unique, 1..63 bytes."""
    names = draw(
        st.lists(
            st.text(min_size=1, max_size=16).filter(lambda n: len(n.encode()) < 64),
            unique=True,
            max_size=5,
        )
    )
    out = []
    for name in names:
        gtype = draw(st.sampled_from(types))
        block = GGML_BLOCK_SIZES[gtype][0]
        ne0 = block * draw(st.integers(1, 2 if block == 256 else 4))
        rest = draw(st.lists(st.integers(1, 3), max_size=3))
        out.append((name, gtype, (ne0, *rest), draw(st.integers(0, 2**32 - 1))))
    return out


def tensor_bytes(gtype: GGMLType, shape: tuple[int, ...], seed: int) -> bytes:
    block, block_bytes = GGML_BLOCK_SIZES[gtype]
    n = math.prod(shape) // block * block_bytes
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


# ----------------------------------------------------------------------------- comparison
def _inner_type(value: Any) -> GGUFValueType:
    """The element type the writer gives an inner array (as this test generates them)."""
    if isinstance(value, np.ndarray):
        return next(t for t, d in NP_DTYPES.items() if d == value.dtype)
    return VT.ARRAY if isinstance(value[0], list | np.ndarray) else VT.STRING


def same_value(vtype: GGUFValueType, elem_type: GGUFValueType | None, want: Any, got: Any) -> None:
    if vtype == VT.STRING:
        assert type(got) is str and got == want
    elif vtype != VT.ARRAY:
        py_type = bool if vtype == VT.BOOL else int if vtype in INTEGER_RANGES else float
        assert type(got) is py_type
        fmt = STRUCT_FORMATS[vtype]
        assert struct.pack(fmt, got) == struct.pack(fmt, want)  # bit-exact, NaN included
    elif elem_type == VT.STRING:
        assert isinstance(got, list) and got == list(want)
        assert all(type(s) is str for s in got)
    elif elem_type == VT.ARRAY:
        assert isinstance(got, list) and len(got) == len(want)
        for w, g in zip(want, got):
            same_value(VT.ARRAY, _inner_type(w), w, g)
    else:
        assert isinstance(got, np.ndarray) and got.dtype == NP_DTYPES[elem_type]
        assert got.tobytes() == np.asarray(want, dtype=NP_DTYPES[elem_type]).tobytes()


def write_ours(path: Path, meta: dict, tensors: list, version: int = 3) -> dict[str, bytes]:
    w = GGUFWriter(path, version=version)
    for key, (vtype, value, elem_type) in meta.items():
        w.add(key, value, type=vtype, elem_type=elem_type)
    data = {}
    for name, gtype, shape, seed in tensors:
        data[name] = tensor_bytes(gtype, shape, seed)
        w.add_tensor(name, gtype, shape, data[name])
    w.write()
    return data


def check_ours(r: GGUFReader, meta: dict, tensors: list, data: dict[str, bytes]) -> None:
    assert list(r.fields) == list(meta)
    for key, (vtype, value, elem_type) in meta.items():
        f = r.fields[key]
        assert (f.type, f.elem_type) == (vtype, elem_type), key
        same_value(vtype, elem_type, value, f.value)
    assert [t.name for t in r.tensors] == [name for name, *_ in tensors]
    for t, (_name, gtype, shape, _) in zip(r.tensors, tensors):
        assert t.type == gtype and t.shape == shape
        assert t.raw.tobytes() == data[t.name]
        assert t.data_offset % r.alignment == 0


@pytest.fixture
def workdir():
    # hypothesis runs many examples per test function: one function-scoped dir, files reused
    with tempfile.TemporaryDirectory(prefix="gguf-rt-") as d:
        yield Path(d)


# ----------------------------------------------------------------------------- properties
@SETTINGS
@given(meta=metadata, tensors=tensor_specs(), version=st.sampled_from([2, 3]))
def test_roundtrip_and_byte_identical_rewrite(workdir, meta, tensors, version):
    path, copy = workdir / "a.gguf", workdir / "b.gguf"
    data = write_ours(path, meta, tensors, version)
    with GGUFReader(path) as r:
        assert r.version == version
        check_ours(r, meta, tensors, data)
        copy_to_writer(r, GGUFWriter(copy, version=r.version)).write()
    assert copy.read_bytes() == path.read_bytes()
    with GGUFReader(path, use_mmap=False) as r:
        check_ours(r, meta, tensors, data)


@SETTINGS
@given(meta=metadata, align=st.sampled_from([1, 2, 8, 64, 256]), tensors=tensor_specs())
def test_roundtrip_with_custom_alignment(workdir, meta, align, tensors):
    meta = {"general.alignment": (VT.UINT32, align, None), **meta}
    path, copy = workdir / "a.gguf", workdir / "b.gguf"
    data = write_ours(path, meta, tensors)
    with GGUFReader(path) as r:
        assert r.alignment == align and r.data_offset % align == 0
        check_ours(r, meta, tensors, data)
        copy_to_writer(r, GGUFWriter(copy)).write()
    assert copy.read_bytes() == path.read_bytes()


def _gguf_py_elem_type(field: Any) -> GGUFValueType:
    return VT(int(field.parts[3][0]))  # parts: key length, key, type, element type, count, ...


def _flatten(value: Any) -> list:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, list) and value and not isinstance(value[0], str):
        return [x for v in value for x in _flatten(v)]
    return list(value)


def _leaf_type(value: Any) -> GGUFValueType:
    while isinstance(value, list) and not isinstance(value[0], str):
        value = value[0]
    return _inner_type(value)


def _same_leaf(etype: GGUFValueType, want: Any, got: Any) -> bool:
    if etype in (VT.FLOAT32, VT.FLOAT64):
        fmt = STRUCT_FORMATS[etype]
        return struct.pack(fmt, got) == struct.pack(fmt, want)
    return got == want and type(got) is type(want)


@SETTINGS
@given(meta=interop_metadata, tensors=tensor_specs())
def test_files_we_write_are_read_by_gguf_py(workdir, meta, tensors):
    path = workdir / "ours.gguf"
    data = write_ours(path, meta, tensors)
    r = gguf.GGUFReader(path)
    fields = {k: f for k, f in r.fields.items() if not k.startswith("GGUF.")}
    assert list(fields) == list(meta)
    for key, (vtype, value, elem_type) in meta.items():
        f = fields[key]
        assert f.types[0] == vtype, key
        if vtype != VT.ARRAY:
            same_value(vtype, None, value, f.contents())
            continue
        assert _gguf_py_elem_type(f) == elem_type
        if len(value) == 0:
            assert f.contents() == []
        elif elem_type == VT.ARRAY:  # gguf-py flattens nested arrays
            assert f.types[1:-1] == [VT.ARRAY] * (len(f.types) - 2)
            leaf = _leaf_type(value)
            assert f.types[-1] == leaf
            want, got = _flatten(value), f.contents()
            assert len(got) == len(want)
            assert all(_same_leaf(leaf, w, g) for w, g in zip(want, got))
        elif elem_type == VT.STRING:
            assert f.contents() == value
        else:
            got = f.contents()
            assert all(_same_leaf(elem_type, w, g) for w, g in zip(value.tolist(), got))
            assert len(got) == len(value)
    assert [t.name for t in r.tensors] == [name for name, *_ in tensors]
    for t, (name, gtype, shape, _) in zip(r.tensors, tensors):
        assert t.tensor_type == gtype and tuple(int(d) for d in t.shape) == shape
        assert int(t.n_bytes) == len(data[name]) and t.data.tobytes() == data[name]


def _gguf_py_nested(value: Any) -> Any:
    """Nested arrays for gguf-py: it infers inner types from Python values (int32, f32, ...)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    return [_gguf_py_nested(v) if isinstance(v, list | np.ndarray) else v for v in value]


# inner arrays gguf-py can express: it types Python ints as INT32 and floats as FLOAT32
gguf_py_inner = st.one_of(
    st.lists(st.integers(-(2**31), 2**31 - 1), min_size=1, max_size=4).map(
        lambda v: np.array(v, np.int32)
    ),
    st.lists(st.floats(width=32), min_size=1, max_size=4).map(lambda v: np.array(v, np.float32)),
    st.lists(st.booleans(), min_size=1, max_size=4).map(lambda v: np.array(v, bool)),
    st.lists(valid_text, min_size=1, max_size=4),
)


@st.composite
def gguf_py_metadata(draw):
    # gguf-py's writer refuses empty arrays
    specs = draw(
        st.dictionaries(gguf_py_keys, value_spec(valid_text, interop=True, min_size=1), max_size=8)
    )
    for key in list(specs):
        vtype, _, etype = specs[key]
        if etype == VT.ARRAY:  # replace by nested arrays gguf-py can write
            inner = draw(st.lists(gguf_py_inner, min_size=1, max_size=3))
            specs[key] = (vtype, inner, etype)
    return specs


@SETTINGS
@given(meta=gguf_py_metadata(), tensors=tensor_specs())
def test_files_gguf_py_writes_are_read_by_us(workdir, meta, tensors):
    path = workdir / "theirs.gguf"
    w = gguf.GGUFWriter(path, arch="testarch")
    for key, (vtype, value, elem_type) in meta.items():
        if elem_type == VT.ARRAY:
            w.add_key_value(key, _gguf_py_nested(value), vtype)
        elif vtype == VT.ARRAY:
            items = value.tolist() if isinstance(value, np.ndarray) else value
            w.add_key_value(key, items, vtype, sub_type=elem_type)
        else:
            w.add_key_value(key, value, vtype)
    data = {}
    for name, gtype, shape, seed in tensors:
        data[name] = raw = tensor_bytes(gtype, shape, seed)
        np_shape = shape[::-1]
        if gtype in (GGMLType.F32, GGMLType.F16, GGMLType.I32):
            dtype = {GGMLType.F32: np.float32, GGMLType.F16: np.float16, GGMLType.I32: np.int32}
            w.add_tensor(name, np.frombuffer(raw, dtype[gtype]).reshape(np_shape))
        elif gtype == GGMLType.BF16:
            arr = np.frombuffer(raw, np.uint16).reshape(np_shape)
            w.add_tensor(name, arr, raw_dtype=gguf.GGMLQuantizationType.BF16)
        else:
            block, block_bytes = GGML_BLOCK_SIZES[gtype]
            byte_shape = (*np_shape[:-1], np_shape[-1] // block * block_bytes)
            arr = np.frombuffer(raw, np.uint8).reshape(byte_shape)
            w.add_tensor(name, arr, raw_dtype=gguf.GGMLQuantizationType(int(gtype)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    with GGUFReader(path) as r:
        assert list(r.fields) == ["general.architecture", *meta]
        assert r.metadata["general.architecture"] == "testarch"
        for key, (vtype, value, elem_type) in meta.items():
            f = r.fields[key]
            assert (f.type, f.elem_type) == (vtype, elem_type), key
            if elem_type == VT.ARRAY:
                assert len(f.value) == len(value)
                for want, got in zip(value, f.value):
                    same_value(VT.ARRAY, _inner_type(want), want, got)
            else:
                same_value(vtype, elem_type, value, f.value)
        assert [t.name for t in r.tensors] == [name for name, *_ in tensors]
        for t, (name, gtype, shape, _) in zip(r.tensors, tensors):
            assert t.type == gtype and t.shape == shape and t.raw.tobytes() == data[name]


# ----------------------------------------------------------------------------- atomicity
def _failing_writer(path: Path, fail_at: int, error: BaseException) -> GGUFWriter:
    w = GGUFWriter(path)
    w.add("general.name", "atomic")
    for i in range(4):

        def source(i=i):
            if i == fail_at:
                raise error
            return np.full(64, i, np.float32)

        w.add_tensor(f"t{i}", GGMLType.F32, (64,), source)
    return w


@pytest.mark.parametrize("fail_at", [0, 2, 3])
def test_failed_write_leaves_nothing(tmp_path, fail_at):
    path = tmp_path / "out.gguf"
    with pytest.raises(RuntimeError, match="boom"):
        _failing_writer(path, fail_at, RuntimeError("boom")).write()
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("error", [RuntimeError("boom"), KeyboardInterrupt()])
def test_failed_write_keeps_existing_file(tmp_path, error):
    path = tmp_path / "out.gguf"
    old = b"previous contents, not a GGUF file"
    path.write_bytes(old)
    before = os.stat(path)
    with pytest.raises(type(error)):
        _failing_writer(path, 2, error).write()
    assert path.read_bytes() == old and os.stat(path).st_ino == before.st_ino
    assert os.listdir(tmp_path) == ["out.gguf"]
    # the same writer without the failure replaces it completely
    _failing_writer(path, -1, RuntimeError()).write()
    with GGUFReader(path) as r:
        assert [t.data[0] for t in r.tensors] == [0, 1, 2, 3]


def test_wrong_tensor_size_midway_leaves_nothing(tmp_path):
    path = tmp_path / "out.gguf"
    w = GGUFWriter(path)
    w.add_tensor("ok", GGMLType.F32, (8,), np.zeros(8, np.float32))
    w.add_tensor("short", GGMLType.F32, (8,), lambda: np.zeros(7, np.float32))
    with pytest.raises(GGUFError, match="'short'"):
        w.write()
    assert os.listdir(tmp_path) == []
