"""llamacpy: llama.cpp's engine, formats and tools in Python.

>>> from llamacpy import Llama                                     # doctest: +SKIP
>>> llm = Llama("smollm2-135m")                                    # doctest: +SKIP
>>> llm("The capital of France is", max_tokens=8)["choices"][0]["text"]  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["Llama", "LlamaGrammar", "__version__"]


def __getattr__(name: str) -> Any:
    # imported on first use: `import llamacpy` stays cheap for the tools that don't need numba
    if name in ("Llama", "LlamaGrammar"):
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'llamacpy' has no attribute {name!r}")
