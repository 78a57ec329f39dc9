"""Errors raised by the tokenizer and chat-template code (all are LlamacpyError)."""

from __future__ import annotations

from ..errors import LlamacpyError


class TokenizerError(LlamacpyError):
    """The vocabulary metadata is unusable, or a text/ids argument cannot be processed."""


class UnknownPreTokenizerError(TokenizerError):
    """``tokenizer.ggml.pre`` names a pre-tokenizer llama.cpp does not know."""


class ChatTemplateError(LlamacpyError):
    """A chat template failed to parse or render, or hit a sandbox limit."""


class ChatTemplateLimitError(ChatTemplateError):
    """A chat template exceeded the time, output-size or recursion limit."""
