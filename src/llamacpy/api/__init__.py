"""L5: the public ``Llama`` facade (llama-cpp-python's high-level API) and the completion
loop it shares with the CLI and the server.

>>> from llamacpy.api import Llama                                  # doctest: +SKIP
>>> llm = Llama("smollm2-135m", n_ctx=512, verbose=False)            # doctest: +SKIP
>>> llm("Q: Name the planets in the solar system? A: ", max_tokens=32, stop=["Q:", "\\n"])
... # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_names

_NAMES = {
    "ContextOverflowError": "generation",
    "Generation": "generation",
    "GenerationConfig": "generation",
    "NotSupportedError": "generation",
    "Session": "generation",
    "Step": "generation",
    "StopMatcher": "generation",
    "Timings": "generation",
    "Llama": "llama",
    "LlamaGrammar": "grammar",
    "LogitsProcessorList": "llama",
    "StoppingCriteriaList": "llama",
    "llama_cpp_sampler": "llama",
    "LoadedModel": "model",
    "ModelInfo": "model",
    "load_model": "model",
    "LlamaState": "state",
    "LlamaPromptLookupDecoding": "speculative",
    "Speculator": "speculative",
}

__all__ = [
    "ContextOverflowError",
    "Generation",
    "GenerationConfig",
    "Llama",
    "LlamaGrammar",
    "LlamaPromptLookupDecoding",
    "LlamaState",
    "LoadedModel",
    "LogitsProcessorList",
    "ModelInfo",
    "NotSupportedError",
    "Session",
    "Speculator",
    "Step",
    "StopMatcher",
    "StoppingCriteriaList",
    "Timings",
    "llama_cpp_sampler",
    "load_model",
]


__getattr__, __dir__ = lazy_names(__name__, _NAMES)


if TYPE_CHECKING:
    from .generation import (
        ContextOverflowError,
        Generation,
        GenerationConfig,
        NotSupportedError,
        Session,
        Step,
        StopMatcher,
        Timings,
    )
    from .grammar import LlamaGrammar
    from .llama import Llama, LogitsProcessorList, StoppingCriteriaList, llama_cpp_sampler
    from .model import LoadedModel, ModelInfo, load_model
    from .speculative import LlamaPromptLookupDecoding, Speculator
    from .state import LlamaState
