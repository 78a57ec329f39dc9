"""Architecture converters, looked up by the Hugging Face architecture name."""

from __future__ import annotations

from .base import Lazy, Planned, TextArch
from .bert import Bert
from .gemma import Gemma3
from .llama import Llama
from .phi3 import Phi3
from .qwen import Qwen2, Qwen3

ARCHS: tuple[type[TextArch], ...] = (Llama, Qwen2, Qwen3, Gemma3, Phi3, Bert)
BY_HF_NAME: dict[str, type[TextArch]] = {n: a for a in ARCHS for n in a.hf_architectures}

__all__ = ["ARCHS", "BY_HF_NAME", "Lazy", "Planned", "TextArch"]
