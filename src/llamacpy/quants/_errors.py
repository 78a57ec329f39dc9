"""Errors of the quant layer."""

from __future__ import annotations

from llamacpy.errors import LlamacpyError


class QuantError(LlamacpyError):
    """Data cannot be (de)quantized as asked: wrong length, shape or importance matrix."""


class UnsupportedQuantTypeError(QuantError):
    """A ggml tensor type that :mod:`llamacpy.quants` has no (de)quantizer for."""

    def __init__(self, ggml_type: object, *, tensor: str | None = None, what: str = "") -> None:
        self.ggml_type = ggml_type
        self.tensor = tensor
        name = getattr(ggml_type, "name", None)
        desc = f"ggml type {name}" if name else f"unknown ggml type {ggml_type!r}"
        where = f" (tensor {tensor!r})" if tensor is not None else ""
        what = f" {what}" if what else ""
        super().__init__(f"{desc} is not supported{what} by llamacpy.quants{where}")
