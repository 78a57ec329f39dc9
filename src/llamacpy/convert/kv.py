"""The metadata of the file being converted: ordered keys with explicit GGUF types.

Adding a key that exists replaces its value and keeps its position (as gguf-py's writer
does, so the key order matches llama.cpp's converter).
"""

from __future__ import annotations

import string
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..gguf.constants import GGUFValueType as T

__all__ = ["KV", "KVEntry", "T"]

_NAME_CHARS = set(string.ascii_letters + string.digits)


@dataclass(frozen=True)
class KVEntry:
    key: str
    value: Any
    type: T
    elem_type: T | None = None


class KV:
    """Ordered GGUF metadata under construction."""

    def __init__(self, arch: str) -> None:
        self.arch = arch
        self._d: dict[str, KVEntry] = {}

    def add(self, key: str, value: Any, vtype: T, elem_type: T | None = None) -> None:
        key = key.replace("{arch}", self.arch)
        self._d[key] = KVEntry(key, value, vtype, elem_type)

    def add_arch(self, suffix: str, value: Any, vtype: T, elem_type: T | None = None) -> None:
        """``{arch}.SUFFIX``."""
        self.add(f"{self.arch}.{suffix}", value, vtype, elem_type)

    def add_count(self, suffix: str, value: int | Sequence[int]) -> None:
        """A per-model count that may also be a per-layer list (head counts, ff length)."""
        if isinstance(value, int):
            self.add_arch(suffix, value, T.UINT32)
        else:
            self.add_arch(suffix, list(value), T.ARRAY, T.INT32)

    def remove(self, key: str) -> None:
        self._d.pop(key, None)

    def add_chat_template(self, value: str | Sequence[Mapping[str, str]] | None) -> None:
        """A template string, or named templates (``default`` becomes the main one)."""
        if value is None:
            self.remove("tokenizer.chat_template")
            return
        if not isinstance(value, str):
            default = None
            names: list[str] = []
            for choice in value:
                name = "".join(c if c in _NAME_CHARS else "_" for c in choice.get("name", ""))
                template = choice.get("template")
                if not name or template is None:
                    continue
                if name == "default":
                    default = template
                else:
                    if name not in names:
                        names.append(name)
                    self.add(f"tokenizer.chat_template.{name}", template, T.STRING)
            if names:
                self.add("tokenizer.chat_templates", names, T.ARRAY, T.STRING)
            if default is None:
                return
            value = default
        self.add("tokenizer.chat_template", value, T.STRING)

    def get(self, key: str, default: Any = None) -> Any:
        e = self._d.get(key)
        return default if e is None else e.value

    def __contains__(self, key: object) -> bool:
        return key in self._d

    def __iter__(self) -> Iterator[KVEntry]:
        return iter(self._d.values())

    def __len__(self) -> int:
        return len(self._d)
