"""Hugging Face checkpoints (safetensors) to GGUF, as llama.cpp's ``convert_hf_to_gguf.py``.

>>> from llamacpy.convert import ConvertOptions, convert          # doctest: +SKIP
>>> result = convert(ConvertOptions(Path("Llama-3.2-1B"), outtype="q8_0"))  # doctest: +SKIP
>>> result.paths                                                  # doctest: +SKIP

No torch/transformers at run time: safetensors are memory-mapped with numpy, SentencePiece
models parsed with a small protobuf reader, tokenizer files read as JSON, and the BPE
pre-tokenizer identified with llamacpy's own tokenizer.
"""

from __future__ import annotations

from .common import ConvertError
from .convert import ConvertOptions, ConvertResult, convert, supported_architectures
from .plan import OUTTYPES

__all__ = [
    "OUTTYPES",
    "ConvertError",
    "ConvertOptions",
    "ConvertResult",
    "convert",
    "supported_architectures",
]
