"""Shared pieces of the converter: its error type and careful readers of a checkpoint's files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import LlamacpyError


class ConvertError(LlamacpyError):
    """A checkpoint cannot be converted: unsupported, incomplete or inconsistent input."""


def read_json(path: Path, *, what: str = "") -> Any:
    """Parse a JSON file, naming the file (and what it is for) in any error."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise ConvertError(f"{path}: file not found{f' ({what})' if what else ''}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConvertError(f"{path}: not valid JSON: {e}") from None


def read_json_if_exists(path: Path) -> Any:
    """Like :func:`read_json`, or None when the file does not exist."""
    return read_json(path) if path.is_file() else None


def find_key(d: dict[str, Any], keys: list[str] | tuple[str, ...], default: Any = None) -> Any:
    """The value of the first of ``keys`` present in ``d`` (convert_hf_to_gguf's find_hparam)."""
    for k in keys:
        if k in d:
            return d[k]
    return default
