"""The GGUF reader is strict: every malformed file raises GGUFError with a precise message.

Corrupted files are built byte by byte with the helpers below (independently of our writer),
so the expected byte offsets are computed from the bytes we lay out, not taken from the reader.
Positive tests check the values, types, alignment and zero-copy views of valid files.
"""

from __future__ import annotations

import math
import struct
from pathlib import Path

import numpy as np
import pytest

from llamacpy.errors import GGUFError
from llamacpy.gguf import GGMLType, GGUFReader, GGUFValueType, GGUFWriter
from llamacpy.gguf.constants import GGML_BLOCK_SIZES

VT = GGUFValueType
HEADER = 24  # magic, version, n_tensors, n_kv


# ----------------------------------------------------------------------------- raw builders
def gstr(s: str | bytes) -> bytes:
    raw = s.encode("utf-8") if isinstance(s, str) else s
    return struct.pack("<Q", len(raw)) + raw


def header(n_tensors: int, n_kv: int, version: int = 3, magic: bytes = b"GGUF") -> bytes:
    return magic + struct.pack("<IQQ", version, n_tensors, n_kv)


def kv(key: str | bytes, vtype: int, payload: bytes) -> bytes:
    return gstr(key) + struct.pack("<I", vtype) + payload


def kv_u32(key: str, value: int) -> bytes:
    return kv(key, VT.UINT32, struct.pack("<I", value))


def arr(etype: int, count: int, payload: bytes = b"") -> bytes:
    """An array value (without its type tag): element type, count, elements."""
    return struct.pack("<IQ", etype, count) + payload


def tinfo(name: str | bytes, dims: list[int], gtype: int, offset: int) -> bytes:
    return (
        gstr(name)
        + struct.pack("<I", len(dims))
        + b"".join(struct.pack("<q" if d < 0 else "<Q", d) for d in dims)
        + struct.pack("<IQ", gtype, offset)
    )


def pad(b: bytes, align: int = 32) -> bytes:
    return b + b"\0" * (-len(b) % align)


def gguf(kvs: list[bytes] = (), tis: list[bytes] = (), data: bytes = b"", align: int = 32) -> bytes:
    body = header(len(tis), len(kvs)) + b"".join(kvs) + b"".join(tis)
    return (pad(body, align) if tis else body) + data


def expect_error(tmp_path: Path, data: bytes, *fragments: str, offset: int | None = None) -> str:
    """Open ``data`` as a file; it must fail with GGUFError containing every fragment."""
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    for use_mmap in (True, False):
        with pytest.raises(GGUFError) as info:
            GGUFReader(path, use_mmap=use_mmap)
        msg = str(info.value)
        assert str(path) in msg
        for frag in fragments:
            assert frag in msg, f"{frag!r} not in {msg!r}"
        if offset is not None:
            assert f"byte offset {offset})" in msg, f"offset {offset} not in {msg!r}"
            assert info.value.offset == offset
    return msg


def load(tmp_path: Path, data: bytes, **kw) -> GGUFReader:
    path = tmp_path / "good.gguf"
    path.write_bytes(data)
    return GGUFReader(path, **kw)


# ----------------------------------------------------------------------------- magic / version
@pytest.mark.parametrize("magic", [b"XXXX", b"GGUG", b"\0\0\0\0", b"PK\x03\x04"])
def test_wrong_magic(tmp_path, magic):
    msg = expect_error(tmp_path, header(0, 0, magic=magic), "not a GGUF file", offset=0)
    assert repr(magic) in msg


@pytest.mark.parametrize(
    ("magic", "name"),
    [(b"lmgg", "GGML"), (b"fmgg", "GGMF"), (b"tjgg", "GGJT"), (b"algg", "GGLA")],
)
def test_legacy_ggml_files(tmp_path, magic, name):
    # what llama.cpp's old .bin files start with: the u32 magic 'ggjt' etc. stored little-endian
    assert struct.pack("<I", int.from_bytes(name.lower().encode(), "big")) == magic
    data = magic + struct.pack("<I", 3) + b"\0" * 64
    expect_error(tmp_path, data, f"legacy {name} model file", "convert", offset=0)


@pytest.mark.parametrize("version", [0, 1, 4, 2**31])
def test_unsupported_version(tmp_path, version):
    msg = expect_error(tmp_path, header(0, 0, version=version), f"version {version}", offset=4)
    if version == 1:
        assert "obsolete" in msg
    else:
        assert "unsupported" in msg and "2, 3" in msg


@pytest.mark.parametrize("version", [2, 3])
def test_big_endian_file(tmp_path, version):
    data = b"GGUF" + struct.pack(">IQQ", version, 0, 1) + b"\0" * 7 + b"\3abc" + b"\0" * 5
    msg = expect_error(tmp_path, data, "big-endian", offset=4)
    assert "little-endian" in msg


# ----------------------------------------------------------------------------- truncation
@pytest.mark.parametrize(
    ("size", "where", "offset"),
    [(2, "magic", 0), (4, "version", 4), (7, "version", 4), (8, "tensor count", 8),
     (15, "tensor count", 8), (16, "key/value count", 16), (23, "key/value count", 16)],
)  # fmt: skip
def test_truncated_header(tmp_path, size, where, offset):
    data = gguf([kv_u32("a", 1)])[:size]
    msg = expect_error(tmp_path, data, "truncated", where, offset=offset)
    assert f"only {size - offset} remain" in msg


def test_truncated_inside_kv_section(tmp_path):
    k0 = kv("first.key", VT.STRING, gstr("x" * 40))  # long enough for the n_kv size check
    k1 = kv("second.key", VT.STRING, gstr("a string value"))
    k2 = kv("third.key", VT.UINT64, struct.pack("<Q", 5))
    full = gguf([k0, k1, k2])
    p1 = HEADER + len(k0)  # start of second.key
    p2 = p1 + len(k1)  # start of third.key
    value1 = p1 + len(gstr("second.key")) + 4  # its string length field
    # cut inside a key's length field: named by entry number
    expect_error(tmp_path, full[: p1 + 3], "truncated", "key of metadata entry 1", offset=p1)
    # cut inside a key's bytes
    expect_error(
        tmp_path, full[: p1 + 10], "key of metadata entry 1", "declares length 10", offset=p1
    )
    # cut inside the value type
    expect_error(tmp_path, full[: value1 - 2], "truncated", "value type", "'second.key'",
                 offset=value1 - 4)  # fmt: skip
    # cut inside a string value
    expect_error(tmp_path, full[: value1 + 12], "string value declares length 14",
                 "only 4 bytes remain", "'second.key'", offset=value1)  # fmt: skip
    # cut inside a scalar value
    value2 = p2 + len(gstr("third.key")) + 4
    expect_error(tmp_path, full[: value2 + 5], "truncated", "UINT64 value", "'third.key'",
                 offset=value2)  # fmt: skip


def test_truncated_inside_string_array(tmp_path):
    payload = arr(VT.STRING, 3, gstr("one") + gstr("two") + gstr("three"))
    full = gguf([kv("tok", VT.ARRAY, payload)])
    elems = HEADER + len(gstr("tok")) + 4 + 12
    third = elems + len(gstr("one")) + len(gstr("two"))
    expect_error(
        tmp_path, full[: third + 4], "truncated inside string 2 of 3", "'tok'", offset=third
    )
    expect_error(tmp_path, full[: third + 9], "string 2 of the array declares length 5",
                 "'tok'", offset=third)  # fmt: skip


def test_truncated_inside_tensor_info(tmp_path):
    kvs = [kv_u32("a", 1), kv_u32("b", 2)]
    t0 = tinfo("t0", [4], GGMLType.F32, 0)
    t1 = tinfo("second", [4, 2], GGMLType.F32, 32)
    full = gguf(kvs, [t0, t1], b"\0" * 64)
    start = HEADER + sum(map(len, kvs)) + len(t0)
    dims = start + len(gstr("second")) + 4
    expect_error(tmp_path, full[: dims + 12], "truncated", "dimensions", "'second'", offset=dims)
    expect_error(tmp_path, full[: dims + 16 + 2], "truncated", "tensor type", "'second'",
                 offset=dims + 16)  # fmt: skip
    expect_error(tmp_path, full[: dims + 20 + 7], "truncated", "data offset", "'second'",
                 offset=dims + 20)  # fmt: skip
    expect_error(tmp_path, full[: start + 5], "truncated", "name of tensor 1", offset=start)


# ----------------------------------------------------------------------------- counts, lengths
@pytest.mark.parametrize("n_kv", [2, 1000, 2**32, 2**63, 2**64 - 1])
def test_kv_count_larger_than_file(tmp_path, n_kv):
    # n_kv entries need at least 13 bytes each; the file has one 13-byte entry
    data = header(0, n_kv) + kv("k", VT.UINT8, b"\1")
    assert len(data) - HEADER == 14 < n_kv * 13
    expect_error(tmp_path, data, f"metadata count {n_kv}", "cannot fit", "14 bytes", offset=16)


@pytest.mark.parametrize("n_tensors", [1000, 2**32 - 1, 2**64 - 1])
def test_tensor_count_larger_than_file(tmp_path, n_tensors):
    data = header(n_tensors, 0) + tinfo("t", [1], GGMLType.F32, 0)
    expect_error(tmp_path, data, f"tensor count {n_tensors}", "cannot fit", offset=8)


def test_tensor_count_larger_than_tensor_infos(tmp_path):
    # a count that passes the cheap size check, but the infos run out
    t = tinfo("t", [8], GGMLType.F32, 0)
    data = header(2, 0) + t + b"\xff" * 40
    expect_error(tmp_path, data, "name of tensor 1", offset=HEADER + len(t))


@pytest.mark.parametrize("length", [100, 2**32, 2**63, 2**64 - 1])
def test_string_length_larger_than_file(tmp_path, length):
    k0 = kv_u32("ok", 1)
    bad = gstr("name") + struct.pack("<I", VT.STRING) + struct.pack("<Q", length) + b"abc"
    value = HEADER + len(k0) + len(gstr("name")) + 4
    expect_error(tmp_path, gguf([k0, bad]), f"declares length {length}", "only 3 bytes remain",
                 "key 'name'", offset=value)  # fmt: skip
    # the same for a key
    data = header(0, 1) + struct.pack("<Q", length) + b"key" + struct.pack("<I", 0) + b"\0"
    expect_error(tmp_path, data, "key of metadata entry 0", f"declares length {length}",
                 offset=HEADER)  # fmt: skip
    # and a tensor name
    data = pad(header(1, 0) + struct.pack("<Q", length) + b"t" * 40)
    expect_error(tmp_path, data, "name of tensor 0", f"declares length {length}", offset=HEADER)


@pytest.mark.parametrize(
    ("etype", "count"),
    [(VT.UINT8, 10**6), (VT.FLOAT64, 2**61), (VT.INT32, 2**64 - 1), (VT.STRING, 2**40),
     (VT.ARRAY, 2**33), (VT.BOOL, 17)],
)  # fmt: skip
def test_array_length_larger_than_file(tmp_path, etype, count):
    k = kv("arr", VT.ARRAY, arr(etype, count, b"\0" * 16))
    count_at = HEADER + len(gstr("arr")) + 4 + 4
    msg = expect_error(tmp_path, gguf([k]), f"array of {count} {etype.name} elements",
                       "only 16 remain", "key 'arr'", offset=count_at)  # fmt: skip
    assert "needs at least" in msg


def test_nested_array_length_larger_than_file(tmp_path):
    inner = arr(VT.INT16, 2**40, b"\0" * 8)
    k = kv("nest", VT.ARRAY, arr(VT.ARRAY, 1, inner))
    count_at = HEADER + len(gstr("nest")) + 4 + 12 + 4
    expect_error(tmp_path, gguf([k]), f"array of {2**40} INT16", "'nest'", offset=count_at)


# ----------------------------------------------------------------------------- types
@pytest.mark.parametrize("vtype", [13, 255, 2**32 - 1])
def test_unknown_value_type(tmp_path, vtype):
    k0 = kv_u32("a", 1)
    k1 = kv("bad.type", vtype, b"\0" * 8)
    expect_error(tmp_path, gguf([k0, k1]), f"unknown value type {vtype}", "key 'bad.type'",
                 offset=HEADER + len(k0) + len(gstr("bad.type")))  # fmt: skip


def test_unknown_array_element_type(tmp_path):
    k = kv("bad.elem", VT.ARRAY, arr(42, 1, b"\0" * 8))
    expect_error(tmp_path, gguf([k]), "unknown value type 42", "key 'bad.elem'",
                 offset=HEADER + len(gstr("bad.elem")) + 4)  # fmt: skip


@pytest.mark.parametrize("gtype", [4, 5, 31, 36, 43, 1000, 2**32 - 1])
def test_unknown_ggml_type(tmp_path, gtype):
    t = tinfo("weird", [32, 2], gtype, 0)
    type_at = HEADER + len(gstr("weird")) + 4 + 16
    expect_error(tmp_path, gguf([], [t], b"\0" * 512), f"unknown ggml type {gtype}",
                 "tensor 'weird'", offset=type_at)  # fmt: skip


# ----------------------------------------------------------------------------- duplicates, names
def test_duplicate_keys(tmp_path):
    k0 = kv_u32("general.x", 1)
    k1 = kv("other", VT.STRING, gstr("v"))
    k2 = kv("general.x", VT.STRING, gstr("again"))
    expect_error(tmp_path, gguf([k0, k1, k2]), "duplicate metadata key", "key 'general.x'",
                 offset=HEADER + len(k0) + len(k1))  # fmt: skip


def test_duplicate_tensor_names(tmp_path):
    t0 = tinfo("blk.0.w", [8], GGMLType.F32, 0)
    t1 = tinfo("other", [8], GGMLType.F32, 32)
    t2 = tinfo("blk.0.w", [8], GGMLType.F32, 64)
    expect_error(tmp_path, gguf([], [t0, t1, t2], b"\0" * 96), "duplicate tensor name",
                 "tensor 'blk.0.w'", offset=HEADER + len(t0) + len(t1))  # fmt: skip


def test_empty_key(tmp_path):
    k0 = kv_u32("a", 1)
    expect_error(tmp_path, gguf([k0, kv("", VT.UINT8, b"\0")]), "metadata entry 1 has an empty key",
                 offset=HEADER + len(k0))  # fmt: skip


def test_empty_tensor_name(tmp_path):
    expect_error(tmp_path, gguf([], [tinfo("", [4], GGMLType.F32, 0)], b"\0" * 32),
                 "tensor 0 has an empty name", offset=HEADER)  # fmt: skip


@pytest.mark.parametrize("name", ["x" * 64, "y" * 100, "é" * 32, "日" * 22])
def test_tensor_name_too_long(tmp_path, name):
    nbytes = len(name.encode())
    assert nbytes >= 64
    k0 = kv_u32("a", 1)
    t = tinfo(name, [4], GGMLType.F32, 0)
    expect_error(tmp_path, gguf([k0], [t], b"\0" * 32), "tensor name is too long",
                 f"({nbytes} bytes", "under 64", offset=HEADER + len(k0))  # fmt: skip


@pytest.mark.parametrize("name", ["x" * 63, "é" * 31 + "x"])
def test_tensor_name_of_63_bytes_loads(tmp_path, name):
    with load(tmp_path, gguf([], [tinfo(name, [4], GGMLType.F32, 0)], b"\0" * 16)) as r:
        assert r.tensors[0].name == name


# ----------------------------------------------------------------------------- dims, shapes
@pytest.mark.parametrize("n_dims", [0, 5, 2**32 - 1])
def test_bad_dimension_count(tmp_path, n_dims):
    t = gstr("t") + struct.pack("<I", n_dims) + struct.pack("<5Q", 1, 1, 1, 1, 1)
    t += struct.pack("<IQ", 0, 0)
    expect_error(tmp_path, gguf([], [t], b"\0" * 32), f"has {n_dims} dimensions", "1..4",
                 "tensor 't'", offset=HEADER + len(gstr("t")))  # fmt: skip


@pytest.mark.parametrize(
    ("dims", "bad"), [([0], 0), ([4, 0], 1), ([4, 2, -1], 2), ([-(2**63)], 0), ([2**64 - 1, 1], 0)]
)
def test_zero_or_negative_dims(tmp_path, dims, bad):
    t = tinfo("t", dims, GGMLType.F32, 0)
    value = dims[bad] if dims[bad] < 2**63 else dims[bad] - 2**64  # stored as int64
    dims_at = HEADER + len(gstr("t")) + 4
    expect_error(tmp_path, gguf([], [t], b"\0" * 64), f"dimension {bad} is {value}",
                 "must be positive", "tensor 't'", offset=dims_at + 8 * bad)  # fmt: skip


@pytest.mark.parametrize(
    ("dims", "at"),
    [([2**32, 2**32], 1), ([2**62, 2], 1), ([2**20] * 3 + [2**4], 3), ([2**63 - 1, 2], 1)],
)
def test_element_count_overflow(tmp_path, dims, at):
    assert math.prod(dims[: at + 1]) > 2**63 - 1 >= math.prod(dims[:at])
    t = tinfo("huge", dims, GGMLType.F32, 0)
    dims_at = HEADER + len(gstr("huge")) + 4
    expect_error(tmp_path, gguf([], [t], b"\0" * 64), "overflows int64", "tensor 'huge'",
                 offset=dims_at + 8 * at)  # fmt: skip


def test_tensor_bigger_than_file(tmp_path):
    # a valid element count whose byte size alone exceeds the file
    t = tinfo("big", [2**20, 2**20], GGMLType.F32, 0)
    expect_error(tmp_path, gguf([], [t], b"\0" * 64), "more than the whole file", "tensor 'big'",
                 offset=HEADER)  # fmt: skip


@pytest.mark.parametrize(
    ("gtype", "ne0"), [(GGMLType.Q4_0, 33), (GGMLType.Q8_0, 16), (GGMLType.Q4_K, 128),
                       (GGMLType.Q6_K, 257), (GGMLType.IQ4_NL, 1), (GGMLType.MXFP4, 48)],
)  # fmt: skip
def test_row_not_a_multiple_of_block(tmp_path, gtype, ne0):
    block = GGML_BLOCK_SIZES[gtype][0]
    assert ne0 % block
    t = tinfo("q", [ne0, 2], gtype, 0)
    type_at = HEADER + len(gstr("q")) + 4 + 16
    expect_error(tmp_path, gguf([], [t], b"\0" * 4096), f"row length {ne0}",
                 f"{gtype.name} block size {block}", "tensor 'q'", offset=type_at)  # fmt: skip


# ----------------------------------------------------------------------------- offsets, data
def test_misaligned_tensor_offset(tmp_path):
    t0 = tinfo("a", [8], GGMLType.F32, 0)
    t1 = tinfo("b", [8], GGMLType.F32, 48)
    expect_error(tmp_path, gguf([], [t0, t1], b"\0" * 128), "data offset 48",
                 "not a multiple of the alignment 32", "tensor 'b'",
                 offset=HEADER + len(t0))  # fmt: skip


def test_overlapping_tensor_offsets(tmp_path):
    t0 = tinfo("a", [16], GGMLType.F32, 0)  # 64 bytes: 0..64
    t1 = tinfo("b", [8], GGMLType.F32, 32)
    msg = expect_error(tmp_path, gguf([], [t0, t1], b"\0" * 128), "data offset 32", "overlaps",
                       "tensor 'b'", offset=HEADER + len(t0))  # fmt: skip
    assert "'a'" in msg and "ends at 64" in msg


def test_out_of_order_tensor_offsets(tmp_path):
    t0 = tinfo("a", [8], GGMLType.F32, 64)
    t1 = tinfo("b", [8], GGMLType.F32, 0)
    expect_error(tmp_path, gguf([], [t0, t1], b"\0" * 128), "increasing order", "tensor 'b'",
                 offset=HEADER + len(t0))  # fmt: skip


def test_same_offset_twice(tmp_path):
    t0 = tinfo("a", [8], GGMLType.F32, 0)
    t1 = tinfo("b", [8], GGMLType.F32, 0)
    expect_error(tmp_path, gguf([], [t0, t1], b"\0" * 64), "overlaps", "tensor 'b'",
                 offset=HEADER + len(t0))  # fmt: skip


@pytest.mark.parametrize("missing", [1, 31, 32])
def test_tensor_data_past_end_of_file(tmp_path, missing):
    t0 = tinfo("a", [8], GGMLType.F32, 0)
    t1 = tinfo("b", [8], GGMLType.F32, 32)
    data = gguf([], [t0, t1], b"\1" * (64 - missing))
    start = len(pad(header(2, 0) + t0 + t1)) + 32
    expect_error(tmp_path, data, "runs past the end of the file", f"32 bytes at {start}",
                 "truncated", "tensor 'b'", offset=HEADER + len(t0))  # fmt: skip


def test_tensor_offset_far_past_end(tmp_path):
    t = tinfo("a", [8], GGMLType.F32, 2**63)
    expect_error(tmp_path, gguf([], [t], b"\0" * 32), "runs past the end", "tensor 'a'",
                 offset=HEADER)  # fmt: skip


def test_data_section_starts_past_end(tmp_path):
    body = header(1, 0) + tinfo("a", [1], GGMLType.I8, 0)
    assert len(body) % 32
    expect_error(tmp_path, body + b"\0", "tensor data section starts past the end",
                 offset=len(body))  # fmt: skip


# ----------------------------------------------------------------------------- alignment
@pytest.mark.parametrize("align", [0, 3, 48, 2**32 - 1])
def test_alignment_not_power_of_two(tmp_path, align):
    k0 = kv("general.name", VT.STRING, gstr("m"))
    data = gguf([k0, kv_u32("general.alignment", align)], [tinfo("t", [4], 0, 0)], b"\0" * 16)
    expect_error(tmp_path, data, f"alignment {align} is not a power of two",
                 "key 'general.alignment'", offset=HEADER + len(k0))  # fmt: skip


@pytest.mark.parametrize(
    ("vtype", "payload"),
    [(VT.INT32, struct.pack("<i", 32)), (VT.UINT64, struct.pack("<Q", 32)),
     (VT.UINT16, struct.pack("<H", 32)), (VT.STRING, gstr("32")),
     (VT.ARRAY, arr(VT.UINT32, 1, struct.pack("<I", 32)))],
)  # fmt: skip
def test_alignment_of_wrong_type(tmp_path, vtype, payload):
    data = gguf([kv("general.alignment", vtype, payload)])
    expect_error(tmp_path, data, f"must be of type UINT32, not {vtype.name}",
                 "key 'general.alignment'", offset=HEADER)  # fmt: skip


def test_writer_refuses_bad_alignment(tmp_path):
    for value, vtype in [(48, VT.UINT32), (0, VT.UINT32), (64, VT.INT32)]:
        w = GGUFWriter(tmp_path / "w.gguf")
        w.add("general.alignment", value, type=vtype)
        w.add_tensor("t", GGMLType.F32, (4,), np.zeros(4, np.float32))
        with pytest.raises(GGUFError, match="general.alignment"):
            w.write()
    assert not (tmp_path / "w.gguf").exists()


# ----------------------------------------------------------------------------- files
def test_empty_file(tmp_path):
    expect_error(tmp_path, b"", "file is empty", offset=0)


def test_directory(tmp_path):
    with pytest.raises(GGUFError, match="is a directory") as info:
        GGUFReader(tmp_path)
    assert str(tmp_path) in str(info.value)


def test_missing_file(tmp_path):
    path = tmp_path / "nope.gguf"
    with pytest.raises(GGUFError, match="no such file") as info:
        GGUFReader(path)
    assert str(path) in str(info.value)


def test_special_file_is_a_gguf_error():
    # character devices report size 0 (or cannot be mapped): never a raw OSError
    with pytest.raises(GGUFError):
        GGUFReader("/dev/zero")


# ----------------------------------------------------------------------------- nesting
def _nested(depth: int) -> bytes:
    """``depth`` levels of arrays, innermost a one-element UINT8 array."""
    value = arr(VT.UINT8, 1, b"\7")
    for _ in range(depth - 1):
        value = arr(VT.ARRAY, 1, value)
    return value


def test_arrays_nested_too_deep(tmp_path):
    data = gguf([kv("deep", VT.ARRAY, _nested(9))])
    ninth = HEADER + len(gstr("deep")) + 4 + 12 * 8
    expect_error(tmp_path, data, "nested deeper than 8", "key 'deep'", offset=ninth)
    data = gguf([kv("deeper", VT.ARRAY, _nested(1000))])
    expect_error(tmp_path, data, "nested deeper than 8", "key 'deeper'")


def test_arrays_nested_8_deep_load(tmp_path):
    with load(tmp_path, gguf([kv("deep", VT.ARRAY, _nested(8))])) as r:
        v = r.metadata["deep"]
        for _ in range(7):
            assert isinstance(v, list) and len(v) == 1
            v = v[0]
        assert v.dtype == np.uint8 and v.tolist() == [7]


# ----------------------------------------------------------------------------- valid files
ALL_SCALARS = [
    (VT.UINT8, 255, "<B"),
    (VT.INT8, -128, "<b"),
    (VT.UINT16, 65535, "<H"),
    (VT.INT16, -32768, "<h"),
    (VT.UINT32, 2**32 - 1, "<I"),
    (VT.INT32, -(2**31), "<i"),
    (VT.FLOAT32, -1.25, "<f"),
    (VT.BOOL, True, "<?"),
    (VT.UINT64, 2**64 - 1, "<Q"),
    (VT.INT64, -(2**63), "<q"),
    (VT.FLOAT64, math.pi, "<d"),
]
ARRAY_DTYPES = {
    VT.UINT8: "<u1", VT.INT8: "<i1", VT.UINT16: "<u2", VT.INT16: "<i2", VT.UINT32: "<u4",
    VT.INT32: "<i4", VT.FLOAT32: "<f4", VT.BOOL: "?", VT.UINT64: "<u8", VT.INT64: "<i8",
    VT.FLOAT64: "<f8",
}  # fmt: skip


def test_hand_built_values_decode(tmp_path):
    """Values laid out by hand (not by our writer) decode to the right Python/numpy values."""
    kvs = [kv(f"s.{t.name}", t, struct.pack(fmt, v)) for t, v, fmt in ALL_SCALARS]
    kvs.append(kv("str", VT.STRING, gstr("héllo ✓")))
    kvs.append(kv("empty", VT.STRING, gstr("")))
    kvs.append(kv("bad.utf8", VT.STRING, gstr(b"\xff\xfeok")))
    kvs.append(kv("f32.arr", VT.ARRAY, arr(VT.FLOAT32, 3, struct.pack("<3f", 1.5, -2, 1e30))))
    kvs.append(kv("bool.arr", VT.ARRAY, arr(VT.BOOL, 3, b"\1\0\1")))
    kvs.append(kv("strs", VT.ARRAY, arr(VT.STRING, 3, gstr("a") + gstr("") + gstr("日本"))))
    inner = arr(VT.INT16, 2, struct.pack("<2h", -1, 2)) + arr(VT.STRING, 1, gstr("x"))
    kvs.append(kv("nested", VT.ARRAY, arr(VT.ARRAY, 2, inner)))
    kvs.append(kv("empty.arr", VT.ARRAY, arr(VT.UINT64, 0)))
    with load(tmp_path, gguf(kvs)) as r:
        for t, v, _ in ALL_SCALARS:
            f = r.fields[f"s.{t.name}"]
            assert f.type == t and f.value == v and type(f.value) is type(v)
        assert r.metadata["str"] == "héllo ✓" and r.metadata["empty"] == ""
        assert r.metadata["bad.utf8"].encode("utf-8", "surrogateescape") == b"\xff\xfeok"
        a = r.metadata["f32.arr"]
        assert a.dtype == np.float32 and a.tolist() == [1.5, -2.0, np.float32(1e30)]
        assert r.metadata["bool.arr"].dtype == bool and r.metadata["bool.arr"].tolist() == [1, 0, 1]
        assert r.metadata["strs"] == ["a", "", "日本"] and r.fields["strs"].elem_type == VT.STRING
        n = r.metadata["nested"]
        assert r.fields["nested"].elem_type == VT.ARRAY and len(n) == 2
        assert n[0].dtype == np.int16 and n[0].tolist() == [-1, 2] and n[1] == ["x"]
        e = r.fields["empty.arr"]
        assert e.elem_type == VT.UINT64 and e.value.dtype == np.uint64 and e.value.size == 0


def test_all_value_types_round_trip(tmp_path):
    w = GGUFWriter(tmp_path / "v.gguf")
    for t, v, _ in ALL_SCALARS:
        w.add(f"s.{t.name}", v, type=t)
    for t, dt in ARRAY_DTYPES.items():
        values = [1, 0, 1] if t == VT.BOOL else [0, 1, 100]
        w.add(f"a.{t.name}", np.array(values, dtype=dt), type=VT.ARRAY, elem_type=t)
        w.add(f"e.{t.name}", [], type=VT.ARRAY, elem_type=t)
    w.add("a.uint8.inferred", np.array([1, 2], np.uint8))
    w.add("str", "ünïcode ✓ 日本")
    w.add("str.empty", "")
    w.add("strs", ["", "a", "ß"])
    w.add("strs.empty", [], type=VT.ARRAY, elem_type=VT.STRING)
    nested = [np.array([1.5], np.float32), ["p", "q"], [np.array([True, False])], []]
    w.add("nested", nested, type=VT.ARRAY, elem_type=VT.ARRAY)
    w.write()
    raw = (tmp_path / "v.gguf").read_bytes()
    assert raw[:4] == b"GGUF" and struct.unpack_from("<I", raw, 4)[0] == 3
    with GGUFReader(tmp_path / "v.gguf") as r:
        for t, v, fmt in ALL_SCALARS:
            f = r.fields[f"s.{t.name}"]
            assert f.type == t and type(f.value) is type(v)
            assert struct.pack(fmt, f.value) == struct.pack(fmt, v)
        for t, dt in ARRAY_DTYPES.items():
            f = r.fields[f"a.{t.name}"]
            assert f.type == VT.ARRAY and f.elem_type == t
            assert isinstance(f.value, np.ndarray) and f.value.dtype == np.dtype(dt)
            assert f.value.tolist() == ([True, False, True] if t == VT.BOOL else [0, 1, 100])
            e = r.fields[f"e.{t.name}"]
            assert e.elem_type == t and e.value.dtype == np.dtype(dt) and e.value.size == 0
        assert r.fields["a.uint8.inferred"].elem_type == VT.UINT8
        assert r.metadata["str"] == "ünïcode ✓ 日本" and r.metadata["str.empty"] == ""
        assert r.metadata["strs"] == ["", "a", "ß"] and r.fields["strs"].elem_type == VT.STRING
        e = r.fields["strs.empty"]
        assert e.elem_type == VT.STRING and e.value == []
        n = r.metadata["nested"]
        assert n[0].dtype == np.float32 and n[0].tolist() == [1.5]
        assert n[1] == ["p", "q"]
        assert isinstance(n[2], list) and n[2][0].dtype == bool and n[2][0].tolist() == [1, 0]
        assert isinstance(n[3], np.ndarray) and n[3].size == 0  # an empty list is INT32


def test_version_2_loads(tmp_path):
    body = header(1, 2, version=2) + kv_u32("a", 5) + kv("b", VT.STRING, gstr("two"))
    data = pad(body + tinfo("t", [2], GGMLType.F32, 0)) + struct.pack("<2f", 1, 2)
    with load(tmp_path, data) as r:
        assert r.version == 2 and r.metadata == {"a": 5, "b": "two"}
        assert r.tensors[0].data.tolist() == [1.0, 2.0]
    w = GGUFWriter(tmp_path / "v2.gguf", version=2)
    w.add("k", 1)
    w.write()
    assert struct.unpack_from("<I", (tmp_path / "v2.gguf").read_bytes(), 4)[0] == 2
    with GGUFReader(tmp_path / "v2.gguf") as r:
        assert r.version == 2 and r.metadata == {"k": 1}


@pytest.mark.parametrize("align", [1, 8, 64, 4096])
def test_custom_alignment_is_honored(tmp_path, align):
    ka = kv_u32("general.alignment", align)
    t0 = tinfo("a", [3], GGMLType.F32, 0)  # 12 bytes
    t1 = tinfo("b", [2], GGMLType.I16, -(-12 // align) * align)
    body = header(2, 1) + ka + t0 + t1
    data_start = len(body) + (-len(body) % align)
    blob = pad(struct.pack("<3f", 1, 2, 3), align) + struct.pack("<2h", -7, 9)
    data = body + b"\xaa" * (data_start - len(body)) + blob
    with load(tmp_path, data) as r:
        assert r.alignment == align and r.data_offset == data_start
        assert r.tensors[0].data_offset == data_start
        assert r.tensors[1].data_offset == data_start + -(-12 // align) * align
        assert r.tensors[0].data.tolist() == [1, 2, 3] and r.tensors[1].data.tolist() == [-7, 9]
    # and our writer lays the file out the same way
    w = GGUFWriter(tmp_path / "w.gguf")
    w.add("general.alignment", align, type=VT.UINT32)
    w.add_tensor("a", GGMLType.F32, (3,), np.array([1, 2, 3], np.float32))
    w.add_tensor("b", GGMLType.I16, (2,), np.array([-7, 9], np.int16))
    w.write()
    written = (tmp_path / "w.gguf").read_bytes()
    assert written[: len(body)] == body
    assert written[data_start : data_start + len(blob)] == blob
    assert written[data_start + len(blob) :] == b"\0" * (-len(blob) % align)  # last padding


TENSOR_CASES = [
    (GGMLType.F32, (5, 3), np.float32),
    (GGMLType.F16, (4, 2, 2), np.float16),
    (GGMLType.BF16, (6,), np.uint16),
    (GGMLType.F64, (2, 2), np.float64),
    (GGMLType.I8, (7, 1), np.int8),
    (GGMLType.I16, (3, 2), np.int16),
    (GGMLType.I32, (2, 2, 2, 2), np.int32),
    (GGMLType.I64, (3,), np.int64),
    (GGMLType.Q4_0, (64, 3), None),
    (GGMLType.Q8_0, (32, 2, 2), None),
    (GGMLType.Q4_K, (512, 2), None),
    (GGMLType.Q6_K, (256,), None),
    (GGMLType.IQ4_NL, (32, 1, 1, 2), None),
    (GGMLType.MXFP4, (64, 3), None),
]


def _write_tensor_file(path: Path) -> dict[str, bytes]:
    rng = np.random.default_rng(0)
    w = GGUFWriter(path)
    w.add("general.name", "tensors")
    expected = {}
    for gtype, shape, _ in TENSOR_CASES:
        block, block_bytes = GGML_BLOCK_SIZES[gtype]
        raw = rng.integers(0, 256, math.prod(shape) // block * block_bytes, np.uint8).tobytes()
        w.add_tensor(f"t.{gtype.name}", gtype, shape, raw)
        expected[f"t.{gtype.name}"] = raw
    w.write()
    return expected


def test_tensor_views_are_zero_copy_with_right_dtype_and_shape(tmp_path):
    path = tmp_path / "t.gguf"
    expected = _write_tensor_file(path)
    file_bytes = path.read_bytes()
    with GGUFReader(path) as r:
        whole = np.frombuffer(r._buf, dtype=np.uint8)
        for (gtype, shape, dtype), t in zip(TENSOR_CASES, r.tensors):
            assert t.type == gtype and t.shape == shape and t.np_shape == shape[::-1]
            block, block_bytes = GGML_BLOCK_SIZES[gtype]
            row_bytes = shape[0] // block * block_bytes
            d = t.data
            if dtype is not None:
                assert d.dtype == np.dtype(dtype) and d.shape == shape[::-1]
            else:
                assert d.dtype == np.uint8 and d.shape == (*shape[::-1][:-1], row_bytes)
            assert d.tobytes() == expected[t.name] == t.raw.tobytes()
            assert file_bytes[t.data_offset : t.data_offset + t.nbytes] == expected[t.name]
            for view in (d, t.raw):
                assert np.shares_memory(view, whole)
                assert not view.flags.writeable
                base = view
                while isinstance(base, np.ndarray):
                    base = base.base
                assert isinstance(base, memoryview) and base.obj is r._mmap


def test_use_mmap_false_gives_equal_results(tmp_path):
    path = tmp_path / "t.gguf"
    _write_tensor_file(path)
    w = GGUFWriter(tmp_path / "m.gguf")
    w.add("strs", ["a", "b"])
    w.add("arr", np.arange(5, dtype=np.int64))
    w.add("nested", [[1, 2], ["x"]])
    w.add("f", 0.5)
    w.write()
    for p in (path, tmp_path / "m.gguf"):
        with GGUFReader(p) as a, GGUFReader(p, use_mmap=False) as b:
            assert b._mmap is None
            assert a.fields.keys() == b.fields.keys()
            for k in a.fields:
                fa, fb = a.fields[k], b.fields[k]
                assert (fa.type, fa.elem_type, fa.offset) == (fb.type, fb.elem_type, fb.offset)
                assert repr(fa.value) == repr(fb.value)
            assert (a.alignment, a.data_offset, a.version) == (
                b.alignment,
                b.data_offset,
                b.version,
            )
            for ta, tb in zip(a.tensors, b.tensors, strict=True):
                assert (ta.name, ta.type, ta.shape, ta.data_offset) == (
                    tb.name, tb.type, tb.shape, tb.data_offset)  # fmt: skip
                assert ta.data.dtype == tb.data.dtype and ta.data.shape == tb.data.shape
                assert ta.raw.tobytes() == tb.raw.tobytes()


def test_missing_tensor_lookup(tmp_path):
    path = tmp_path / "t.gguf"
    _write_tensor_file(path)
    with GGUFReader(path) as r:
        assert r.has_tensor("t.F32") and r.tensor("t.F32").name == "t.F32"
        with pytest.raises(GGUFError, match="no tensor named 'nope'"):
            r.tensor("nope")
