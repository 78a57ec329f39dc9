"""Typed errors. Every error a user can cause derives from :class:`LlamacpyError`.

The CLI prints ``str(err)`` on one line and exits non-zero; it never shows a traceback
for these. Messages name the problem and where it is (file, key, tensor, byte offset).
"""

from __future__ import annotations


class LlamacpyError(Exception):
    """Base class of every error llamacpy raises on bad input or bad state."""


class GGUFError(LlamacpyError):
    """A GGUF file is malformed, truncated, or uses something we cannot read.

    Attributes are optional context; ``str()`` already contains all of them.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        offset: int | None = None,
        key: str | None = None,
        tensor: str | None = None,
    ) -> None:
        self.message = message
        self.path = path
        self.offset = offset
        self.key = key
        self.tensor = tensor
        super().__init__(self._format())

    def _format(self) -> str:
        where = []
        if self.key is not None:
            where.append(f"key {self.key!r}")
        if self.tensor is not None:
            where.append(f"tensor {self.tensor!r}")
        if self.offset is not None:
            where.append(f"at byte offset {self.offset}")
        prefix = f"{self.path}: " if self.path else ""
        suffix = f" ({', '.join(where)})" if where else ""
        return f"{prefix}{self.message}{suffix}"


class ModelError(LlamacpyError):
    """A GGUF file is well-formed but is not a model we can run (missing or inconsistent keys)."""


class RegistryError(LlamacpyError):
    """A named model is unknown, or could not be fetched, assembled or verified."""


class UsageError(LlamacpyError):
    """A command-line or API argument is invalid."""


class LogitsFileError(LlamacpyError):
    """A log-probabilities file (llama-perplexity's ``--kl-divergence-base``) is malformed,
    truncated, or does not fit the model; ``str()`` names the file, the field and the byte
    offset."""

    def __init__(self, message: str, *, path: str, field: str, offset: int) -> None:
        self.message, self.path, self.field, self.offset = message, path, field, offset
        super().__init__(f"{path}: {message} (field {field}, at byte offset {offset})")
