"""Quantize GGUF models: llama.cpp's presets, per-tensor type policy and file writer.

>>> from llamacpy.quantize import QuantizeParams, parse_preset, quantize_model  # doctest: +SKIP
>>> p = parse_preset("Q4_K_M")
>>> quantize_model("model-f16.gguf", "model-q4_k_m.gguf", QuantizeParams(p.ftype))

:mod:`.presets` names the file types, :mod:`.policy` picks each tensor's type exactly as
``llama-quantize`` does, :mod:`.imatrix` reads importance matrices, :mod:`.model` plans and
checks the job, :mod:`.convert` converts tensor data on a thread pool and :mod:`.output`
writes the file.
"""

from .convert import TensorJob, convert_tensor
from .imatrix import ImportanceMatrix, load_imatrix
from .model import (
    KVOverride,
    QuantizeParams,
    QuantizeReport,
    QuantPlan,
    plan_quantization,
    quantize_model,
)
from .policy import (
    Category,
    ModelInfo,
    TensorSpec,
    TypeOptions,
    allows_quantization,
    choose_types,
    loader_order,
    tensor_category,
)
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
