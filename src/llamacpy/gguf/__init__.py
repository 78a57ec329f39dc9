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
from .split import GGUFModelFile, merge_gguf, shard_paths, split_gguf
from .writer import GGUFWriter, copy_to_writer

__all__ = [
    "GGML_BLOCK_SIZES",
    "Field",
    "GGMLType",
    "GGUFModelFile",
    "GGUFReader",
    "GGUFValueType",
    "GGUFWriter",
    "LlamaFileType",
    "TensorInfo",
    "copy_to_writer",
    "file_type_name",
    "ggml_type_name",
    "merge_gguf",
    "shard_paths",
    "split_gguf",
]
