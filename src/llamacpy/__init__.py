"""llamacpy: llama.cpp's engine, formats and tools in Python.

>>> from llamacpy import Llama                                     # doctest: +SKIP
>>> llm = Llama("smollm2-135m")                                    # doctest: +SKIP
>>> llm("The capital of France is", max_tokens=8)["choices"][0]["text"]  # doctest: +SKIP
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

from ._lazy import DeferredModule

__version__ = "0.1.0"
__all__ = ["Llama", "LlamaGrammar", "__version__"]


def _defer_yaml() -> None:
    """numba imports ``yaml`` at start-up only in case a ``.numba_config.yaml`` exists:
    ~13 ms of every start, mostly one regular expression compiled. A stand-in defers it
    to the first use (``convert``'s model cards, or numba finding that file)."""
    spec = None if "yaml" in sys.modules else importlib.util.find_spec("yaml")
    if spec is not None:
        stand_in = DeferredModule("yaml")
        stand_in.__spec__ = spec
        sys.modules["yaml"] = stand_in


_defer_yaml()


def __getattr__(name: str) -> Any:
    # imported on first use: `import llamacpy` stays cheap for the tools that don't need numba
    if name in ("Llama", "LlamaGrammar"):
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'llamacpy' has no attribute {name!r}")
