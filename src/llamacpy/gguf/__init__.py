"""The GGUF file format: constants, a strict zero-copy reader, an atomic streaming writer."""

from .constants import (
    GGML_BLOCK_SIZES,
    GGMLType,
    GGUFValueType,
    LlamaFileType,
    file_type_name,
    ggml_type_name,
)
from .reader import Field, GGUFReader, TensorInfo
from .writer import GGUFWriter, copy_to_writer

__all__ = [
    "GGML_BLOCK_SIZES",
    "Field",
    "GGMLType",
    "GGUFReader",
    "GGUFValueType",
    "GGUFWriter",
    "LlamaFileType",
    "TensorInfo",
    "copy_to_writer",
    "file_type_name",
    "ggml_type_name",
]
