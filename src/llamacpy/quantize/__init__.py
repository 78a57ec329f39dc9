"""Quantize GGUF models: llama.cpp's presets, per-tensor type policy and file writer.

>>> from llamacpy.quantize import QuantizeParams, parse_preset, quantize_model  # doctest: +SKIP
>>> p = parse_preset("Q4_K_M")
>>> quantize_model("model-f16.gguf", "model-q4_k_m.gguf", QuantizeParams(p.ftype))

:mod:`.presets` names the file types, :mod:`.policy` picks each tensor's type exactly as
``llama-quantize`` does, :mod:`.imatrix` reads importance matrices, :mod:`.model` plans and
checks the job, :mod:`.convert` converts tensor data on a thread pool and :mod:`.output`
writes the file.
"""

from __future__ import annotations

import importlib
from typing import Any

from .presets import PRESETS, Preset, default_type, ggml_name, parse_ggml_type, parse_preset

__all__ = [
    "PRESETS",
    "Category",
    "ImportanceMatrix",
    "KVOverride",
    "ModelInfo",
    "Preset",
    "QuantPlan",
    "QuantizeParams",
    "QuantizeReport",
    "TensorJob",
    "TensorSpec",
    "TypeOptions",
    "allows_quantization",
    "choose_types",
    "convert_tensor",
    "default_type",
    "ggml_name",
    "load_imatrix",
    "loader_order",
    "parse_ggml_type",
    "parse_preset",
    "plan_quantization",
    "quantize_model",
    "tensor_category",
]

# the rest is imported on first use: the presets (all the CLI's help needs) stay cheap,
# without loading numba and the format kernels
_LAZY = {
    "TensorJob": "convert", "convert_tensor": "convert",
    "ImportanceMatrix": "imatrix", "load_imatrix": "imatrix",
    "KVOverride": "model", "QuantizeParams": "model", "QuantizeReport": "model",
    "QuantPlan": "model", "plan_quantization": "model", "quantize_model": "model",
    "Category": "policy", "ModelInfo": "policy", "TensorSpec": "policy",
    "TypeOptions": "policy", "allows_quantization": "policy", "choose_types": "policy",
    "loader_order": "policy", "tensor_category": "policy",
}  # fmt: skip


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
