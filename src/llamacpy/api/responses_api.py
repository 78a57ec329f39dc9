"""OpenAI's Responses API on the chat engine: a ``/v1/responses`` request (``input`` items,
``instructions``, the conversation of ``previous_response_id``) becomes a chat request, and
the chat reply (reasoning, text, tool calls) a Response with ``reasoning``, ``message`` and
``function_call`` output items, whole or as the API's stream events.

Request mapping: ``input`` is a string (one user message) or items: messages (``role``
user/system/developer/assistant, ``content`` a string or ``input_text``/``output_text``
parts), ``function_call`` (an earlier call of the model) and ``function_call_output`` (its
result); ``instructions`` is the system message (not carried to the next response, as in
OpenAI's API); ``max_output_tokens``, ``temperature``, ``top_p``; ``tools`` (function tools)
with ``tool_choice`` and ``parallel_tool_calls``; ``text.format`` (``json_object``,
``json_schema``); ``reasoning.effort``. Images and files are refused by name.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from ..errors import UsageError

MAX_STORED = 1000  # responses kept for previous_response_id (least recently used dropped)


class ResponsesRequestError(UsageError):
    """A Responses request that cannot be served (the message names the field)."""


def _fail(msg: str) -> ResponsesRequestError:
    return ResponsesRequestError(msg)


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _fail(f"{where}.content must be a string or an array of content parts")
    out = []
    for j, part in enumerate(content):
        t = part.get("type") if isinstance(part, dict) else None
        if t in ("input_text", "output_text", "text"):
            if not isinstance(part.get("text"), str):
                raise _fail(f"{where}.content[{j}].text must be a string")
            out.append(part["text"])
        elif t in ("input_image", "input_file", "input_audio"):
            raise _fail(f"{where}.content[{j}]: {t} is not supported by this server")
        elif t != "refusal":
            raise _fail(f"{where}.content[{j}].type {t!r} is not a text part")
    return "".join(out)


def _items(items: Any) -> list[dict[str, Any]]:
    """Chat messages of ``input`` items (consecutive calls join one assistant message)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise _fail("'input' must be a string or a non-empty array of items")
    out: list[dict[str, Any]] = []
    for i, it in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(it, dict):
            raise _fail(f"{where} must be an object")
        t = it.get("type", "message")
        if t == "message":
            role = it.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise _fail(f"{where}.role must be user, system, developer or assistant")
            role = "system" if role == "developer" else role
            out.append({"role": role, "content": _text(it.get("content"), where)})
        elif t == "function_call":
            name, args, cid = it.get("name"), it.get("arguments", "{}"), it.get("call_id")
            if not isinstance(name, str) or not isinstance(args, str) or not isinstance(cid, str):
                raise _fail(f"{where} must have string 'call_id', 'name' and 'arguments'")
            call = {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
            if out and out[-1]["role"] == "assistant" and "tool_calls" in out[-1]:
                out[-1]["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif t == "function_call_output":
            cid, output = it.get("call_id"), it.get("output")
            if not isinstance(cid, str):
                raise _fail(f"{where}.call_id must be a string")
            if not isinstance(output, str):
                output = _text(output, where) if isinstance(output, list) else json.dumps(output)
            out.append({"role": "tool", "tool_call_id": cid, "content": output})
        elif t == "reasoning":
            continue  # the model's earlier reasoning is not sent back to it
        else:
            raise _fail(f"{where}.type {t!r} is not supported (message, function_call, "
                        "function_call_output, reasoning)")  # fmt: skip
    return out


def _tools(tools: Any) -> list[dict[str, Any]]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise _fail("'tools' must be an array")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type") != "function":
            kind = t.get("type") if isinstance(t, dict) else None
            raise _fail(f"tools[{i}]: only function tools are supported, not {kind!r}")
        if not isinstance(t.get("name"), str):
            raise _fail(f"tools[{i}].name must be a string")
        fn = {"name": t["name"], "parameters": t.get("parameters") or {"type": "object"}}
        if isinstance(t.get("description"), str):
            fn["description"] = t["description"]
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: Any) -> Any:
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        if not isinstance(choice.get("name"), str):
            raise _fail("tool_choice.name must be a string")
        return {"type": "function", "function": {"name": choice["name"]}}
    raise _fail("tool_choice must be auto, none, required or {'type': 'function', 'name': ...}")


def _text_format(text: Any, body: dict[str, Any]) -> None:
    if text is None:
        return
    fmt = text.get("format") if isinstance(text, dict) else None
    if fmt is None:
        return
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "json_object":
        body["response_format"] = {"type": "json_object"}
    elif kind == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise _fail("text.format.schema must be an object")
        body["response_format"] = {"type": "json_schema", "json_schema": {
            "name": fmt.get("name", "format"), "schema": fmt["schema"]}}  # fmt: skip
    elif kind != "text":
        raise _fail("text.format.type must be text, json_object or json_schema")


def conversation(data: dict[str, Any], history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation a request continues: ``history`` (the messages of
    ``previous_response_id``, [] without it) and its ``input`` as chat messages."""
    return list(history) + _items(data.get("input"))


def chat_request(data: dict[str, Any], conv: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat request of a Responses request whose conversation is ``conv``."""
    messages = list(conv)
    instructions = data.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise _fail("'instructions' must be a string")
        messages.insert(0, {"role": "system", "content": instructions})
    body: dict[str, Any] = {"messages": messages}
    for key, name in (("max_output_tokens", "max_tokens"), ("temperature", "temperature"),
                      ("top_p", "top_p"), ("stream", "stream"), ("model", "model"),
                      ("parallel_tool_calls", "parallel_tool_calls")):  # fmt: skip
        if data.get(key) is not None:
            body[name] = data[key]
    tools = _tools(data.get("tools"))
    if tools:
        body["tools"] = tools
    choice = _tool_choice(data.get("tool_choice"))
    if choice is not None:
        body["tool_choice"] = choice
    _text_format(data.get("text"), body)
    reasoning = data.get("reasoning")
    if isinstance(reasoning, dict) and isinstance(reasoning.get("effort"), str):
        body["reasoning_effort"] = reasoning["effort"]
    return body


def output_items(message: dict[str, Any], status: str) -> list[dict[str, Any]]:
    """A chat reply ``message`` as Responses output items."""
    items: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        items.append(reasoning_item(new_id("rs"), message["reasoning_content"]))
    if message.get("content"):
        items.append(message_item(new_id("msg"), message["content"], status))
    for c in message.get("tool_calls") or []:
        fn = c["function"]
        items.append(call_item(new_id("fc"), c["id"], fn["name"], fn["arguments"]))
    return items


def reasoning_item(rid: str, text: str) -> dict[str, Any]:
    return {"type": "reasoning", "id": rid, "summary": [], "status": "completed",
            "content": [{"type": "reasoning_text", "text": text}]}  # fmt: skip


def message_item(mid: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "message", "id": mid, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [],
                         "logprobs": []}]}  # fmt: skip


def call_item(fid: str, call_id: str, name: str, arguments: str, status: str = "completed"):
    return {"type": "function_call", "id": fid, "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}  # fmt: skip


def response(rid: str, data: dict[str, Any], model: str, output: list[dict[str, Any]],
             status: str, usage: dict[str, int] | None) -> dict[str, Any]:  # fmt: skip
    """A Response object (``usage``: prompt, cached and completion tokens, or None)."""
    out: dict[str, Any] = {
        "id": rid, "object": "response", "created_at": int(time.time()), "status": status,
        "model": model, "output": output, "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete"
        else None,
        "instructions": data.get("instructions"),
        "max_output_tokens": data.get("max_output_tokens"),
        "parallel_tool_calls": data.get("parallel_tool_calls", True),
        "previous_response_id": data.get("previous_response_id"),
        "temperature": data.get("temperature"), "top_p": data.get("top_p"),
        "tool_choice": data.get("tool_choice", "auto"), "tools": data.get("tools") or [],
        "text": data.get("text") or {"format": {"type": "text"}},
        "reasoning": data.get("reasoning"), "metadata": data.get("metadata") or {},
        "store": data.get("store", True), "usage": None,
    }  # fmt: skip
    if usage is not None:
        out["usage"] = {
            "input_tokens": usage["prompt"],
            "input_tokens_details": {"cached_tokens": usage["cached"], "cache_write_tokens": 0},
            "output_tokens": usage["completion"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage["prompt"] + usage["completion"],
        }
    return out


def history_of(conv: list[dict[str, Any]], output: list[dict[str, Any]]) -> list:
    """The conversation a next response continues: this one's (without its instructions:
    they apply to one response) and the reply as a chat message."""
    reply: dict[str, Any] = {"role": "assistant", "content": ""}
    for it in output:
        if it["type"] == "message":
            reply["content"] += it["content"][0]["text"]
        elif it["type"] == "function_call":
            reply.setdefault("tool_calls", []).append({
                "id": it["call_id"], "type": "function",
                "function": {"name": it["name"], "arguments": it["arguments"]}})  # fmt: skip
    return [*conv, reply]


class ResponseStore:
    """Responses kept for ``previous_response_id`` and ``GET /v1/responses/{id}``: at most
    ``limit``, the least recently used dropped first."""

    def __init__(self, limit: int = MAX_STORED) -> None:
        self.limit = limit
        self._items: OrderedDict[str, tuple[dict[str, Any], list]] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, resp: dict[str, Any], conversation: list) -> None:
        with self._lock:
            self._items[resp["id"]] = (resp, conversation)
            self._items.move_to_end(resp["id"])
            while len(self._items) > self.limit:
                self._items.popitem(last=False)

    def get(self, rid: str) -> tuple[dict[str, Any], list] | None:
        with self._lock:
            item = self._items.get(rid)
            if item is not None:
                self._items.move_to_end(rid)
            return item

    def delete(self, rid: str) -> bool:
        with self._lock:
            return self._items.pop(rid, None) is not None


class ResponseEvents:
    """The Responses stream events of one reply, from the chat deltas of
    :class:`~llamacpy.api.tool_calls.ReplyStream`: an output item opens when its kind first
    appears (reasoning, message, each function call) and is done when another begins."""

    def __init__(self, rid: str) -> None:
        self.rid = rid
        self.seq = 0
        self.items: list[dict[str, Any]] = []  # the output so far
        self.open: str | None = None  # "reasoning", "message", "call:<index>"
        self.text = ""  # the open item's text (arguments of a call)

    def _ev(self, kind: str, **fields: Any) -> tuple[str, dict[str, Any]]:
        ev = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return kind, ev

    def start(self, resp: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        return [self._ev("response.created", response=resp),
                self._ev("response.in_progress", response=resp)]  # fmt: skip

    def _begin(self, kind: str, item: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        out = self.close()
        self.open, self.text = kind, ""
        self.items.append(item)
        i = len(self.items) - 1
        out.append(self._ev("response.output_item.added", output_index=i, item=item))
        if kind == "message":
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            out.append(self._ev("response.content_part.added", item_id=item["id"],
                                output_index=i, content_index=0, part=part))  # fmt: skip
        elif kind == "reasoning":
            part = {"type": "reasoning_text", "text": ""}
            out.append(self._ev("response.content_part.added", item_id=item["id"],
                                output_index=i, content_index=0, part=part))  # fmt: skip
        return out

    def close(self) -> list[tuple[str, dict[str, Any]]]:
        if self.open is None:
            return []
        i, item, text = len(self.items) - 1, self.items[-1], self.text
        ids = {"item_id": item["id"], "output_index": i}
        out = []
        if self.open == "message":
            item.update(message_item(item["id"], text))
            out.append(self._ev("response.output_text.done", **ids, content_index=0, text=text,
                                logprobs=[]))  # fmt: skip
            out.append(self._ev("response.content_part.done", **ids, content_index=0,
                                part=item["content"][0]))  # fmt: skip
        elif self.open == "reasoning":
            item.update(reasoning_item(item["id"], text))
            out.append(self._ev("response.reasoning_text.done", **ids, content_index=0,
                                text=text))  # fmt: skip
            out.append(self._ev("response.content_part.done", **ids, content_index=0,
                                part=item["content"][0]))  # fmt: skip
        else:
            item.update(arguments=text, status="completed")
            out.append(self._ev("response.function_call_arguments.done", **ids, arguments=text,
                                name=item["name"]))  # fmt: skip
        out.append(self._ev("response.output_item.done", output_index=i, item=item))
        self.open = None
        return out

    def deltas(self, deltas: Iterable[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
        out: list[tuple[str, dict[str, Any]]] = []
        for d in deltas:
            if d.get("reasoning_content"):
                if self.open != "reasoning":
                    out += self._begin("reasoning", {**reasoning_item(new_id("rs"), ""),
                                                     "status": "in_progress"})  # fmt: skip
                out.append(self._add("response.reasoning_text.delta", d["reasoning_content"]))
            if d.get("content"):
                if self.open != "message":
                    out += self._begin("message", message_item(new_id("msg"), "", "in_progress"))
                out.append(self._add("response.output_text.delta", d["content"]))
            for c in d.get("tool_calls") or []:
                kind = f"call:{c['index']}"
                if self.open != kind:
                    fn = c.get("function", {})
                    out += self._begin(
                        kind,
                        call_item(
                            new_id("fc"), c.get("id", ""), fn.get("name", ""), "", "in_progress"
                        ),
                    )
                args = c.get("function", {}).get("arguments")
                if args:
                    out.append(self._add("response.function_call_arguments.delta", args))
        return out  # fmt: skip

    def _add(self, kind: str, delta: str) -> tuple[str, dict[str, Any]]:
        self.text += delta
        i = len(self.items) - 1
        fields: dict[str, Any] = {"item_id": self.items[-1]["id"], "output_index": i,
                                  "delta": delta}  # fmt: skip
        if kind != "response.function_call_arguments.delta":
            fields["content_index"] = 0
        if kind == "response.output_text.delta":
            fields["logprobs"] = []
        return self._ev(kind, **fields)

    def end(self, resp: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        out = self.close()
        # llama-server's final event whatever the status (a reply cut by max_output_tokens
        # says "incomplete" in it): the openai client's stream helper wants this one
        out.append(self._ev("response.completed", response=resp))
        return out
