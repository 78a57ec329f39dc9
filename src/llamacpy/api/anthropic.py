"""Anthropic's Messages API on the chat engine: a ``/v1/messages`` request becomes an
OpenAI-style chat request (as llama-server converts it), and the chat reply (content,
reasoning, tool calls) becomes a Message with ``text``, ``thinking`` and ``tool_use``
blocks, whole or as Anthropic's stream events.

Request mapping: ``system`` (a string or text blocks) is the system message; a user's
``tool_result`` blocks become ``tool`` messages (before the user's other blocks), an
assistant's ``tool_use`` blocks its ``tool_calls`` and its ``thinking`` blocks its
``reasoning_content``; ``max_tokens`` (required), ``stop_sequences``, ``temperature``,
``top_p``, ``top_k``, ``stream``; ``tools`` (``name``, ``description``, ``input_schema``)
and ``tool_choice`` (``auto``, ``any`` = required, ``tool`` = a named one, ``none``;
``disable_parallel_tool_use``); ``thinking`` (``enabled`` with ``budget_tokens``: the
reasoning budget; ``disabled``: thinking off); ``output_config`` (``format``: a JSON schema
the reply is held to by a grammar; ``effort``). Images and documents are refused by name.
``temperature``, ``top_p`` and ``top_k`` are read when sent (current clients send them as
extra body fields).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from typing import Any

from ..errors import UsageError

STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use"}
_BLOCKS = ("text", "image", "document", "tool_use", "tool_result", "thinking",
           "redacted_thinking")  # fmt: skip


class AnthropicRequestError(UsageError):
    """A Messages request that cannot be served (the message names the field)."""


def _fail(msg: str) -> AnthropicRequestError:
    return AnthropicRequestError(msg)


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    """A message's content as a list of blocks (a string is one text block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise _fail(f"{where}.content must be a string or an array of content blocks")
    for i, b in enumerate(content):
        t = b.get("type") if isinstance(b, dict) else None
        if t not in _BLOCKS:
            raise _fail(f"{where}.content[{i}].type must be one of {', '.join(_BLOCKS)}"
                        f", not {t!r}")  # fmt: skip
        if t in ("image", "document"):
            raise _fail(f"{where}.content[{i}]: {t} blocks are not supported by this server")
    return content


def _text_of(block: dict[str, Any], where: str, key: str = "text") -> str:
    v = block.get(key)
    if not isinstance(v, str):
        raise _fail(f"{where}.{key} must be a string")
    return v


def _system(system: Any) -> str | None:
    if system is None:
        return None
    blocks = _blocks(system, "system")
    return "\n".join(_text_of(b, f"system[{i}]") for i, b in enumerate(blocks)
                     if b["type"] == "text")  # fmt: skip


def _tool_result(b: dict[str, Any], where: str) -> dict[str, Any]:
    tid = b.get("tool_use_id")
    if not isinstance(tid, str) or not tid:
        raise _fail(f"{where}.tool_use_id must be a non-empty string")
    content = b.get("content", "")
    if isinstance(content, list):
        content = "\n".join(_text_of(c, f"{where}.content[{j}]")
                            for j, c in enumerate(_blocks(content, where))
                            if c["type"] == "text")  # fmt: skip
    elif not isinstance(content, str):
        raise _fail(f"{where}.content must be a string or an array of text blocks")
    if b.get("is_error"):
        content = f"Error: {content}"
    return {"role": "tool", "tool_call_id": tid, "content": content}


def _tool_use(b: dict[str, Any], where: str) -> dict[str, Any]:
    tid, name, args = b.get("id"), b.get("name"), b.get("input", {})
    if not isinstance(tid, str) or not isinstance(name, str) or not name:
        raise _fail(f"{where} must have a string 'id' and a non-empty string 'name'")
    if not isinstance(args, dict):
        raise _fail(f"{where}.input must be an object")
    fn = {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}
    return {"id": tid, "type": "function", "function": fn}


def _messages(msgs: Any) -> list[dict[str, Any]]:
    if not isinstance(msgs, list) or not msgs:
        raise _fail("'messages' must be a non-empty array of messages")
    out: list[dict[str, Any]] = []
    for i, m in enumerate(msgs):
        where = f"messages[{i}]"
        role = m.get("role") if isinstance(m, dict) else None
        if role not in ("user", "assistant"):
            raise _fail(f"{where}.role must be 'user' or 'assistant', not {role!r}")
        blocks = _blocks(m.get("content"), where)
        text, calls, thinking = [], [], []
        for j, b in enumerate(blocks):
            w, t = f"{where}.content[{j}]", b["type"]
            if t == "text":
                text.append(_text_of(b, w))
            elif t == "tool_result" and role == "user":
                out.append(_tool_result(b, w))
            elif t == "tool_use" and role == "assistant":
                calls.append(_tool_use(b, w))
            elif t == "thinking" and role == "assistant":
                thinking.append(_text_of(b, w, "thinking"))
            elif t != "redacted_thinking":
                raise _fail(f"{w}: a {t} block cannot be in a {role} message")
        if role == "user" and not text:
            continue
        msg: dict[str, Any] = {"role": role, "content": "".join(text)}
        if thinking:
            msg["reasoning_content"] = "".join(thinking)
        if calls:
            msg["tool_calls"] = calls
        out.append(msg)
    return out


def _tools(tools: Any) -> list[dict[str, Any]]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise _fail("'tools' must be an array")
    out = []
    for i, t in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise _fail(f"{where} must be an object with a string 'name'")
        if t.get("type") not in (None, "custom"):
            raise _fail(f"{where}: server tools ({t.get('type')!r}) are not supported")
        schema = t.get("input_schema", {"type": "object"})
        if not isinstance(schema, dict):
            raise _fail(f"{where}.input_schema must be an object")
        fn = {"name": t["name"], "parameters": schema}
        if isinstance(t.get("description"), str):
            fn["description"] = t["description"]
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: Any, body: dict[str, Any]) -> None:
    if choice is None:
        return
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind not in ("auto", "any", "tool", "none"):
        raise _fail("tool_choice.type must be one of auto, any, tool, none")
    if kind == "tool":
        name = choice.get("name")
        if not isinstance(name, str) or not name:
            raise _fail("tool_choice.name must name a tool when tool_choice.type is 'tool'")
        body["tool_choice"] = {"type": "function", "function": {"name": name}}
    else:
        body["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[kind]
    if choice.get("disable_parallel_tool_use") is True:
        body["parallel_tool_calls"] = False


def _thinking(thinking: Any, body: dict[str, Any]) -> None:
    if thinking is None:
        return
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    if kind == "disabled":
        body["chat_template_kwargs"] = {"enable_thinking": False}
    elif kind == "enabled":
        budget = thinking.get("budget_tokens")
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
            raise _fail("thinking.budget_tokens must be a non-negative integer")
        body["thinking_budget_tokens"] = budget
    elif kind != "adaptive":
        raise _fail("thinking.type must be 'enabled', 'disabled' or 'adaptive'")


def chat_request(data: dict[str, Any], *, require_max_tokens: bool = True) -> dict[str, Any]:
    """The OpenAI-style chat request of a Messages request (raises
    :class:`AnthropicRequestError` naming the field that is wrong)."""
    if not isinstance(data, dict):
        raise _fail("the request body must be a JSON object")
    messages = _messages(data.get("messages"))
    system = _system(data.get("system"))
    if system:
        messages.insert(0, {"role": "system", "content": system})
    body: dict[str, Any] = {"messages": messages}
    mt = data.get("max_tokens")
    if mt is not None or require_max_tokens:
        if isinstance(mt, bool) or not isinstance(mt, int) or mt < 1:
            raise _fail("'max_tokens' is required and must be a positive integer")
        body["max_tokens"] = mt
    stops = data.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise _fail("'stop_sequences' must be an array of strings")
        body["stop"] = stops
    for key in ("temperature", "top_p", "top_k", "stream", "model"):
        if key in data:
            body[key] = data[key]
    tools = _tools(data.get("tools"))
    if tools:
        body["tools"] = tools
    _tool_choice(data.get("tool_choice"), body)
    _thinking(data.get("thinking"), body)
    _output_config(data.get("output_config"), body)
    return body


def _output_config(oc: Any, body: dict[str, Any]) -> None:
    """``output_config``: ``format`` (a JSON schema the reply must follow) and ``effort``."""
    if oc is None:
        return
    if not isinstance(oc, dict):
        raise _fail("'output_config' must be an object")
    fmt = oc.get("format")
    if fmt is not None:
        if (not isinstance(fmt, dict) or fmt.get("type") != "json_schema"
                or not isinstance(fmt.get("schema"), dict)):  # fmt: skip
            raise _fail("output_config.format must be {'type': 'json_schema', 'schema': {...}}")
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": fmt["schema"]},
        }
    effort = oc.get("effort")
    if effort is not None:
        if not isinstance(effort, str):
            raise _fail("output_config.effort must be a string")
        body["reasoning_effort"] = effort


def new_message_id() -> str:
    return "msg_" + uuid.uuid4().hex[:24]


def stop_reason(finish: str, stopping_word: str) -> tuple[str, str | None]:
    """``(stop_reason, stop_sequence)`` of a chat finish reason."""
    if finish == "stop" and stopping_word:
        return "stop_sequence", stopping_word
    return STOP_REASONS.get(finish, "end_turn"), None


def _input(arguments: str) -> dict[str, Any]:
    try:
        v = json.loads(arguments) if arguments else {}
    except ValueError:
        return {}
    return v if isinstance(v, dict) else {}


def content_blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A chat reply ``message`` as Messages content blocks (thinking, text, tool uses)."""
    blocks: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        blocks.append({"type": "thinking", "thinking": message["reasoning_content"],
                       "signature": ""})  # fmt: skip
    if message.get("content"):
        blocks.append({"type": "text", "text": message["content"]})
    for c in message.get("tool_calls") or []:
        fn = c["function"]
        blocks.append({"type": "tool_use", "id": c["id"], "name": fn["name"],
                       "input": _input(fn["arguments"])})  # fmt: skip
    return blocks


def message(msg_id: str, model: str, blocks: list[dict[str, Any]], reason: tuple[str, Any],
            n_prompt: int, n_predicted: int) -> dict[str, Any]:  # fmt: skip
    """A whole Messages response."""
    return {
        "id": msg_id, "type": "message", "role": "assistant", "model": model,
        "content": blocks, "stop_reason": reason[0], "stop_sequence": reason[1],
        "usage": {"input_tokens": n_prompt, "output_tokens": n_predicted},
    }  # fmt: skip


class MessageEvents:
    """Anthropic stream events of one reply, from the chat deltas of
    :class:`~llamacpy.api.tool_calls.ReplyStream`: a block is opened when its kind first
    appears (thinking, text, each tool use) and closed when another begins."""

    def __init__(self, msg_id: str, model: str) -> None:
        self.msg_id, self.model = msg_id, model
        self.index = -1
        self.open: str | None = None  # "thinking", "text", or "tool:<call index>"

    def start(self, n_prompt: int) -> list[tuple[str, dict[str, Any]]]:
        msg = message(self.msg_id, self.model, [], (None, None), n_prompt, 0)
        return [("message_start", {"type": "message_start", "message": msg})]

    def _begin(self, kind: str, block: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        out = self._close()
        self.index += 1
        self.open = kind
        out.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": self.index, "content_block": block},
            )
        )
        return out  # fmt: skip

    def _close(self) -> list[tuple[str, dict[str, Any]]]:
        if self.open is None:
            return []
        self.open = None
        return [("content_block_stop", {"type": "content_block_stop", "index": self.index})]

    def _delta(self, delta: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return ("content_block_delta", {"type": "content_block_delta", "index": self.index,
                                        "delta": delta})  # fmt: skip

    def deltas(self, deltas: Iterable[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
        out: list[tuple[str, dict[str, Any]]] = []
        for d in deltas:
            if d.get("reasoning_content"):
                if self.open != "thinking":
                    out += self._begin("thinking", {"type": "thinking", "thinking": "",
                                                    "signature": ""})  # fmt: skip
                out.append(self._delta({"type": "thinking_delta",
                                        "thinking": d["reasoning_content"]}))  # fmt: skip
            if d.get("content"):
                if self.open != "text":
                    out += self._begin("text", {"type": "text", "text": ""})
                out.append(self._delta({"type": "text_delta", "text": d["content"]}))
            for c in d.get("tool_calls") or []:
                kind = f"tool:{c['index']}"
                if self.open != kind:
                    fn = c.get("function", {})
                    out += self._begin(
                        kind,
                        {
                            "type": "tool_use",
                            "id": c.get("id", ""),
                            "name": fn.get("name", ""),
                            "input": {},
                        },
                    )
                args = c.get("function", {}).get("arguments")
                if args:
                    out.append(self._delta({"type": "input_json_delta", "partial_json": args}))
        return out  # fmt: skip

    def end(self, reason: tuple[str, Any], n_predicted: int) -> list[tuple[str, dict[str, Any]]]:
        out = self._close()
        out.append(("message_delta", {
            "type": "message_delta",
            "delta": {"stop_reason": reason[0], "stop_sequence": reason[1]},
            "usage": {"output_tokens": n_predicted},
        }))  # fmt: skip
        out.append(("message_stop", {"type": "message_stop"}))
        return out
