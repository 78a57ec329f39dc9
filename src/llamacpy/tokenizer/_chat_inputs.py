"""Chat request inputs as llama.cpp prepares them for a template.

``parse_messages`` / ``parse_tools`` validate an OpenAI-style request like
``common_chat_msgs_parse_oaicompat`` / ``common_chat_tools_parse_oaicompat``;
``prepare_messages`` turns the parsed messages into the JSON a template sees
(``to_json_oaicompat``, content normalization per the template's capabilities, and the
workarounds of ``common_chat_templates_apply_jinja`` and its specialized handlers).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import ChatTemplateError


@dataclass
class ToolCall:
    name: str
    arguments: str
    id: str = ""


@dataclass
class Message:
    role: str
    content: str = ""
    parts: list[tuple[str, str]] = field(default_factory=list)  # (type, text)
    tool_calls: list[ToolCall] = field(default_factory=list)
    reasoning_content: str = ""
    tool_name: str = ""
    tool_call_id: str = ""


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ChatTemplateError(
            f"failed to parse messages: {what} must be a string, got {_dump(value)}"
        )
    return value


def parse_messages(messages: Sequence[Mapping[str, Any]]) -> list[Message]:
    if not isinstance(messages, Sequence) or isinstance(messages, str | bytes):
        raise ChatTemplateError("failed to parse messages: expected 'messages' to be an array")
    out = []
    for m in messages:
        if not isinstance(m, Mapping):
            raise ChatTemplateError(f"failed to parse messages: expected an object, got {m!r}")
        if "role" not in m:
            raise ChatTemplateError(
                f"failed to parse messages: missing 'role' in message: {_dump(m)}"
            )
        role = _str(m["role"], "role")
        if role != "assistant" and "content" not in m:
            raise ChatTemplateError("all non-assistant messages must contain 'content'")
        if role == "assistant" and "content" not in m and "tool_calls" not in m:
            raise ChatTemplateError(
                "assistant message must contain either 'content' or 'tool_calls'"
            )
        msg = Message(role=role)
        content = m.get("content")
        if isinstance(content, str):
            msg.content = content
        elif isinstance(content, list):
            for part in content:
                if not isinstance(part, Mapping) or "type" not in part:
                    raise ChatTemplateError(
                        f"failed to parse messages: missing content part type: {part!r}"
                    )
                if part["type"] not in ("text", "media_marker"):
                    raise ChatTemplateError(
                        f"failed to parse messages: unsupported content part type: {part['type']!r}"
                    )
                msg.parts.append((part["type"], _str(part.get("text"), "content part text")))
        elif content is not None:
            raise ChatTemplateError(
                "failed to parse messages: invalid 'content' type: expected string or array"
            )
        for tc in m.get("tool_calls") or []:
            if not isinstance(tc, Mapping) or tc.get("type") != "function" or "function" not in tc:
                raise ChatTemplateError(f"failed to parse messages: unsupported tool call: {tc!r}")
            fn = tc["function"]
            if "name" not in fn:
                raise ChatTemplateError(f"failed to parse messages: missing tool call name: {tc!r}")
            args = fn.get("arguments")
            args = args if isinstance(args, str) else _dump(args)
            msg.tool_calls.append(
                ToolCall(_str(fn["name"], "tool name"), args, str(tc.get("id", "")))
            )
        if "reasoning_content" in m and m["reasoning_content"] is not None:
            msg.reasoning_content = _str(m["reasoning_content"], "reasoning_content")
        if "name" in m:
            msg.tool_name = _str(m["name"], "name")
        if "tool_call_id" in m:
            msg.tool_call_id = _str(m["tool_call_id"], "tool_call_id")
        out.append(msg)
    return out


def parse_tools(tools: Sequence[Mapping[str, Any]] | None) -> list[dict] | None:
    """Tools as llama.cpp passes them to a template (None when there are none)."""
    if not tools:
        return None
    out = []
    for tool in tools:
        if (
            not isinstance(tool, Mapping)
            or tool.get("type") != "function"
            or "function" not in tool
        ):
            raise ChatTemplateError(f"failed to parse tools: unsupported tool: {tool!r}")
        fn = tool["function"]
        if "name" not in fn:
            raise ChatTemplateError(f"failed to parse tools: missing function name: {tool!r}")
        out.append(
            {
                "type": "function",
                "function": {
                    "name": fn["name"],
                    "description": fn.get("description", ""),
                    "parameters": copy.deepcopy(fn.get("parameters", {})),
                },
            }
        )
    return out


def _concat_parts(parts: list[tuple[str, str]]) -> str:
    text = ""
    last_media = False
    for typ, part in parts:
        if typ == "text":
            newline = not last_media and bool(text)
            last_media = False
        elif typ == "media_marker":
            newline = False
            last_media = True
        else:
            continue
        if newline:
            text += "\n"
        text += part
    return text


def _to_json(msg: Message) -> dict[str, Any]:
    j: dict[str, Any] = {"role": msg.role}
    if msg.content:
        j["content"] = msg.content
    elif msg.parts:
        if any(t == "media_marker" for t, _ in msg.parts):
            j["content"] = _concat_parts(msg.parts)
        else:
            j["content"] = [{"type": t, "text": x} for t, x in msg.parts]
    else:
        j["content"] = ""
    if msg.reasoning_content:
        j["reasoning_content"] = msg.reasoning_content
    if msg.tool_name:
        j["name"] = msg.tool_name
    if msg.tool_call_id:
        j["tool_call_id"] = msg.tool_call_id
    if msg.tool_calls:
        calls = []
        for tc in msg.tool_calls:
            c: dict[str, Any] = {
                "type": "function",
                "function": {"name": tc.name, "arguments": tc.arguments},
            }
            if tc.id:
                c["id"] = tc.id
            calls.append(c)
        j["tool_calls"] = calls
    return j


def _trim(msgs: list[Message]) -> list[Message]:
    ws = " \t\n\r\f\v"
    out = copy.deepcopy(msgs)
    for m in out:
        m.content = m.content.strip(ws)
        m.reasoning_content = m.reasoning_content.strip(ws)
        m.parts = [(t, x.strip(ws) if t == "text" else x) for t, x in m.parts]
    return out


def prepare_messages(msgs: list[Message], src: str, caps: Any) -> list[dict[str, Any]]:
    if "You have access to the following functions in JSONSchema format" in src:
        msgs = _trim(msgs)
    jm = [_to_json(m) for m in msgs]
    only_string = caps.supports_string_content and not caps.supports_typed_content
    only_typed = caps.supports_typed_content and not caps.supports_string_content
    for j in jm:
        c = j.get("content")
        if only_typed and isinstance(c, str):
            j["content"] = [{"type": "text", "text": c}]
        elif only_string and isinstance(c, list):
            j["content"] = _concat_parts([(p.get("type", ""), p.get("text", "")) for p in c])
    if "<|channel|>" not in src:
        for j in jm:
            if j.get("role") == "developer":
                j["role"] = "system"
    if not caps.supports_system_role and jm and jm[0].get("role") == "system":
        if len(jm) > 1:
            first, second = jm[0], jm[1]
            if not isinstance(first["content"], str) or not isinstance(second["content"], str):
                raise ChatTemplateError("cannot merge a typed system message into the next message")
            second["content"] = first["content"] + "\n" + second["content"]
        del jm[0]
    if caps.supports_tool_calls:
        for j in jm:
            if "tool_calls" in j and "content" not in j:
                j["content"] = ""
    if caps.supports_object_arguments:
        for j in jm:
            for tc in j.get("tool_calls", []):
                args = tc["function"].get("arguments")
                if isinstance(args, str):
                    try:
                        tc["function"]["arguments"] = json.loads(args)
                    except json.JSONDecodeError as e:
                        raise ChatTemplateError(
                            f"failed to parse tool call arguments as JSON: {e}"
                        ) from None
    return _specialize(jm, src)


def _specialize(jm: list[dict[str, Any]], src: str) -> list[dict[str, Any]]:
    """Message adjustments of llama.cpp's specialized template handlers."""
    ministral = "[SYSTEM_PROMPT]" in src and "[TOOL_CALLS]" in src and "[ARGS]" in src
    if ministral and "[CALL_ID]" not in src:
        out = []
        for m in jm:
            if m.get("role") not in ("system", "assistant"):
                out.append(m)
                continue
            blocks: list[Any] = []
            if isinstance(m.get("reasoning_content"), str):
                blocks.append({"type": "thinking", "thinking": m["reasoning_content"]})
            c = m.get("content")
            if isinstance(c, str):
                blocks.append({"type": "text", "text": c})
            elif isinstance(c, list):
                blocks.extend(c)
            adj = dict(m)
            adj["content"] = blocks
            adj.pop("reasoning_content", None)
            out.append(adj)
        return out
    if "'<|tool_call>call:'" in src and "{#- OpenAI Chat Completions:" not in src:
        return _gemma4_tool_responses(jm)
    gpt_oss = "<|channel|>" in src
    lfm2 = ("<|tool_list_start|>" in src and "<|tool_list_end|>" in src) or (
        "List of tools: [" in src and "<|tool_list_start|>" not in src
    )
    if gpt_oss or lfm2:
        for m in jm:
            if isinstance(m.get("reasoning_content"), str):
                m["thinking"] = m["reasoning_content"]
                if gpt_oss and m.get("tool_calls"):
                    m.pop("content", None)
    return jm


def _has_content(m: dict[str, Any]) -> bool:
    c = m.get("content")
    return (isinstance(c, str) and c != "") or (isinstance(c, list) and len(c) > 0)


def _gemma4_tool_responses(jm: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Older Gemma 4 templates: assistant(tool calls) + tool results (+ final assistant
    text) become one assistant message with ``tool_responses`` (llama.cpp's
    ``convert_tool_responses_gemma4``)."""
    out: list[dict[str, Any]] = []
    i = 0
    while i < len(jm):
        m = jm[i]
        if (
            m.get("role") != "assistant"
            or not isinstance(m.get("tool_calls"), list)
            or not m["tool_calls"]
        ):
            out.append(m)
            i += 1
            continue
        calls = list(m["tool_calls"])
        reasoning = (
            m.get("reasoning_content") if isinstance(m.get("reasoning_content"), str) else None
        )
        responses: list[dict[str, Any]] = []
        i += 1
        while i < len(jm) and jm[i].get("role") == "tool":
            cur = jm[i]
            response: Any = None
            if "content" in cur:
                c = cur["content"]
                if isinstance(c, str):
                    try:
                        response = json.loads(c)
                    except json.JSONDecodeError:
                        response = c
                else:
                    response = c
            name = ""
            if len(responses) < len(calls):
                name = calls[len(responses)].get("function", {}).get("name", "")
            if not name:
                name = cur.get("tool_call_id", "")
            responses.append({"name": name, "response": response})
            i += 1
        content = None
        if i < len(jm) and jm[i].get("role") == "assistant":
            nxt = jm[i]
            if not (isinstance(nxt.get("tool_calls"), list) and nxt["tool_calls"]) and _has_content(
                nxt
            ):
                content = nxt["content"]
                i += 1
        msg: dict[str, Any] = {"role": "assistant", "tool_calls": calls}
        if responses:
            msg["tool_responses"] = responses
        if content is not None:
            msg["content"] = content
        if reasoning is not None:
            msg["reasoning_content"] = reasoning
        out.append(msg)
    return out
