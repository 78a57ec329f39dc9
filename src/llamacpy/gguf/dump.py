"""Describe a GGUF file: metadata, tensor table, file type, parameter count; text or JSON.

The functions take a path, a :class:`~llamacpy.gguf.split.GGUFModelFile` or a
:class:`~llamacpy.gguf.reader.GGUFReader`. A path to the first shard of a split model shows
the whole model (tensors of every shard, with a shard column); any other shard is shown on
its own. Metadata is shown exactly as stored in the (first) file, ``split.*`` keys included.

Text output shortens long strings and arrays; JSON output (``to_json``) is complete and
strictly valid JSON: arrays in full, strings that are not valid UTF-8 made safe with
``\\xNN`` escapes, non-finite floats as the strings ``"nan"``, ``"inf"``, ``"-inf"``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from .constants import (
    KEY_ARCHITECTURE,
    KEY_FILE_TYPE,
    SCALAR_DTYPES,
    GGUFValueType,
    file_type_name,
)
from .reader import Field, GGUFReader, TensorInfo
from .split import GGUFModelFile

Source = str | os.PathLike[str] | GGUFModelFile | GGUFReader

MAX_ITEMS = 6  # array elements shown in text output
MAX_STR = 60  # characters of a string shown in text output
MAX_ITEM_STR = 30  # characters of a string inside an array in text output


@dataclass
class _View:
    """What the dump shows, independent of how the file was opened."""

    path: str
    paths: list[str]
    version: int
    alignment: int
    data_offset: int
    fields: dict[str, Field]
    tensors: list[TensorInfo]
    shards: list[int]  # shard index of each tensor


@contextlib.contextmanager
def _view(src: Source) -> Iterator[_View]:
    if isinstance(src, GGUFReader):
        yield _View(
            src.path,
            [src.path],
            src.version,
            src.alignment,
            src.data_offset,
            src.fields,
            src.tensors,
            [0] * len(src.tensors),
        )
        return
    if isinstance(src, GGUFModelFile):
        model, owned = src, False
    else:
        model, owned = GGUFModelFile(src, any_shard=True), True
    try:
        first = model.readers[0]
        shards = [i for i, r in enumerate(model.readers) for _ in r.tensors]
        yield _View(
            first.path,
            [str(p) for p in model.paths],
            first.version,
            first.alignment,
            first.data_offset,
            first.fields,
            model.tensors,
            shards,
        )
    finally:
        if owned:
            model.close()


# --------------------------------------------------------------------------- helpers
def safe_str(s: str) -> str:
    """``s`` with bytes that were not valid UTF-8 (kept as surrogates) shown as ``\\xNN``."""
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        raw = s.encode("utf-8", errors="surrogateescape")
        return raw.decode("utf-8", errors="backslashreplace")


def type_label(f: Field) -> str:
    """``UINT32``, ``STRING``, or ``[STRING]`` for arrays (``[[INT32]]`` when nested)."""
    if f.type != GGUFValueType.ARRAY:
        return f.type.name
    depth, v, et = 1, f.value, f.elem_type
    while et == GGUFValueType.ARRAY and isinstance(v, list) and v:
        depth += 1
        v = v[0]
        et = getattr(v, "elem_type", None) or _np_elem_type(v)
    name = et.name if isinstance(et, GGUFValueType) else "?"
    return "[" * depth + name + "]" * depth


_DTYPE_TO_VALUE_TYPE = {d.newbyteorder("<"): t for t, d in SCALAR_DTYPES.items()}
_DTYPE_TO_VALUE_TYPE[np.dtype(bool)] = GGUFValueType.BOOL


def _np_elem_type(v: Any) -> GGUFValueType | None:
    if isinstance(v, np.ndarray):
        return _DTYPE_TO_VALUE_TYPE.get(v.dtype.newbyteorder("<"))
    return None


def format_params(n: int) -> str:
    """A parameter count the way llama.cpp shows it: ``134.52 M``, ``1.24 B``."""
    if n >= 10**9:
        return f"{n / 1e9:.2f} B"
    if n >= 10**6:
        return f"{n / 1e6:.2f} M"
    if n >= 10**3:
        return f"{n / 1e3:.2f} K"
    return str(n)


def _short(s: str, n: int) -> str:
    s = safe_str(s)
    return s if len(s) <= n else s[: n - 3] + "..."


def _scalar_text(vtype: GGUFValueType | None, v: Any) -> str:
    if vtype == GGUFValueType.FLOAT32:
        return str(np.float32(v))
    if isinstance(v, np.bool_ | bool):
        return "true" if v else "false"
    if isinstance(v, np.generic):
        return str(v.item())
    return str(v)


def _items_text(v: Any, et: GGUFValueType | None, max_items: int) -> str:
    n = len(v)
    parts = []
    for x in list(v[:max_items]):
        if isinstance(x, str):
            parts.append(repr(_short(x, MAX_ITEM_STR)))
        elif isinstance(x, list | np.ndarray):
            sub_et = getattr(x, "elem_type", None) or _np_elem_type(x)
            parts.append(_items_text(x, sub_et, 3))
        else:
            parts.append(_scalar_text(et, x))
    if n > max_items:
        parts.append("...")
    return "[" + ", ".join(parts) + "]"


def format_value(f: Field, max_items: int = MAX_ITEMS, max_str: int = MAX_STR) -> str:
    """A field's value for the text dump: long strings and arrays shortened."""
    if f.type == GGUFValueType.STRING:
        return repr(_short(f.value, max_str))
    if f.type == GGUFValueType.ARRAY:
        et = f.elem_type
        label = f"[{len(f.value)} x {et.name if et is not None else '?'}]"
        return f"{label} {_items_text(f.value, et, max_items)}"
    return _scalar_text(f.type, f.value)


def n_params(tensors: list[TensorInfo]) -> int:
    return sum(t.n_elements for t in tensors)


def _file_type(fields: dict[str, Field]) -> tuple[int | None, str | None]:
    f = fields.get(KEY_FILE_TYPE)
    if f is None or isinstance(f.value, str | list | np.ndarray):
        return None, None
    try:
        ft = int(f.value)
    except (TypeError, ValueError):
        return None, None
    return ft, file_type_name(ft)


def _arch(fields: dict[str, Field]) -> str | None:
    f = fields.get(KEY_ARCHITECTURE)
    return safe_str(f.value) if f is not None and isinstance(f.value, str) else None


# --------------------------------------------------------------------------- text
def dump_lines(src: Source, *, tensors: bool = True) -> Iterator[str]:
    """The text dump, one line at a time."""
    with _view(src) as v:
        yield from _lines(v, tensors)


def _lines(v: _View, with_tensors: bool) -> Iterator[str]:
    ft, ft_name = _file_type(v.fields)
    yield f"* File: {safe_str(v.path)}"
    if len(v.paths) > 1:
        yield f"* Split model: {len(v.paths)} shards"
        for p in v.paths:
            yield f"    {safe_str(p)}"
    yield (
        f"* GGUF version {v.version}, alignment {v.alignment}, "
        f"{len(v.fields)} key/value pairs, {len(v.tensors)} tensors"
    )
    yield f"* Architecture: {_arch(v.fields) or '(none)'}"
    yield f"* File type: {ft_name if ft_name is not None else '(unknown)'}" + (
        f" ({ft})" if ft is not None else ""
    )
    yield f"* Parameters: {format_params(n_params(v.tensors))}"
    yield f"* Metadata ({len(v.fields)} keys):"
    width = max((len(type_label(f)) for f in v.fields.values()), default=6)
    for i, f in enumerate(v.fields.values(), 1):
        yield f"  {i:5}: {type_label(f):<{width}} | {safe_str(f.key)} = {format_value(f)}"
    if not with_tensors:
        return
    yield f"* Tensors ({len(v.tensors)}):"
    split = len(v.paths) > 1
    header = ["index", *(["shard"] if split else []), "name", "type", "shape", "offset", "bytes"]
    rows = []
    for i, t in enumerate(v.tensors):
        shape = "[" + ", ".join(str(d) for d in t.shape) + "]"
        shard = [str(v.shards[i] + 1)] if split else []
        rows.append(
            [str(i), *shard, safe_str(t.name), t.type.name, shape, str(t.offset), str(t.nbytes)]
        )
    widths = [max(len(r[c]) for r in [header, *rows]) for c in range(len(header))]
    right = {0, len(header) - 2, len(header) - 1} | ({1} if split else set())

    def fmt(r: list[str]) -> str:
        cells = [
            c.rjust(w) if j in right else c.ljust(w) for j, (c, w) in enumerate(zip(r, widths))
        ]
        return "  " + "  ".join(cells).rstrip()

    yield fmt(header)
    for r in rows:
        yield fmt(r)


def dump_text(src: Source, *, tensors: bool = True) -> str:
    """The whole text dump as one string (ending in a newline)."""
    return "\n".join(dump_lines(src, tensors=tensors)) + "\n"


# --------------------------------------------------------------------------- JSON
def _json_float(x: float) -> float | str:
    if math.isfinite(x):
        return x
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


def _json_value(vtype: GGUFValueType | None, v: Any) -> Any:
    if isinstance(v, str):
        return safe_str(v)
    if isinstance(v, np.ndarray):
        # float32: the shortest decimal that reads back as the same f32 (1e-05, not 9.99e-06)
        vals = [float(s) for s in v.astype(str)] if v.dtype == np.float32 else v.tolist()
        if v.dtype.kind == "f" and not np.isfinite(v).all():
            return [_json_float(x) for x in vals]
        return vals
    if isinstance(v, list):
        et = getattr(v, "elem_type", None)
        if et == GGUFValueType.STRING or (v and all(isinstance(x, str) for x in v)):
            return [safe_str(x) for x in v]
        return [_json_value(et, x) for x in v]
    if isinstance(v, bool | np.bool_):
        return bool(v)
    if isinstance(v, float | np.floating):
        x = float(str(np.float32(v))) if vtype == GGUFValueType.FLOAT32 else float(v)
        return _json_float(x)
    if isinstance(v, np.integer):
        return int(v)
    return v


def to_dict(src: Source, *, tensors: bool = True) -> dict[str, Any]:
    """The dump as plain JSON-able data (see :func:`to_json`)."""
    with _view(src) as v:
        return _dict(v, tensors)


def _dict(v: _View, with_tensors: bool) -> dict[str, Any]:
    ft, ft_name = _file_type(v.fields)
    out: dict[str, Any] = {
        "file": safe_str(v.path),
        "shards": [safe_str(p) for p in v.paths],
        "version": v.version,
        "alignment": v.alignment,
        "data_offset": v.data_offset,
        "architecture": _arch(v.fields),
        "file_type": ft,
        "file_type_name": ft_name,
        "n_params": n_params(v.tensors),
        "n_tensors": len(v.tensors),
        "n_kv": len(v.fields),
        "metadata": {safe_str(k): _json_value(f.type, f.value) for k, f in v.fields.items()},
        "metadata_types": {safe_str(k): type_label(f) for k, f in v.fields.items()},
    }
    if with_tensors:
        split = len(v.paths) > 1
        out["tensors"] = [
            {
                "name": safe_str(t.name),
                "type": t.type.name,
                "shape": list(t.shape),
                "offset": t.offset,
                "file_offset": t.data_offset,
                "nbytes": t.nbytes,
                "n_elements": t.n_elements,
                **({"shard": v.shards[i]} if split else {}),
            }
            for i, t in enumerate(v.tensors)
        ]
    return out


def to_json(src: Source, *, tensors: bool = True, indent: int | None = None) -> str:
    """The dump as strict JSON: an object with ``metadata`` (key -> value, arrays complete),
    ``metadata_types`` (key -> type such as ``UINT32`` or ``[STRING]``), ``tensors`` (list of
    ``{name, type, shape (ggml order), offset, file_offset, nbytes, n_elements[, shard]}``
    (``shard``: 0-based, as ``split.no``; only for split models),
    omitted when ``tensors=False``), and ``file``, ``shards``, ``version``, ``alignment``,
    ``data_offset``, ``architecture``, ``file_type``, ``file_type_name``, ``n_params``,
    ``n_tensors``, ``n_kv``. ASCII-only output (``\\uXXXX`` escapes)."""
    return json.dumps(to_dict(src, tensors=tensors), indent=indent, allow_nan=False)


__all__ = [
    "dump_lines",
    "dump_text",
    "format_params",
    "format_value",
    "n_params",
    "safe_str",
    "to_dict",
    "to_json",
    "type_label",
]
