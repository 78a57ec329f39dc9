"""GGUF writer: metadata with explicit or inferred types, tensors streamed one at a time.

Output is atomic (temporary file + rename). Tensor data may be given as arrays or as
callables that produce the bytes when the writer reaches that tensor, so a converter or
quantizer holds at most one tensor in memory.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from ..errors import GGUFError
from ..fileio import atomic_write
from .constants import (
    GGML_BLOCK_SIZES,
    GGML_MAX_DIMS,
    GGML_MAX_NAME,
    GGUF_DEFAULT_ALIGNMENT,
    GGUF_MAGIC,
    INTEGER_RANGES,
    KEY_ALIGNMENT,
    SCALAR_DTYPES,
    SCALAR_FORMATS,
    GGMLType,
    GGUFValueType,
)
from .reader import Field, GGUFReader

TensorSource = np.ndarray | bytes | bytearray | memoryview | Callable[[], Any]
# BOOL is stored as u1 too; uint8 arrays must map to UINT8, only numpy bool to BOOL
_NP_TO_VALUE_TYPE = {
    np.dtype(d).newbyteorder("<"): t for t, d in SCALAR_DTYPES.items() if t != GGUFValueType.BOOL
}
_NP_TO_VALUE_TYPE[np.dtype(bool)] = GGUFValueType.BOOL


@dataclass
class _PendingTensor:
    name: str
    type: GGMLType
    shape: tuple[int, ...]
    nbytes: int
    source: TensorSource


def infer_value_type(value: Any) -> GGUFValueType:
    """The GGUF type a Python value is written as when none is given (ints: INT32, else INT64)."""
    if isinstance(value, bool | np.bool_):
        return GGUFValueType.BOOL
    if isinstance(value, int | np.integer):
        lo, hi = INTEGER_RANGES[GGUFValueType.INT32]
        return GGUFValueType.INT32 if lo <= int(value) <= hi else GGUFValueType.INT64
    if isinstance(value, float | np.floating):
        return GGUFValueType.FLOAT32
    if isinstance(value, str):
        return GGUFValueType.STRING
    if isinstance(value, list | tuple | np.ndarray):
        return GGUFValueType.ARRAY
    raise TypeError(f"cannot store a value of type {type(value).__name__} in GGUF metadata")


def _infer_elem_type(value: Any) -> GGUFValueType:
    known = getattr(value, "elem_type", None)  # a TypedList read from a file
    if known is not None:
        return GGUFValueType(known)
    if isinstance(value, np.ndarray):
        t = _NP_TO_VALUE_TYPE.get(value.dtype.newbyteorder("<"))
        if t is None:
            raise TypeError(f"cannot store a numpy array of dtype {value.dtype} in GGUF metadata")
        return t
    if len(value) == 0:
        return GGUFValueType.INT32
    types = {infer_value_type(v) for v in value}
    if types <= {GGUFValueType.INT32, GGUFValueType.INT64}:
        return max(types)
    if len(types) != 1:
        raise TypeError("GGUF arrays must hold values of one type")
    return types.pop()


def _encode_string(s: str) -> bytes:
    raw = s.encode("utf-8", errors="surrogateescape")
    return struct.pack("<Q", len(raw)) + raw


def encode_value(
    vtype: GGUFValueType, value: Any, elem_type: GGUFValueType | None = None, key: str = "?"
) -> bytes:
    """Serialize one metadata value (without its key and type tag)."""
    if vtype == GGUFValueType.STRING:
        if not isinstance(value, str):
            raise GGUFError(f"expected a string, got {type(value).__name__}", key=key)
        return _encode_string(value)
    if vtype == GGUFValueType.ARRAY:
        if elem_type is None:
            elem_type = _infer_elem_type(value)
        parts = [struct.pack("<IQ", elem_type, len(value))]
        if elem_type in SCALAR_DTYPES:
            dtype = SCALAR_DTYPES[elem_type]
            arr = np.asarray(value)
            if elem_type in INTEGER_RANGES and arr.size:
                lo, hi = INTEGER_RANGES[elem_type]
                if not np.issubdtype(arr.dtype, np.integer) and arr.dtype != bool:
                    raise GGUFError(f"array of {elem_type.name} holds non-integers", key=key)
                if int(arr.min()) < lo or int(arr.max()) > hi:
                    raise GGUFError(f"array value out of range for {elem_type.name}", key=key)
            parts.append(np.ascontiguousarray(arr, dtype=dtype).tobytes())
        elif elem_type == GGUFValueType.STRING:
            parts.extend(_encode_string(s) for s in value)
        else:
            for sub in value:  # each element is a whole array value, without a type tag
                parts.append(encode_value(GGUFValueType.ARRAY, sub, None, key))
        return b"".join(parts)
    if vtype in INTEGER_RANGES:
        lo, hi = INTEGER_RANGES[vtype]
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise GGUFError(f"expected an integer for {vtype.name}, got {value!r}", key=key)
        if not lo <= int(value) <= hi:
            raise GGUFError(f"value {value} out of range for {vtype.name} [{lo}, {hi}]", key=key)
        return struct.pack(SCALAR_FORMATS[vtype], int(value))
    if vtype == GGUFValueType.BOOL:
        return struct.pack("<?", bool(value))
    return struct.pack(SCALAR_FORMATS[vtype], float(value))


class GGUFWriter:
    """Collect metadata and tensors, then :meth:`write` them to ``path`` atomically.

    Metadata keys keep insertion order. Tensor shapes are in ggml order (``ne[0]`` first).
    """

    def __init__(self, path: str | os.PathLike[str], *, version: int = 3) -> None:
        self.path = str(path)
        self.version = version
        self.fields: dict[str, Field] = {}
        self.tensors: list[_PendingTensor] = []
        self._names: set[str] = set()

    # ------------------------------------------------------------------ metadata
    def add(
        self,
        key: str,
        value: Any,
        type: GGUFValueType | None = None,
        elem_type: GGUFValueType | None = None,
    ) -> None:
        """Add or replace a key. Types are inferred when not given."""
        if not key:
            raise GGUFError("metadata keys must not be empty")
        vtype = infer_value_type(value) if type is None else GGUFValueType(type)
        if vtype == GGUFValueType.ARRAY and elem_type is None:
            elem_type = _infer_elem_type(value)
        encode_value(vtype, value, elem_type, key)  # validate now, not at write time
        self.fields[key] = Field(key, vtype, value, elem_type)

    def add_field(self, f: Field) -> None:
        self.fields[f.key] = Field(f.key, f.type, f.value, f.elem_type)

    def remove(self, key: str) -> None:
        self.fields.pop(key, None)

    @property
    def alignment(self) -> int:
        f = self.fields.get(KEY_ALIGNMENT)
        if f is None:
            return GGUF_DEFAULT_ALIGNMENT
        # the reader rejects anything else, so never write it
        if f.type != GGUFValueType.UINT32:
            raise GGUFError(f"must be of type UINT32, not {f.type.name}", key=KEY_ALIGNMENT)
        align = int(f.value)
        if align <= 0 or align & (align - 1):
            raise GGUFError(f"alignment {align} is not a power of two", key=KEY_ALIGNMENT)
        return align

    # ------------------------------------------------------------------ tensors
    def add_tensor(
        self,
        name: str,
        ggml_type: GGMLType | int,
        shape: Iterable[int],
        data: TensorSource,
    ) -> None:
        """Queue a tensor. ``data`` is an array/bytes, or a callable returning one at write time."""
        gtype = GGMLType(ggml_type)
        shape = tuple(int(d) for d in shape)
        if name in self._names:
            raise GGUFError("duplicate tensor name", tensor=name)
        if not name or len(name.encode("utf-8", errors="surrogateescape")) >= GGML_MAX_NAME:
            raise GGUFError(f"tensor name must be 1..{GGML_MAX_NAME - 1} bytes", tensor=name)
        if not 1 <= len(shape) <= GGML_MAX_DIMS or any(d <= 0 for d in shape):
            raise GGUFError(f"invalid shape {shape}", tensor=name)
        block, block_bytes = GGML_BLOCK_SIZES[gtype]
        if shape[0] % block:
            raise GGUFError(
                f"row length {shape[0]} is not a multiple of the {gtype.name} block size {block}",
                tensor=name,
            )
        n_el = 1
        for d in shape:
            n_el *= d
        self._names.add(name)
        self.tensors.append(_PendingTensor(name, gtype, shape, n_el // block * block_bytes, data))

    def add_tensor_info(self, t: Any) -> None:
        """Queue a tensor read by :class:`GGUFReader` (its bytes are copied at write time)."""
        self.add_tensor(t.name, t.type, t.shape, lambda t=t: t.raw)

    # ------------------------------------------------------------------ output
    def header_bytes(self) -> bytes:
        align = self.alignment
        parts = [GGUF_MAGIC, struct.pack("<IQQ", self.version, len(self.tensors), len(self.fields))]
        for f in self.fields.values():
            parts.append(_encode_string(f.key))
            parts.append(struct.pack("<I", f.type))
            parts.append(encode_value(f.type, f.value, f.elem_type, f.key))
        offset = 0
        for t in self.tensors:
            parts.append(_encode_string(t.name))
            parts.append(
                struct.pack(f"<I{len(t.shape)}QIQ", len(t.shape), *t.shape, t.type, offset)
            )
            offset += t.nbytes + (-t.nbytes % align)
        header = b"".join(parts)
        if self.tensors:
            header += b"\0" * (-len(header) % align)
        return header

    def write(self, progress: Callable[[str, int], None] | None = None) -> None:
        """Write the file atomically. ``progress(name, nbytes)`` is called after each tensor."""
        header = self.header_bytes()
        with atomic_write(self.path) as f:
            f.write(header)
            self._write_data(f, progress)

    def _write_data(self, f: BinaryIO, progress: Callable[[str, int], None] | None) -> None:
        align = self.alignment
        for t in self.tensors:
            src = t.source() if callable(t.source) else t.source
            arr = src if isinstance(src, np.ndarray) else np.frombuffer(src, dtype=np.uint8)
            buf = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
            if buf.nbytes != t.nbytes:
                raise GGUFError(
                    f"data has {buf.nbytes} bytes but a {t.type.name} tensor of shape {t.shape} "
                    f"needs {t.nbytes}",
                    tensor=t.name,
                )
            f.write(buf)
            pad = -t.nbytes % align
            if pad:
                f.write(b"\0" * pad)
            if progress is not None:
                progress(t.name, t.nbytes)


def copy_to_writer(reader: GGUFReader, writer: GGUFWriter) -> GGUFWriter:
    """Queue every field and tensor of ``reader`` on ``writer``, in file order."""
    for f in reader.fields.values():
        writer.add_field(f)
    for t in reader.tensors:
        writer.add_tensor_info(t)
    return writer
