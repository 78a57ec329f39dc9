"""Strict, zero-copy GGUF reader.

The file is memory-mapped; tensor data are numpy views into the mapping, so opening a model
copies no weights. Every count and length read from the file is checked against the bytes
that remain before anything is allocated or looped over, so a corrupted or hostile file
raises :class:`~llamacpy.errors.GGUFError` (naming the key or tensor and the byte offset)
instead of crashing, hanging or allocating gigabytes.

Layout (all little-endian)::

    magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
    n_kv x (string key, u32 value_type, value)
    n_tensors x (string name, u32 n_dims, u64 ne[n_dims], u32 ggml_type, u64 offset)
    padding to general.alignment
    tensor data (each tensor at data_offset + offset, offsets multiples of the alignment)
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Self

import numpy as np

from ..errors import GGUFError
from .constants import (
    GGML_BLOCK_SIZES,
    GGML_MAX_DIMS,
    GGML_MAX_NAME,
    GGML_NUMPY_DTYPES,
    GGUF_DEFAULT_ALIGNMENT,
    GGUF_MAGIC,
    GGUF_VERSIONS,
    KEY_ALIGNMENT,
    LEGACY_MAGICS,
    SCALAR_DTYPES,
    SCALAR_FORMATS,
    SCALAR_SIZES,
    GGMLType,
    GGUFValueType,
    ggml_type_name,
)

INT64_MAX = 2**63 - 1
MAX_ARRAY_NESTING = 8  # arrays of arrays deeper than this are rejected (no real file needs it)
_MIN_KV_BYTES = 8 + 4 + 1  # empty-key length, value type, smallest value
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8  # name length, n_dims, one dim, type, offset
_MIN_ELEMENT_BYTES = {GGUFValueType.STRING: 8, GGUFValueType.ARRAY: 4 + 8}
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


class TypedList(list):
    """A list read from an array of strings or of arrays; remembers its GGUF element type
    so that writing it back (even when empty) reproduces the same bytes."""

    def __init__(self, items: Any = (), elem_type: GGUFValueType = GGUFValueType.STRING) -> None:
        super().__init__(items)
        self.elem_type = elem_type


@dataclass(frozen=True)
class Field:
    """One metadata key/value with its on-disk types (needed to write it back unchanged).

    ``value`` is a Python scalar, ``str``, a numpy array (arrays of numbers or bools), or a
    list (arrays of strings, arrays of arrays). ``elem_type`` is set for arrays only.
    """

    key: str
    type: GGUFValueType
    value: Any
    elem_type: GGUFValueType | None = None
    offset: int = 0  # where the key/value record starts in the file


@dataclass(frozen=True)
class TensorInfo:
    """A tensor's header entry plus zero-copy views of its bytes.

    ``shape`` is in ggml order (``ne[0]`` is the contiguous row length); ``np_shape`` is the
    reversed, numpy order.
    """

    name: str
    type: GGMLType
    shape: tuple[int, ...]
    offset: int  # relative to the data section, as stored in the file
    data_offset: int  # absolute byte offset in the file
    nbytes: int
    n_elements: int
    _buf: Any = field(repr=False, compare=False, default=None)

    @property
    def np_shape(self) -> tuple[int, ...]:
        return tuple(reversed(self.shape))

    @property
    def raw(self) -> np.ndarray:
        """The tensor's bytes as a flat uint8 view of the file (no copy)."""
        return np.frombuffer(self._buf, dtype=np.uint8, count=self.nbytes, offset=self.data_offset)

    @property
    def data(self) -> np.ndarray:
        """A view in numpy order.

        Plain types (F32, F16, I8..I64, F64) get their dtype and ``np_shape``; BF16 comes as
        its uint16 bits. Block-quantized types come as uint8 with the last axis holding the
        bytes of one row.
        """
        dtype = GGML_NUMPY_DTYPES.get(self.type)
        if dtype is not None:
            arr = np.frombuffer(
                self._buf, dtype=dtype, count=self.n_elements, offset=self.data_offset
            )
            return arr.reshape(self.np_shape)
        row_bytes = self.nbytes // max(1, self.n_elements // self.shape[0])
        return self.raw.reshape((*self.np_shape[:-1], row_bytes))


class FieldsAndTensors:
    """Lookups shared by a GGUF file and a (split) model: ``fields`` (key -> :class:`Field`,
    in file order), ``tensors`` (in order) and ``_tensor_index`` (name -> tensor), and
    ``close()`` at the end of a ``with`` block."""

    path: str
    fields: dict[str, Field]
    tensors: list[TensorInfo]
    _tensor_index: dict[str, TensorInfo]

    @property
    def metadata(self) -> dict[str, Any]:
        """Key -> value (Python scalar, str, numpy array or list), in file order."""
        return {k: f.value for k, f in self.fields.items()}

    def get(self, key: str, default: Any = None) -> Any:
        f = self.fields.get(key)
        return default if f is None else f.value

    def tensor(self, name: str) -> TensorInfo:
        try:
            return self._tensor_index[name]
        except KeyError:
            raise GGUFError(f"no tensor named {name!r}", path=self.path, tensor=name) from None

    def has_tensor(self, name: str) -> bool:
        return name in self._tensor_index

    def __iter__(self) -> Iterator[TensorInfo]:
        return iter(self.tensors)

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class GGUFReader(FieldsAndTensors):
    """An open GGUF file.

    >>> with GGUFReader("model.gguf") as r:   # doctest: +SKIP
    ...     r.metadata["general.architecture"], r.tensors[0].name

    ``use_mmap=False`` reads the whole file into memory instead of mapping it.
    """

    def __init__(self, path: str | os.PathLike[str], *, use_mmap: bool = True) -> None:
        self.path = str(path)
        self._mmap: mmap.mmap | None = None
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size == 0:
                    raise GGUFError("file is empty, not a GGUF file", path=self.path, offset=0)
                if use_mmap:
                    self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                    buf: Any = self._mmap
                else:
                    buf = f.read()
        except IsADirectoryError:
            raise GGUFError("is a directory, not a GGUF file", path=self.path) from None
        except FileNotFoundError:
            raise GGUFError("no such file", path=self.path) from None
        except PermissionError:
            raise GGUFError("permission denied", path=self.path) from None
        except (OSError, ValueError) as e:  # e.g. a special file that cannot be mapped
            raise GGUFError(f"cannot read the file: {e}", path=self.path) from None
        self._buf = buf
        self.file_size = size
        self.fields: dict[str, Field] = {}
        self.tensors: list[TensorInfo] = []
        self._tensor_index: dict[str, TensorInfo] = {}
        try:
            self._parse()
        except BaseException:
            self.close()
            raise

    # ----------------------------------------------------------------- public API
    def close(self) -> None:
        """Release the mapping. Views handed out keep it alive until they are dropped."""
        mm, self._mmap = self._mmap, None
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass  # numpy views still point into it; it is unmapped when they are freed

    # ----------------------------------------------------------------- parsing
    def _err(self, msg: str, offset: int | None = None, **kw: Any) -> GGUFError:
        return GGUFError(msg, path=self.path, offset=offset, **kw)

    def _need(self, pos: int, n: int, what: str, **kw: Any) -> None:
        if n < 0 or pos + n > self.file_size:
            raise self._err(
                f"file is truncated: {what} needs {n} bytes but only "
                f"{max(0, self.file_size - pos)} remain",
                pos,
                **kw,
            )

    def _u32(self, pos: int, what: str, **kw: Any) -> int:
        self._need(pos, 4, what, **kw)
        return _U32.unpack_from(self._buf, pos)[0]

    def _u64(self, pos: int, what: str, **kw: Any) -> int:
        self._need(pos, 8, what, **kw)
        return _U64.unpack_from(self._buf, pos)[0]

    def _string(self, pos: int, what: str, **kw: Any) -> tuple[str, int]:
        n = self._u64(pos, f"length of {what}", **kw)
        pos += 8
        if n > self.file_size - pos:
            raise self._err(
                f"{what} declares length {n} but only {self.file_size - pos} bytes remain",
                pos - 8,
                **kw,
            )
        raw = bytes(self._buf[pos : pos + n])
        # surrogateescape keeps invalid UTF-8 (seen in some vocabularies) and writes it back as is
        return raw.decode("utf-8", errors="surrogateescape"), pos + n

    def _parse(self) -> None:
        self._need(0, 4, "magic")
        magic = bytes(self._buf[0:4])
        if magic != GGUF_MAGIC:
            legacy = LEGACY_MAGICS.get(magic)
            if legacy:
                raise self._err(
                    f"this is a legacy {legacy} model file (pre-GGUF llama.cpp format), which is "
                    "no longer supported; convert the original model to GGUF "
                    "(`llamacpy convert`, or llama.cpp's convert scripts)",
                    0,
                )
            raise self._err(f"not a GGUF file: magic bytes are {magic!r}, expected b'GGUF'", 0)
        version = self._u32(4, "version")
        if version not in GGUF_VERSIONS:
            swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
            if swapped in (1, 2, 3):
                raise self._err(
                    "this is a big-endian GGUF file; only little-endian files are supported "
                    "(convert it on a little-endian machine)",
                    4,
                )
            if version == 1:
                raise self._err("GGUF version 1 is obsolete; re-convert the model", 4)
            raise self._err(f"unsupported GGUF version {version} (supported: 2, 3)", 4)
        self.version = version
        n_tensors = self._u64(8, "tensor count")
        n_kv = self._u64(16, "metadata key/value count")
        pos = 24
        remain = self.file_size - pos
        if n_kv * _MIN_KV_BYTES > remain:
            raise self._err(
                f"metadata count {n_kv} cannot fit in the {remain} bytes left in the file", 16
            )
        if n_tensors * _MIN_TENSOR_INFO_BYTES > remain:
            raise self._err(
                f"tensor count {n_tensors} cannot fit in the {remain} bytes left in the file", 8
            )

        for i in range(n_kv):
            start = pos
            key, pos = self._string(pos, f"key of metadata entry {i}")
            if not key:
                raise self._err(f"metadata entry {i} has an empty key", start)
            if key in self.fields:
                raise self._err("duplicate metadata key", start, key=key)
            vtype_raw = self._u32(pos, "value type", key=key)
            vtype = self._value_type(vtype_raw, pos, key)
            pos += 4
            value, elem_type, pos = self._value(vtype, pos, key, depth=0)
            self.fields[key] = Field(key, vtype, value, elem_type, start)

        align_field = self.fields.get(KEY_ALIGNMENT)
        alignment = GGUF_DEFAULT_ALIGNMENT
        if align_field is not None:
            if align_field.type != GGUFValueType.UINT32:
                raise self._err(
                    f"must be of type UINT32, not {align_field.type.name}",
                    align_field.offset,
                    key=KEY_ALIGNMENT,
                )
            alignment = int(align_field.value)
            if alignment <= 0 or alignment & (alignment - 1):
                raise self._err(
                    f"alignment {alignment} is not a power of two",
                    align_field.offset,
                    key=KEY_ALIGNMENT,
                )
        self.alignment = alignment

        infos = []
        seen: set[str] = set()
        for i in range(n_tensors):
            info = self._tensor_info(i, pos)
            if info[0] in seen:
                raise self._err("duplicate tensor name", pos, tensor=info[0])
            seen.add(info[0])
            infos.append(info)
            pos = info[-1]
        self.header_size = pos
        data_offset = pos + (-pos % alignment)
        if n_tensors and data_offset > self.file_size:
            raise self._err(
                "file is truncated: the tensor data section starts past the end of the file",
                pos,
            )
        self.data_offset = data_offset

        prev_end = 0
        prev_name = None
        for name, shape, gtype, offset, n_el, nbytes, info_pos, _ in infos:
            if offset % alignment:
                raise self._err(
                    f"data offset {offset} is not a multiple of the alignment {alignment}",
                    info_pos,
                    tensor=name,
                )
            if offset < prev_end:
                raise self._err(
                    f"data offset {offset} overlaps or precedes the data of the previous tensor "
                    f"{prev_name!r} (which ends at {prev_end}); offsets must be in increasing order",
                    info_pos,
                    tensor=name,
                )
            start = data_offset + offset
            if start + nbytes > self.file_size:
                raise self._err(
                    f"tensor data ({nbytes} bytes at {start}) runs past the end of the file "
                    f"({self.file_size} bytes); the file is truncated",
                    info_pos,
                    tensor=name,
                )
            prev_end, prev_name = offset + nbytes, name
            ti = TensorInfo(name, gtype, shape, offset, start, nbytes, n_el, self._buf)
            self.tensors.append(ti)
            self._tensor_index[name] = ti

    def _value_type(self, raw: int, pos: int, key: str) -> GGUFValueType:
        try:
            return GGUFValueType(raw)
        except ValueError:
            raise self._err(f"unknown value type {raw}", pos, key=key) from None

    def _value(
        self, vtype: GGUFValueType, pos: int, key: str, depth: int
    ) -> tuple[Any, GGUFValueType | None, int]:
        if vtype == GGUFValueType.STRING:
            s, pos = self._string(pos, "string value", key=key)
            return s, None, pos
        if vtype != GGUFValueType.ARRAY:
            size = SCALAR_SIZES[vtype]
            self._need(pos, size, f"{vtype.name} value", key=key)
            (v,) = struct.unpack_from(SCALAR_FORMATS[vtype], self._buf, pos)
            return v, None, pos + size
        # array: u32 element type, u64 count, elements
        if depth >= MAX_ARRAY_NESTING:
            raise self._err(f"arrays nested deeper than {MAX_ARRAY_NESTING} levels", pos, key=key)
        etype = self._value_type(self._u32(pos, "array element type", key=key), pos, key)
        count = self._u64(pos + 4, "array length", key=key)
        pos += 12
        remain = self.file_size - pos
        min_size = SCALAR_SIZES.get(etype) or _MIN_ELEMENT_BYTES[etype]
        if count * min_size > remain:
            raise self._err(
                f"array of {count} {etype.name} elements needs at least {count * min_size} bytes "
                f"but only {remain} remain",
                pos - 8,
                key=key,
            )
        if etype in SCALAR_DTYPES:
            arr = np.frombuffer(self._buf, dtype=SCALAR_DTYPES[etype], count=count, offset=pos)
            if etype == GGUFValueType.BOOL:
                arr = arr.astype(bool)
            return arr, etype, pos + count * min_size
        items: list[Any] = []
        if etype == GGUFValueType.STRING:
            items, pos = self._string_array(pos, count, key)
            return TypedList(items, etype), etype, pos
        for _ in range(count):
            # each element is a whole array value (element type, count, items), with no type tag
            v, _, pos = self._value(GGUFValueType.ARRAY, pos, key, depth + 1)
            items.append(v)
        return TypedList(items, etype), etype, pos

    def _string_array(self, pos: int, count: int, key: str) -> tuple[list[str], int]:
        buf, size = self._buf, self.file_size
        unpack = _U64.unpack_from
        out: list[str] = []
        append = out.append
        for i in range(count):
            if pos + 8 > size:
                raise self._err(f"file is truncated inside string {i} of {count}", pos, key=key)
            n = unpack(buf, pos)[0]
            pos += 8
            if n > size - pos:
                raise self._err(
                    f"string {i} of the array declares length {n} but only {size - pos} bytes "
                    "remain",
                    pos - 8,
                    key=key,
                )
            append(buf[pos : pos + n].decode("utf-8", errors="surrogateescape"))
            pos += n
        return out, pos

    def _tensor_info(self, i: int, pos: int) -> tuple:
        info_pos = pos
        name, pos = self._string(pos, f"name of tensor {i}")
        if not name:
            raise self._err(f"tensor {i} has an empty name", info_pos)
        name_bytes = len(name.encode("utf-8", errors="surrogateescape"))
        if name_bytes >= GGML_MAX_NAME:
            raise self._err(
                f"tensor name is too long ({name_bytes} bytes; must be under {GGML_MAX_NAME})",
                info_pos,
                tensor=name[:80],
            )
        n_dims = self._u32(pos, "dimension count", tensor=name)
        if not 1 <= n_dims <= GGML_MAX_DIMS:
            raise self._err(
                f"has {n_dims} dimensions; must be 1..{GGML_MAX_DIMS}", pos, tensor=name
            )
        pos += 4
        self._need(pos, 8 * n_dims, "dimensions", tensor=name)
        shape = struct.unpack_from(f"<{n_dims}q", self._buf, pos)
        n_el = 1
        for d, ne in enumerate(shape):
            if ne <= 0:
                raise self._err(
                    f"dimension {d} is {ne}; must be positive", pos + 8 * d, tensor=name
                )
            n_el *= ne
            if n_el > INT64_MAX:
                raise self._err(
                    f"element count of shape {shape} overflows int64", pos + 8 * d, tensor=name
                )
        pos += 8 * n_dims
        raw_type = self._u32(pos, "tensor type", tensor=name)
        try:
            gtype = GGMLType(raw_type)
        except ValueError:
            raise self._err(f"unknown ggml type {raw_type}", pos, tensor=name) from None
        block, block_bytes = GGML_BLOCK_SIZES[gtype]
        if shape[0] % block:
            raise self._err(
                f"row length {shape[0]} is not a multiple of the {ggml_type_name(gtype)} "
                f"block size {block}",
                pos,
                tensor=name,
            )
        nbytes = n_el // block * block_bytes
        pos += 4
        offset = self._u64(pos, "data offset", tensor=name)
        pos += 8
        if nbytes > self.file_size:
            raise self._err(
                f"shape {shape} of type {gtype.name} needs {nbytes} bytes, more than the whole "
                f"file ({self.file_size} bytes)",
                info_pos,
                tensor=name,
            )
        return (name, shape, gtype, offset, n_el, nbytes, info_pos, pos)
