"""Ollama's API on the completion engine: ``/api/chat`` and ``/api/generate`` requests
become chat or native completion requests, their replies Ollama's JSON objects (one, or one
per line when streamed, which is Ollama's default).

Options: ``num_predict`` (-1 and -2: until the context is full), ``temperature``,
``top_k``, ``top_p``, ``min_p``, ``typical_p``, ``repeat_last_n``, ``repeat_penalty``,
``presence_penalty``, ``frequency_penalty``, ``seed``, ``stop``, ``mirostat``,
``mirostat_tau``, ``mirostat_eta`` map onto the sampler of the same name; the server's own
settings (``num_ctx``, ``num_batch``, ``num_thread``, ``num_gpu``, memory options) and
options llama.cpp dropped (``tfs_z``, ``penalize_newline``) are ignored, as Ollama ignores
options a runner does not use. ``format`` is ``"json"`` or a JSON schema; ``think``
(true/false, or ``"low"``/``"medium"``/``"high"``) turns reasoning on or off; ``images``
are refused by name.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

from ..errors import UsageError

VERSION = "0.12.0"  # the Ollama API version these routes follow

SAMPLER_OPTIONS = ("temperature", "top_k", "top_p", "min_p", "typical_p", "repeat_last_n",
                   "repeat_penalty", "presence_penalty", "frequency_penalty", "seed",
                   "mirostat", "mirostat_tau", "mirostat_eta")  # fmt: skip
IGNORED_OPTIONS = ("num_ctx", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv",
                   "logits_all", "vocab_only", "use_mmap", "use_mlock", "embedding_only",
                   "num_thread", "numa", "num_keep", "tfs_z", "penalize_newline")  # fmt: skip


class OllamaRequestError(UsageError):
    """An Ollama request that cannot be served (the message names the field)."""


def _fail(msg: str) -> OllamaRequestError:
    return OllamaRequestError(msg)


def now_iso() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _options(data: dict[str, Any], body: dict[str, Any], limit_key: str) -> None:
    opts = data.get("options")
    if opts is None:
        return
    if not isinstance(opts, dict):
        raise _fail("'options' must be an object")
    for k, v in opts.items():
        if k in SAMPLER_OPTIONS:
            body[k] = v
        elif k == "stop":
            if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
                raise _fail("options.stop must be an array of strings")
            body["stop"] = v
        elif k == "num_predict":
            if isinstance(v, bool) or not isinstance(v, int) or v < -2:
                raise _fail("options.num_predict must be an integer >= -2")
            if v >= 0:
                body[limit_key] = v
        elif k not in IGNORED_OPTIONS:
            raise _fail(f"options.{k} is not an option this server knows")


def _format(data: dict[str, Any], body: dict[str, Any]) -> None:
    fmt = data.get("format")
    if fmt in (None, ""):
        return
    if fmt == "json":
        body["response_format"] = {"type": "json_object"}
    elif isinstance(fmt, dict):
        body["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "format", "schema": fmt}}  # fmt: skip
    else:
        raise _fail("'format' must be \"json\" or a JSON schema object")


def _think(data: dict[str, Any], body: dict[str, Any]) -> None:
    think = data.get("think")
    if think is None:
        return
    if think is False:
        body["chat_template_kwargs"] = {"enable_thinking": False}
    elif think is True:
        body["chat_template_kwargs"] = {"enable_thinking": True}
    elif think in ("low", "medium", "high"):
        body["reasoning_effort"] = think
    else:
        raise _fail('\'think\' must be true, false, "low", "medium" or "high"')


def _message(m: Any, i: int) -> dict[str, Any]:
    where = f"messages[{i}]"
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        raise _fail(f"{where} must be an object with a string 'role'")
    if m.get("images"):
        raise _fail(f"{where}.images: images are not supported by this server")
    content = m.get("content", "")
    if content is None:
        content = ""
    if not isinstance(content, str):
        raise _fail(f"{where}.content must be a string")
    out: dict[str, Any] = {"role": m["role"], "content": content}
    if isinstance(m.get("thinking"), str) and m["thinking"]:
        out["reasoning_content"] = m["thinking"]
    calls = m.get("tool_calls")
    if calls:
        if not isinstance(calls, list):
            raise _fail(f"{where}.tool_calls must be an array")
        out["tool_calls"] = [_call(c, f"{where}.tool_calls[{j}]", j) for j, c in enumerate(calls)]
    if m["role"] == "tool" and isinstance(m.get("tool_name"), str):
        out["name"] = m["tool_name"]
    return out


def _call(c: Any, where: str, j: int) -> dict[str, Any]:
    fn = c.get("function") if isinstance(c, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise _fail(f"{where}.function must be an object with a string 'name'")
    args = fn.get("arguments", {})
    if not isinstance(args, dict | str):
        raise _fail(f"{where}.function.arguments must be an object")
    text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return {"id": f"call_{j}", "type": "function",
            "function": {"name": fn["name"], "arguments": text}}  # fmt: skip


def chat_request(data: dict[str, Any]) -> dict[str, Any]:
    """The OpenAI-style chat request of an ``/api/chat`` request."""
    msgs = data.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise _fail("'messages' must be a non-empty array of messages")
    body: dict[str, Any] = {"messages": [_message(m, i) for i, m in enumerate(msgs)],
                            "stream": _stream(data)}  # fmt: skip
    tools = data.get("tools")
    if tools:
        if not isinstance(tools, list):
            raise _fail("'tools' must be an array")
        body["tools"] = tools
    _options(data, body, "max_tokens")
    _format(data, body)
    _think(data, body)
    return body


def _stream(data: dict[str, Any]) -> bool:
    v = data.get("stream", True)  # Ollama streams unless told not to
    if not isinstance(v, bool):
        raise _fail("'stream' must be true or false")
    return v


def generate_request(data: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """``(body, kind)`` of an ``/api/generate`` request: a chat request of the system and
    prompt (the model's template, as Ollama applies it), or with ``raw`` (or earlier
    ``context`` tokens) a native completion of the text."""
    prompt = data.get("prompt", "")
    if not isinstance(prompt, str):
        raise _fail("'prompt' must be a string")
    if data.get("images"):
        raise _fail("images: images are not supported by this server")
    if data.get("suffix"):
        raise _fail("'suffix' (fill-in-the-middle) is not supported here: use /infill")
    if data.get("template"):
        raise _fail("'template' is not supported: the model's own chat template is used")
    system = data.get("system")
    if system is not None and not isinstance(system, str):
        raise _fail("'system' must be a string")
    context = data.get("context")
    if context is not None and (
        not isinstance(context, list)
        or not all(isinstance(t, int) and not isinstance(t, bool) for t in context)
    ):
        raise _fail("'context' must be an array of token ids")
    raw = data.get("raw", False)
    if not isinstance(raw, bool):
        raise _fail("'raw' must be true or false")
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": prompt}
    ]
    if raw or context:
        body: dict[str, Any] = {"prompt": prompt, "stream": _stream(data)}
        if not raw:
            body["messages"] = messages  # rendered by the route after the context
        kind = "native"
        _options(data, body, "n_predict")
    else:
        body = {"messages": messages, "stream": _stream(data)}
        kind = "chat"
        _options(data, body, "max_tokens")
        _think(data, body)
    _format(data, body)
    if context:
        body["context"] = context
    return body, kind


def durations(timings: dict[str, float], t_start: float) -> dict[str, int]:
    """Ollama's nanosecond timings of a finished completion."""
    return {
        "total_duration": int((time.perf_counter() - t_start) * 1e9),
        "load_duration": 0,
        "prompt_eval_count": int(timings.get("prompt_n", 0)),
        "prompt_eval_duration": int(timings.get("prompt_ms", 0.0) * 1e6),
        "eval_count": int(timings.get("predicted_n", 0)),
        "eval_duration": int(timings.get("predicted_ms", 0.0) * 1e6),
    }


def tool_calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI tool calls as Ollama's (arguments as an object)."""
    out = []
    for c in calls:
        fn = c["function"]
        try:
            args = json.loads(fn["arguments"]) if fn["arguments"] else {}
        except ValueError:
            args = {}
        out.append({"function": {"name": fn["name"],
                                 "arguments": args if isinstance(args, dict) else {}}})  # fmt: skip
    return out


def model_details(metadata: dict[str, Any], arch: str, desc: str) -> dict[str, Any]:
    """Ollama's ``details`` of a model (family, parameter size, quantization)."""
    parts = desc.split()
    return {
        "parent_model": "", "format": "gguf", "family": arch, "families": [arch],
        "parameter_size": parts[1] if len(parts) > 1 else "",
        "quantization_level": parts[2] if len(parts) > 2 else "",
    }  # fmt: skip
