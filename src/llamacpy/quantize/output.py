"""The output file: metadata records, tensor infos, aligned tensor data, written atomically.

Metadata copied from the input keeps its exact on-disk bytes (one slice of the input file;
re-encoding a 262k-token vocabulary in Python would take longer than quantizing a small
model); only new or changed keys are encoded.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from ..errors import GGUFError
from ..fileio import atomic_write
from ..gguf.constants import (
    GGUF_DEFAULT_ALIGNMENT,
    GGUF_MAGIC,
    KEY_ALIGNMENT,
    GGMLType,
    GGUFValueType,
)
from ..gguf.reader import Field
from ..gguf.writer import encode_value

GGUF_VERSION = 3


def _string(s: str) -> bytes:
    raw = s.encode("utf-8", errors="surrogateescape")
    return struct.pack("<Q", len(raw)) + raw


def encode_record(key: str, vtype: GGUFValueType, value: Any, elem_type: Any = None) -> bytes:
    """One metadata key/value record as GGUF stores it."""
    return _string(key) + struct.pack("<I", vtype) + encode_value(vtype, value, elem_type, key)


def input_records(path: str, fields: Mapping[str, Field]) -> dict[str, bytes]:
    """The on-disk record of every field of one GGUF file (fields in file order, as read)."""
    items = list(fields.values())
    if not items:
        return {}
    last = items[-1]
    last_size = len(encode_record(last.key, last.type, last.value, last.elem_type))
    ends = [f.offset for f in items[1:]] + [last.offset + last_size]
    start = items[0].offset
    with open(path, "rb") as f:
        f.seek(start)
        blob = f.read(ends[-1] - start)
    out = {}
    for f, end in zip(items, ends):
        rec = blob[f.offset - start : end - start]
        head = _string(f.key) + struct.pack("<I", f.type)
        if not rec.startswith(head):  # not laid out as expected: encode it instead
            rec = encode_record(f.key, f.type, f.value, f.elem_type)
        out[f.key] = rec
    return out


def alignment_of(records: Mapping[str, bytes]) -> int:
    """``general.alignment`` of the output metadata, else 32."""
    rec = records.get(KEY_ALIGNMENT)
    if rec is None:
        return GGUF_DEFAULT_ALIGNMENT
    head = len(_string(KEY_ALIGNMENT))
    vtype = struct.unpack_from("<I", rec, head)[0]
    if vtype != GGUFValueType.UINT32:
        raise GGUFError("must be of type UINT32", key=KEY_ALIGNMENT)
    align = struct.unpack_from("<I", rec, head + 4)[0]
    if align <= 0 or align & (align - 1):
        raise GGUFError(f"alignment {align} is not a power of two", key=KEY_ALIGNMENT)
    return align


def header_bytes(
    records: Mapping[str, bytes], tensors: Iterable[tuple[str, tuple[int, ...], GGMLType, int]]
) -> bytes:
    """The header: metadata ``records`` in order, then (name, shape, type, nbytes) infos with
    data offsets packed at the alignment, padded to the alignment."""
    tensors = list(tensors)
    align = alignment_of(records)
    parts = [GGUF_MAGIC, struct.pack("<IQQ", GGUF_VERSION, len(tensors), len(records))]
    parts.extend(records.values())
    offset = 0
    for name, shape, t, nbytes in tensors:
        parts.append(_string(name))
        parts.append(struct.pack(f"<I{len(shape)}QIQ", len(shape), *shape, t, offset))
        offset += nbytes + (-nbytes % align)
    header = b"".join(parts)
    return header + b"\0" * (-len(header) % align) if tensors else header


def write_gguf(
    path: str,
    records: Mapping[str, bytes],
    tensors: list[tuple[str, tuple[int, ...], GGMLType, int]],
    data: Callable[[int], Any],
    progress: Callable[[int], None] | None = None,
) -> None:
    """Write the file atomically; ``data(i)`` gives tensor ``i``'s bytes when it is reached."""
    align = alignment_of(records)
    with atomic_write(path) as f:
        f.write(header_bytes(records, tensors))
        for i, (name, shape, t, nbytes) in enumerate(tensors):
            src = data(i)
            buf = np.ascontiguousarray(np.asarray(src)).reshape(-1).view(np.uint8)
            if buf.nbytes != nbytes:
                raise GGUFError(
                    f"data has {buf.nbytes} bytes but a {t.name} tensor of shape {shape} "
                    f"needs {nbytes}",
                    tensor=name,
                )
            f.write(buf)
            if nbytes % align:
                f.write(b"\0" * (-nbytes % align))
            if progress is not None:
                progress(i)
