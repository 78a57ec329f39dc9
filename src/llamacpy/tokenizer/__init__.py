"""Tokenizers exactly as llama.cpp: SPM, BPE (every pre-tokenizer), WPM and UGM, built only
from GGUF metadata; streaming detokenization; sandboxed chat templates rendered the way
llama-server (``--jinja``) renders them.

>>> tok = Tokenizer.from_gguf("model.gguf")     # doctest: +SKIP
>>> ids = tok.encode("Hello world")             # doctest: +SKIP
>>> tok.decode(ids)                             # doctest: +SKIP
>>> tok.chat_template().apply([{"role": "user", "content": "Hi"}])  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from .. import kernel_cache  # noqa: F401  (first: the kernels' disk cache locator)
from .detok import StreamDecoder
from .errors import (
    ChatTemplateError,
    ChatTemplateLimitError,
    TokenizerError,
    UnknownPreTokenizerError,
)
from .tokenizer import Tokenizer
from .vocab import Vocab

__all__ = [
    "Caps",
    "ChatTemplate",
    "ChatTemplateError",
    "ChatTemplateLimitError",
    "Limits",
    "StreamDecoder",
    "Tokenizer",
    "TokenizerError",
    "UnknownPreTokenizerError",
    "Vocab",
]


def __getattr__(name: str) -> Any:
    # the chat-template side (jinja2) is imported on first use
    if name in ("Caps", "ChatTemplate", "Limits"):
        from . import chat

        return getattr(chat, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
