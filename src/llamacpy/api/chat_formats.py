"""Chat prompt formats for ``Llama.create_chat_completion``.

``chat_template.default`` (or ``chat_template.NAME``) renders the GGUF chat template in the
sandbox and stops at the EOS text, as llama-cpp-python's Jinja2 formatter does; ``chatml``
and ``llama-2`` reproduce llama-cpp-python's built-in formats of those names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import UsageError
from ..tokenizer import Tokenizer


@dataclass
class ChatPrompt:
    """A formatted conversation: the prompt tokens and the stop strings it implies."""

    tokens: list[int]
    stop: list[str] = field(default_factory=list)


def _system_message(messages: Sequence[Mapping[str, Any]]) -> str:
    for m in messages:
        if m["role"] == "system":
            return m.get("content") or ""
    return ""


def _map_roles(
    messages: Sequence[Mapping[str, Any]], roles: Mapping[str, str]
) -> list[tuple[str, str | None]]:
    out = []
    for m in messages:
        if m["role"] in roles:
            content = m.get("content")
            out.append((roles[m["role"]], content if isinstance(content, str) else None))
    return out


def _chatml(tok: Tokenizer, messages: Sequence[Mapping[str, Any]], **_: Any) -> ChatPrompt:
    system = "<|im_start|>system\n" + _system_message(messages)
    roles = {"user": "<|im_start|>user", "assistant": "<|im_start|>assistant"}
    sep = "<|im_end|>"
    turns = [*_map_roles(messages, roles), (roles["assistant"], None)]
    text = system + sep + "\n"
    for role, msg in turns:
        text += f"{role}\n{msg}{sep}\n" if msg else f"{role}\n"
    return ChatPrompt(tok.encode(text, add_special=True, parse_special=True), [sep])


def _llama2(tok: Tokenizer, messages: Sequence[Mapping[str, Any]], **_: Any) -> ChatPrompt:
    roles = {"user": "<s>[INST]", "assistant": "[/INST]"}
    turns = _map_roles(messages, roles)
    system = _system_message(messages)
    if system:
        system = f"[INST] <<SYS>>\n{system}\n<</SYS>>"
    seps = [" ", "</s>"]
    text = system + seps[0]
    for i, (role, msg) in enumerate(turns):
        if system and i == 0:
            text += (msg or "") + seps[i % 2]
        elif msg:
            text += role + msg + " " + seps[i % 2]
        else:
            text += role + " "
    text += "[/INST]"
    return ChatPrompt(tok.encode(text, add_special=True, parse_special=True))


def _template(name: str) -> Callable[..., ChatPrompt]:
    def fmt(
        tok: Tokenizer,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        **_: Any,
    ) -> ChatPrompt:
        template = tok.chat_template(name)
        text = template.apply(list(messages), tools=tools)
        ids = tok.encode(text, add_special=True, parse_special=True)
        return ChatPrompt(ids, [template.eos_token] if template.eos_token else [])

    return fmt


BUILTIN_FORMATS: dict[str, Callable[..., ChatPrompt]] = {"chatml": _chatml, "llama-2": _llama2}


def available_formats(tok: Tokenizer) -> list[str]:
    """Format names usable with this model (GGUF templates first)."""
    names = [f"chat_template.{n}" if n else "chat_template.default" for n in tok.chat_templates]
    return names + list(BUILTIN_FORMATS)


def default_format(tok: Tokenizer) -> str:
    """llama-cpp-python's choice: the GGUF template when there is one, else llama-2."""
    return "chat_template.default" if "" in tok.chat_templates else "llama-2"


def format_chat(
    name: str,
    tok: Tokenizer,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> ChatPrompt:
    """Format ``messages`` with the chat format ``name``."""
    if not isinstance(messages, Sequence) or not all(
        isinstance(m, Mapping) and "role" in m for m in messages
    ):
        raise UsageError("messages must be a list of {'role': ..., 'content': ...} dicts")
    if name.startswith("chat_template."):
        key = name.removeprefix("chat_template.")
        key = "" if key == "default" else key
        if key not in tok.chat_templates:
            raise UsageError(
                f"the model has no chat template {name!r}; available formats: "
                + ", ".join(available_formats(tok))
            )
        return _template(key)(tok, messages, tools=tools)
    if name not in BUILTIN_FORMATS:
        raise UsageError(
            f"unknown chat format {name!r}; available: {', '.join(available_formats(tok))}"
        )
    return BUILTIN_FORMATS[name](tok, messages, tools=tools)
