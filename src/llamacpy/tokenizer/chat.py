"""Chat templates rendered the way llama-server (``--jinja``) renders them.

:class:`ChatTemplate` compiles ``tokenizer.chat_template`` in the sandbox of
:mod:`.jinja_sandbox` and :meth:`ChatTemplate.apply` follows llama.cpp's
``common_chat_templates_apply`` (what ``POST /apply-template`` returns): messages are
normalized to llama.cpp's OpenAI-compatible form, the template's capabilities are probed
(system role, string/typed content, tool calls, object arguments) and the same workarounds
are applied (system prompt merged into the first user turn when the template ignores it,
typed content joined or wrapped, tool-call arguments parsed into objects, ``developer`` ->
``system``); the template sees ``messages``, ``tools``, ``bos_token``, ``eos_token``,
``add_generation_prompt``, ``enable_thinking``, ``datetime``, ``date_string`` and any extra
keyword arguments; a leading BOS / trailing EOS text is dropped when the tokenizer adds it
anyway. :meth:`ChatTemplate.render` renders a raw context without any of that.
"""

from __future__ import annotations

import copy
import datetime as _dt
import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jinja2

from .errors import ChatTemplateError, ChatTemplateLimitError
from .jinja_sandbox import Limits, SandboxEnvironment, Tracked, track

__all__ = ["CHATML_TEMPLATE", "Caps", "ChatTemplate", "Limits"]

CHATML_TEMPLATE = (
    "{%- for message in messages -%}\n"
    "  {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "  {{- '<|im_start|>assistant\n' -}}\n"
    "{%- endif -%}"
)

# llama.cpp patches two known template bugs before compiling
_PATCHES = (
    (
        ("<|channel|>", "in message.content or"),
        '{%- if "<|channel|>analysis<|message|>" in message.content or '
        '"<|channel|>final<|message|>" in message.content %}',
    ),
    (
        ("[TOOL_CALLS]", "if (message['content'] is none or"),
        "{%- if (message['content'] is none or message['content'] == '' or "
        "message['content']|length == 0) and (message['tool_calls'] is not defined or "
        "message['tool_calls'] is none or message['tool_calls']|length == 0) %}",
    ),
)


@dataclass(frozen=True)
class Caps:
    """What a template does with its inputs (llama.cpp's ``jinja::caps``)."""

    supports_string_content: bool = True
    supports_typed_content: bool = False
    supports_tools: bool = True
    supports_tool_calls: bool = True
    supports_parallel_tool_calls: bool = True
    supports_system_role: bool = True
    supports_preserve_reasoning: bool = False
    supports_reasoning_effort: bool = True
    supports_object_arguments: bool = False


def _container_ids(value: Any, out: set[int]) -> set[int]:
    if isinstance(value, dict):
        out.add(id(value))
        for v in value.values():
            _container_ids(v, out)
    elif isinstance(value, list):
        out.add(id(value))
        for v in value:
            _container_ids(v, out)
    return out


class ChatTemplate:
    """A compiled chat template plus the BOS/EOS texts and flags of its tokenizer."""

    def __init__(
        self,
        source: str,
        bos_token: str = "",
        eos_token: str = "",
        *,
        add_bos: bool = False,
        add_eos: bool = False,
        limits: Limits | None = None,
    ) -> None:
        if not isinstance(source, str):
            raise ChatTemplateError("chat template must be a string")
        if source in ("", "chatml"):
            source = CHATML_TEMPLATE
        for needles, old in _PATCHES:
            if all(n in source for n in needles):
                source = source.replace(old, "{%- if false %}")
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.add_bos = add_bos
        self.add_eos = add_eos
        self.env = SandboxEnvironment(limits)
        try:
            self.template = self.env.from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise ChatTemplateError(
                f"chat template syntax error (line {e.lineno}): {e.message}"
            ) from None
        except RecursionError:
            raise ChatTemplateLimitError("chat template nests too deeply") from None
        self._caps: Caps | None = None
        self._lock = threading.RLock()  # the sandbox keeps per-render state

    @classmethod
    def from_tokenizer(
        cls, tokenizer: Any, name: str = "", limits: Limits | None = None
    ) -> ChatTemplate:
        """The template stored in the model (``tokenizer.chat_template[.NAME]``), with the
        tokenizer's BOS/EOS texts; like llama.cpp, the ``tool_use`` variant and then ChatML
        stand in when the default is missing."""
        templates = getattr(tokenizer, "chat_templates", {})
        source = templates.get(name or "", "")
        if name and not source:
            raise ChatTemplateError(f"the model has no chat template named {name!r}")
        if not name and source in ("", "chatml"):
            source = templates.get("tool_use", "") or CHATML_TEMPLATE

        def piece(tid: int) -> str:
            if tid < 0:
                return ""
            return tokenizer.token_to_piece(tid, special=True).decode("utf-8", "replace")

        return cls(
            source,
            piece(tokenizer.bos),
            piece(tokenizer.eos),
            add_bos=tokenizer.add_bos,
            add_eos=tokenizer.add_eos,
            limits=limits,
        )

    # --- raw rendering ------------------------------------------------------------------

    def render(
        self,
        context: Mapping[str, Any] | None = None,
        *,
        now: _dt.datetime | None = None,
        **kwargs: Any,
    ) -> str:
        """Render with exactly the given variables (no llama.cpp processing).

        ``now`` is the time ``strftime_now`` formats (default: the current time).
        """
        with self._lock:
            return self._render(ctx={**(context or {}), **kwargs}, now=now)

    def _render(self, ctx: dict[str, Any], now: _dt.datetime | None) -> str:
        env = self.env
        env.now = now or _dt.datetime.now()
        env.begin(_container_ids(ctx, set()))
        out: list[str] = []
        total = 0
        try:
            for part in self.template.generate(ctx):
                total += len(part)
                if total > env.limits.max_output:
                    raise ChatTemplateLimitError(
                        f"chat template output exceeds {env.limits.max_output} characters"
                    )
                out.append(part)
                env.check_time()
        except ChatTemplateError:
            raise
        except RecursionError:
            raise ChatTemplateLimitError("chat template recursion too deep") from None
        except MemoryError:
            raise ChatTemplateLimitError("chat template ran out of memory") from None
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"chat template error: {e}") from None
        except Exception as e:  # anything the template's own code raised
            raise ChatTemplateError(f"chat template error: {type(e).__name__}: {e}") from None
        return "".join(out)

    # --- capabilities -------------------------------------------------------------------

    @property
    def caps(self) -> Caps:
        if self._caps is None:
            self._caps = _detect_caps(self)
        return self._caps

    def _probe(self, messages: list, tools: list | None = None, **extra: Any) -> tuple:
        msgs = track(messages)
        tls = track(tools if tools is not None else [])
        ctx = {
            "messages": msgs,
            "tools": tls,
            "bos_token": "",
            "eos_token": "",
            "add_generation_prompt": True,
            **extra,
        }
        try:
            return True, self.render(ctx), msgs, tls
        except ChatTemplateLimitError:
            raise  # a template that blows a limit on a probe is not worth probing further
        except ChatTemplateError:
            return False, "", msgs, tls

    # --- llama-server pipeline ----------------------------------------------------------

    def apply(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        enable_thinking: bool = True,
        preserve_reasoning: bool | None = True,
        now: _dt.datetime | None = None,
        **kwargs: Any,
    ) -> str:
        """The prompt llama-server builds for an OpenAI-style chat request.

        Defaults follow llama-server: a generation prompt, ``preserve_reasoning`` on (which
        sets ``preserve_thinking``/``clear_thinking``/``drop_thinking``/...); extra keyword
        arguments are ``chat_template_kwargs``. ``now`` fixes the date the template sees.
        """
        from ._chat_inputs import parse_messages, parse_tools, prepare_messages

        msgs = parse_messages(messages)
        tool_json = parse_tools(tools)
        caps = self.caps
        src = self.source
        jmsgs = prepare_messages(msgs, src, caps)
        now = now or _dt.datetime.now()
        ctx: dict[str, Any] = {
            "messages": jmsgs,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "enable_thinking": enable_thinking,
        }
        if tool_json is not None:
            ctx["tools"] = tool_json
        ctx["datetime"] = now.strftime("%b %d %Y")
        ctx["date_string"] = now.strftime("%d %b %Y")
        ctx["enable_thinking"] = enable_thinking
        if preserve_reasoning is not None:
            ctx["preserve_reasoning"] = preserve_reasoning
        for k, v in kwargs.items():
            ctx[k] = copy.deepcopy(v)
        if add_generation_prompt:
            ctx["add_generation_prompt"] = True
        if isinstance(ctx.get("preserve_reasoning"), bool):
            on = ctx["preserve_reasoning"]
            ctx.update(
                preserve_thinking=on,
                clear_thinking=not on,
                truncate_history_thinking=not on,
                drop_thinking=not on,
            )
        if isinstance(ctx.get("reasoning_effort"), str) and ctx["reasoning_effort"]:
            ctx["reasoning_strength"] = ctx["reasoning_effort"]
        result = self.render(ctx, now=now)
        if "<|channel|>" in src and not add_generation_prompt:
            pos = result.rfind("<|return|>")
            if pos != -1:
                result = result[:pos] + "<|end|>" + result[pos + len("<|return|>") :]
        if self.add_bos and self.bos_token and result.startswith(self.bos_token):
            result = result[len(self.bos_token) :]
        if self.add_eos and self.eos_token and result.endswith(self.eos_token):
            result = result[: -len(self.eos_token)]
        return result


_MARKER = "STRING_MARKER"
_TOOLS = [
    {
        "name": "tool",
        "type": "function",
        "function": {
            "name": "tool1",
            "description": "Tool description",
            "parameters": {
                "type": "object",
                "properties": {"arg": {"type": "string", "description": "Arg description"}},
                "required": ["arg"],
            },
        },
    }
]


def _tool_conv(args: Any, parallel: bool = False) -> list:
    call = {"id": "call00001", "type": "function", "function": {"name": "tool1", "arguments": args}}
    calls = [call]
    if parallel:
        calls = [call, {**call, "id": "call00002", "function": dict(call["function"])}]
    return [
        {"role": "user", "content": "User message"},
        {"role": "assistant", "content": "", "tool_calls": calls},
        {"role": "tool", "content": "Tool response", "tool_call_id": "call00001"},
        {"role": "assistant", "content": "The tool response was 'tool response'"},
        {"role": "user", "content": "User message"},
    ]


def _used(value: Any) -> bool:
    return isinstance(value, Tracked) and value._used


def _ops(value: Any) -> set[str]:
    return value._ops if isinstance(value, Tracked) else set()


def _detect_caps(t: ChatTemplate) -> Caps:
    """llama.cpp's ``caps_get``: probe renders with tracked inputs."""
    c: dict[str, bool] = Caps().__dict__.copy()
    ok, out, msgs, _ = t._probe([{"role": "user", "content": _MARKER}])
    content = msgs[0]["content"]
    ops = _ops(content)
    checks_for_string = "test_is_string" in ops
    as_array = bool(ops & {"selectattr", "array_access"})
    if as_array:
        c["supports_typed_content"] = True
    if not ok or (as_array and _MARKER not in out):
        c["supports_string_content"] = False
    if checks_for_string:
        ok, _, msgs, _ = t._probe([{"role": "user", "content": []}])
        if ok and _ops(msgs[0]["content"]) & {"selectattr", "array_access"}:
            c["supports_typed_content"] = True
    _, _, msgs, _ = t._probe(
        [
            {"role": "system", "content": "System message"},
            {"role": "user", "content": "User message"},
        ]
    )
    if not _used(msgs[0]["content"]):
        c["supports_system_role"] = False
    ok, _, msgs, tools = t._probe(_tool_conv({"arg": "value"}), _TOOLS)
    if ok:
        if not _used(tools[0]["function"]["name"]):
            c["supports_tools"] = False
        calls = msgs[1]["tool_calls"]
        if not _used(calls):
            c["supports_tool_calls"] = False
        elif _used(calls[0]["function"]["arguments"]["arg"]):
            c["supports_object_arguments"] = True
    if not c["supports_object_arguments"]:
        ok, _, msgs, tools = t._probe(_tool_conv('{"arg": "value"}'), _TOOLS)
        if not ok:
            c["supports_tool_calls"] = c["supports_tools"] = False
        else:
            if not _used(tools[0]["function"]["name"]):
                c["supports_tools"] = False
            if not _used(msgs[1]["tool_calls"]):
                c["supports_tool_calls"] = False
    args = {"arg": "value"} if c["supports_object_arguments"] else '{"arg": "value"}'
    ok, _, msgs, _ = t._probe(_tool_conv(args, parallel=True), _TOOLS)
    if not ok or not _used(msgs[1]["tool_calls"][1]["function"]):
        c["supports_parallel_tool_calls"] = False
    placeholder = "<REASONING_CONTENT_PLACEHOLDER>"
    ok, out, _, _ = t._probe(
        [
            {"role": "user", "content": "User message"},
            {"role": "assistant", "content": "Assistant message", "reasoning_content": placeholder},
            {"role": "user", "content": "User message"},
            {
                "role": "assistant",
                "content": "Assistant message",
                "reasoning_content": "Reasoning content",
            },
            {"role": "user", "content": "User message"},
        ],
        enable_thinking=True,
        preserve_thinking=True,
        clear_thinking=False,
        truncate_history_thinking=False,
        drop_thinking=False,
    )
    c["supports_preserve_reasoning"] = placeholder in out
    # llama.cpp marks a variable used when the template reads it; Jinja2 gives no hook for
    # plain variable reads, so this one is decided from the template's source
    from jinja2 import meta

    names = meta.find_undeclared_variables(t.env.parse(t.source))
    c["supports_reasoning_effort"] = "reasoning_effort" in names or "reasoning_strength" in names
    return Caps(**c)


def dumps_compact(value: Any) -> str:
    """nlohmann::json ``dump()``: compact, UTF-8 kept."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
