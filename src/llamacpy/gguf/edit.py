"""Edit a GGUF file: set metadata keys, rename tensors.

Both read the input (memory-mapped), and write a new file atomically (temporary file, then
rename), so the output may be the input itself. Tensor data are streamed, never loaded.
These work on one file; for a split model, metadata lives in the first shard.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import GGUFError, UsageError
from .constants import GGML_MAX_NAME, INTEGER_RANGES, KEY_ALIGNMENT, GGUFValueType
from .reader import Field, GGUFReader
from .split import SPLIT_KEYS
from .writer import GGUFWriter, copy_to_writer

_T = GGUFValueType
# TYPE in KEY=TYPE:VALUE -> value type; None means "integer/float, width from the existing key"
TYPE_NAMES: dict[str, GGUFValueType | None] = {
    "int": None,
    "float": None,
    "bool": _T.BOOL,
    "str": _T.STRING,
    "string": _T.STRING,
    "u8": _T.UINT8,
    "uint8": _T.UINT8,
    "i8": _T.INT8,
    "int8": _T.INT8,
    "u16": _T.UINT16,
    "uint16": _T.UINT16,
    "i16": _T.INT16,
    "int16": _T.INT16,
    "u32": _T.UINT32,
    "uint32": _T.UINT32,
    "i32": _T.INT32,
    "int32": _T.INT32,
    "u64": _T.UINT64,
    "uint64": _T.UINT64,
    "i64": _T.INT64,
    "int64": _T.INT64,
    "f32": _T.FLOAT32,
    "float32": _T.FLOAT32,
    "f64": _T.FLOAT64,
    "float64": _T.FLOAT64,
}
_FLOAT_TYPES = (_T.FLOAT32, _T.FLOAT64)
_F32_MAX = 3.4028234663852886e38
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


@dataclass(frozen=True)
class Assignment:
    """One parsed ``KEY=TYPE:VALUE``: the key, the type name as given, the raw value text."""

    text: str
    key: str
    type_name: str
    value: str


@dataclass(frozen=True)
class MetadataChange:
    """What :func:`set_metadata` did to one key (``old`` is None for a new key)."""

    key: str
    old: Field | None
    new: Field


def parse_assignment(text: str) -> Assignment:
    """Parse ``KEY=TYPE:VALUE`` (the value may contain ``=`` and ``:``)."""
    key, eq, rest = text.partition("=")
    key = key.strip()
    if not eq or not key:
        raise UsageError(
            f"bad assignment {text!r}: expected KEY=TYPE:VALUE, e.g. general.name=str:x"
        )
    type_name, colon, value = rest.partition(":")
    type_name = type_name.strip().lower()
    if not colon:
        raise UsageError(
            f"bad assignment {text!r}: missing TYPE: expected KEY=TYPE:VALUE with TYPE one of "
            "int, float, bool, str (or u8..u64, i8..i64, f32, f64)"
        )
    if type_name not in TYPE_NAMES:
        raise UsageError(
            f"bad assignment {text!r}: unknown type {type_name!r}; use int, float, bool, str, "
            "or an explicit width: u8, i8, u16, i16, u32, i32, u64, i64, f32, f64"
        )
    if any(c.isspace() for c in key) or not key.isprintable():
        raise UsageError(f"bad assignment {text!r}: the key must not contain whitespace")
    return Assignment(text, key, type_name, value)


def _parse_int(a: Assignment) -> int:
    s = a.value.strip()
    try:
        return int(s, 10)
    except ValueError:
        pass
    try:
        return int(s, 0)  # 0x.., 0o.., 0b..
    except ValueError:
        raise UsageError(f"bad assignment {a.text!r}: {a.value!r} is not an integer") from None


def _parse_float(a: Assignment) -> float:
    try:
        return float(a.value.strip())
    except ValueError:
        raise UsageError(f"bad assignment {a.text!r}: {a.value!r} is not a number") from None


def _check_int(a: Assignment, vtype: GGUFValueType, v: int, why: str = "") -> None:
    lo, hi = INTEGER_RANGES[vtype]
    if not lo <= v <= hi:
        raise UsageError(
            f"bad assignment {a.text!r}: {v} is out of range for {vtype.name} [{lo}, {hi}]{why}"
        )


def typed_value(a: Assignment, existing: Field | None = None) -> tuple[GGUFValueType, Any]:
    """The GGUF type and Python value an assignment stands for.

    ``int`` and ``float`` keep the type of an existing key of the same kind (an existing u32
    stays u32); for a new key ``int`` is INT32 (INT64/UINT64 when the value needs it) and
    ``float`` is FLOAT32.
    """
    explicit = TYPE_NAMES[a.type_name]
    old = existing.type if existing is not None else None
    if a.type_name == "int":
        v = _parse_int(a)
        if old in INTEGER_RANGES:
            _check_int(
                a,
                old,
                v,
                f" (the existing key {a.key!r} is {old.name}; give an explicit "
                "type such as i64: to change it)",
            )
            return old, v
        for t in (_T.INT32, _T.INT64, _T.UINT64):
            lo, hi = INTEGER_RANGES[t]
            if lo <= v <= hi:
                return t, v
        raise UsageError(f"bad assignment {a.text!r}: {v} does not fit in a 64-bit integer")
    if a.type_name == "float":
        vtype = old if old in _FLOAT_TYPES else _T.FLOAT32
        return vtype, _float_for(a, vtype, _parse_float(a))
    assert explicit is not None
    if explicit == _T.STRING:
        return explicit, a.value
    if explicit == _T.BOOL:
        s = a.value.strip().lower()
        if s in _TRUE:
            return explicit, True
        if s in _FALSE:
            return explicit, False
        raise UsageError(f"bad assignment {a.text!r}: {a.value!r} is not a bool (true/false/1/0)")
    if explicit in INTEGER_RANGES:
        v = _parse_int(a)
        _check_int(a, explicit, v)
        return explicit, v
    return explicit, _float_for(a, explicit, _parse_float(a))


def _float_for(a: Assignment, vtype: GGUFValueType, v: float) -> float:
    if vtype == _T.FLOAT32 and math.isfinite(v) and abs(v) > _F32_MAX:
        raise UsageError(f"bad assignment {a.text!r}: {v} is out of range for FLOAT32")
    return v


def _open_output_check(out_path: str | os.PathLike[str]) -> Path:
    out = Path(out_path)
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"output directory {parent} does not exist")
    if out.is_dir():
        raise UsageError(f"output {out} is a directory")
    return out


def set_metadata(
    in_path: str | os.PathLike[str],
    out_path: str | os.PathLike[str],
    assignments: Iterable[str],
) -> list[MetadataChange]:
    """Write ``in_path`` to ``out_path`` with metadata keys set; return what changed.

    Each assignment is ``KEY=TYPE:VALUE`` (TYPE: int, float, bool, str, or u8..u64, i8..i64,
    f32, f64). A replaced key keeps its position; new keys are appended. ``split.*`` keys
    cannot be set (use split/merge); ``general.alignment`` must be a power-of-two UINT32.
    """
    parsed = [parse_assignment(a) for a in assignments]
    if not parsed:
        raise UsageError("no assignments given: expected KEY=TYPE:VALUE ...")
    seen: dict[str, str] = {}
    for a in parsed:
        if a.key in seen:
            raise UsageError(f"key {a.key!r} is assigned twice: {seen[a.key]!r} and {a.text!r}")
        seen[a.key] = a.text
        if a.key in SPLIT_KEYS:
            raise UsageError(
                f"bad assignment {a.text!r}: split keys are managed by `gguf split`/`gguf merge`"
            )
    out = _open_output_check(out_path)
    changes: list[MetadataChange] = []
    with GGUFReader(in_path) as reader:
        w = copy_to_writer(reader, GGUFWriter(out, version=reader.version))
        for a in parsed:
            old = reader.fields.get(a.key)
            vtype, value = typed_value(a, old)
            if a.key == KEY_ALIGNMENT and (vtype != _T.UINT32 or value <= 0 or value & (value - 1)):
                raise UsageError(
                    f"bad assignment {a.text!r}: {KEY_ALIGNMENT} must be a power of two of type "
                    "UINT32 (u32:N)"
                )
            try:
                w.add(a.key, value, vtype)
            except (GGUFError, TypeError, ValueError, OverflowError) as e:
                raise UsageError(f"bad assignment {a.text!r}: {e}") from None
            changes.append(MetadataChange(a.key, old, w.fields[a.key]))
        w.write()
    return changes


def rename_tensors(
    in_path: str | os.PathLike[str],
    out_path: str | os.PathLike[str],
    pattern: str,
    replacement: str,
) -> list[tuple[str, str]]:
    """Rename tensors with ``re.sub(pattern, replacement, name)``; return ``(old, new)`` pairs.

    Only names the pattern matches are touched. Errors (nothing written): an invalid pattern
    or replacement, a pattern that matches no tensor name, and names that would become empty,
    too long (ggml allows < 64 bytes) or duplicated.
    """
    try:
        rx = re.compile(pattern)
    except re.error as e:
        raise UsageError(f"invalid regular expression {pattern!r}: {e}") from None
    out = _open_output_check(out_path)
    with GGUFReader(in_path) as reader:
        renames: list[tuple[str, str]] = []
        new_names: dict[str, str] = {}  # new name -> old name
        for t in reader.tensors:
            new = t.name
            if rx.search(t.name):
                try:
                    new = rx.sub(replacement, t.name)
                except (re.error, IndexError) as e:
                    raise UsageError(f"invalid replacement {replacement!r}: {e}") from None
                renames.append((t.name, new))
                if not new:
                    raise UsageError(f"renaming tensor {t.name!r} would give an empty name")
                n = len(new.encode("utf-8", errors="surrogateescape"))
                if n >= GGML_MAX_NAME:
                    raise UsageError(
                        f"renaming tensor {t.name!r} would give {new!r}, which is {n} bytes long; "
                        f"tensor names must be shorter than {GGML_MAX_NAME} bytes"
                    )
            if new in new_names:
                raise UsageError(
                    f"renaming would give two tensors the name {new!r} "
                    f"(from {new_names[new]!r} and {t.name!r})"
                )
            new_names[new] = t.name
        if not renames:
            raise UsageError(
                f"the pattern {pattern!r} matches no tensor name in {reader.path} "
                f"(e.g. {reader.tensors[0].name!r})"
                if reader.tensors
                else f"{reader.path} has no tensors to rename"
            )
        mapping = dict(renames)
        w = GGUFWriter(out, version=reader.version)
        for f in reader.fields.values():
            w.add_field(f)
        for t in reader.tensors:
            w.add_tensor(mapping.get(t.name, t.name), t.type, t.shape, lambda t=t: t.raw)
        w.write()
    return renames


__all__ = [
    "TYPE_NAMES",
    "Assignment",
    "MetadataChange",
    "parse_assignment",
    "rename_tensors",
    "set_metadata",
    "typed_value",
]
