"""L5: the public ``Llama`` facade (llama-cpp-python's high-level API) and the completion
loop it shares with the CLI and the server.

>>> from llamacpy.api import Llama                                  # doctest: +SKIP
>>> llm = Llama("smollm2-135m", n_ctx=512, verbose=False)            # doctest: +SKIP
>>> llm("Q: Name the planets in the solar system? A: ", max_tokens=32, stop=["Q:", "\\n"])
... # doctest: +SKIP
"""

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
from .llama import Llama, LogitsProcessorList, StoppingCriteriaList, llama_cpp_sampler
from .model import LoadedModel, ModelInfo, load_model
from .state import LlamaState

__all__ = [
    "ContextOverflowError",
    "Generation",
    "GenerationConfig",
    "Llama",
    "LlamaState",
    "LoadedModel",
    "LogitsProcessorList",
    "ModelInfo",
    "NotSupportedError",
    "Session",
    "Step",
    "StopMatcher",
    "StoppingCriteriaList",
    "Timings",
    "llama_cpp_sampler",
    "load_model",
]
