"""Tool calls and reasoning in chat replies: what a request's ``tools`` mean for the prompt
and the grammar, and how a reply's text splits into ``reasoning_content``, ``content`` and
``tool_calls``.

A *tool format* is the way a model family writes a call; it is chosen from the chat
template's text, as llama.cpp chooses its handler:

* ``qwen3-coder``: ``<tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>\\n
  </function>\\n</tool_call>`` (Qwen3-Coder, Qwen3.5/3.6, Nemotron Nano 3);
* ``hermes``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Hermes 2 Pro,
  Qwen 2.5/3 and every template that writes ``<tool_call>``);
* ``mistral``: ``[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": "9 chars"}]``
  (Mistral Nemo and the templates of that shape);
* ``llama3``: ``{"name": ..., "parameters": {...}}`` as the whole reply, optionally after
  ``<|python_tag|>`` (Llama 3.1-3.3);
* ``command-r7b``: ``<|START_ACTION|>[{"tool_call_id": "0", "tool_name": ..., "parameters":
  {...}}]<|END_ACTION|>`` (Command R7B; ``cohere2moe`` the same with its own answer markers);
* ``functionary-v3.2``: ``>>>NAME\n{...}`` parts after ``>>>all\n`` text (the generation
  prompt ends with ``>>>``, which the reply is read with);
* ``kimi-k2``: ``<|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>{...}``;
  ``minimax-m2``: ``<invoke name=...>`` with ``<parameter name=...>`` elements;
* GLM, DeepSeek R1 / V3.1, Granite, Functionary v3.1 and gpt-oss (see their classes);
* ``generic``: every other template, tool-aware or not. The tools are described in the
  system message and the reply is one JSON object, ``{"tool_call": {"name": ...,
  "arguments": {...}}}`` (``{"tool_calls": [...]}`` with parallel calls) or
  ``{"response": "..."}``, kept in that shape by a grammar from the first token on. This
  is how models whose templates know nothing of tools (SmolLM2, Gemma 3) call them.

With ``tool_choice`` ``auto`` the native formats' grammar is *lazy*: the reply is free
text until the format's opening text (its trigger) appears, then the grammar holds the
call to the tools' schemas. ``required`` (or one named function) applies it from the
start (after the reasoning block of a thinking model). ``none`` leaves tools out.

Reasoning: a ``<think>...</think>`` block (Command R7B: ``<|START_THINKING|>...``) at the
start of the reply (or a reply that starts inside one, when the prompt opened it) becomes
``reasoning_content`` unless the request's ``reasoning_format`` is ``none``.

Calls are read by one reader per format (:meth:`ToolFormat.scan_calls`) that serves both
the finished reply and a streaming one: it stops where the text does, leaving the last
call's arguments as far as they are certain. Arguments written as a JSON object are kept
as the model wrote them, so a streamed call's argument text only grows: its first delta
carries the id and the name, the next ones add to the arguments, and the deltas add up to
the parsed reply.
"""

from __future__ import annotations

import json
import re
import secrets
import string
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..errors import UsageError
from ..grammar.json_schema import GrammarBuilder

MAX_TOOLS = 4096  # a tool set past this is refused (the grammar of each is built)
_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
_ID_CHARS = string.ascii_letters + string.digits
THINK_START, THINK_END = "<think>", "</think>"
REASONING_FORMATS = ("none", "auto", "deepseek", "deepseek-legacy")


# ---------------------------------------------------------------------------- requests
@dataclass(frozen=True)
class Tool:
    """One function of a request's ``tools``."""

    name: str
    description: str
    parameters: Mapping[str, Any]

    def schema(self) -> dict[str, Any]:
        """The JSON object the arguments must be."""
        p = dict(self.parameters)
        return p if p else {"type": "object"}

    def as_json(self) -> dict[str, Any]:
        return {"type": "function", "function": {"name": self.name,
                "description": self.description, "parameters": self.schema()}}  # fmt: skip


def parse_tools(tools: Any) -> list[Tool]:
    """OpenAI ``tools`` (``[{"type": "function", "function": {...}}]``), checked; a
    :class:`UsageError` names the entry and the field."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise UsageError("'tools' must be an array of {'type': 'function', 'function': ...}")
    if len(tools) > MAX_TOOLS:
        raise UsageError(f"too many tools: {len(tools)} (at most {MAX_TOOLS})")
    out: list[Tool] = []
    seen: set[str] = set()
    for i, t in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(t, dict) or t.get("type", "function") != "function":
            raise UsageError(f"{where}: must be an object with 'type': 'function'")
        fn = t.get("function")
        if not isinstance(fn, dict):
            raise UsageError(f"{where}.function: must be an object")
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise UsageError(f"{where}.function.name: must be 1 to 128 letters, digits, "
                             "'_', '.', ':' or '-'")  # fmt: skip
        if name in seen:
            raise UsageError(f"{where}.function.name: {name!r} is defined twice")
        seen.add(name)
        desc = fn.get("description", "")
        if desc is None:
            desc = ""
        if not isinstance(desc, str):
            raise UsageError(f"{where}.function.description: must be a string")
        params = fn.get("parameters") or {}
        if not isinstance(params, dict):
            raise UsageError(f"{where}.function.parameters: must be a JSON schema object")
        out.append(Tool(name, desc, params))
    return out


def parse_tool_choice(choice: Any, tools: list[Tool]) -> tuple[str, list[Tool]]:
    """``(mode, tools)``: mode ``auto``, ``required`` or ``none``; a named function is
    ``required`` with that one tool."""
    if choice is None:
        return ("auto" if tools else "none"), tools
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise UsageError("'tool_choice' must be 'auto', 'none', 'required' or "
                             "{'type': 'function', 'function': {'name': ...}}")  # fmt: skip
        if choice == "required" and not tools:
            raise UsageError("'tool_choice' is 'required' but no 'tools' are given")
        return choice, tools
    fn = choice.get("function") if isinstance(choice, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        raise UsageError("'tool_choice' must be 'auto', 'none', 'required' or "
                         "{'type': 'function', 'function': {'name': ...}}")  # fmt: skip
    named = [t for t in tools if t.name == name]
    if not named:
        raise UsageError(f"'tool_choice' names {name!r}, which is not one of the 'tools'")
    return "required", named


def new_call_id(length: int = 32) -> str:
    """llama-server's tool call id: 32 random letters and digits."""
    return "".join(secrets.choice(_ID_CHARS) for _ in range(length))


# ---------------------------------------------------------------------------- replies
@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text of the arguments object
    id: str = ""

    def as_json(self, index: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {} if index is None else {"index": index}
        out.update(type="function", id=self.id,
                   function={"name": self.name, "arguments": self.arguments})  # fmt: skip
        return out


@dataclass
class Reply:
    """A parsed chat reply."""

    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)

    def message(self) -> dict[str, Any]:
        """The OpenAI ``message`` (llama-server's field order)."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.content or None}
        if not self.tool_calls and msg["content"] is None:
            msg["content"] = ""
        if self.reasoning:
            msg["reasoning_content"] = self.reasoning
        if self.tool_calls:
            msg["tool_calls"] = [c.as_json() for c in self.tool_calls]
        return msg


class ToolSyntaxError(ValueError):
    """The text after a format's trigger is not a well-formed call."""


def _args_text(args: Any) -> str:
    if isinstance(args, str):
        _decode(args)  # must be JSON text itself
        return args
    if not isinstance(args, dict):
        raise ToolSyntaxError("the arguments are not a JSON object")
    return json.dumps(args, ensure_ascii=False)


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


class _Unfinished(Exception):
    """The text ends before the structure being read does (a reply still streaming)."""


@dataclass
class PartialCall:
    """A call as far as it has been read: ``args`` is the arguments' JSON text so far, a
    prefix of the final text (whole once ``done``)."""

    name: str
    args: str = ""
    id: str = ""
    done: bool = False


# a JSON string (whole), a bracket, or a lone quote (a string the text ends in)
_JSON_STRUCT = re.compile(r'"[^"\\]*+(?:\\.[^"\\]*+)*+"|[{}\[\]"]')  # no backtracking
_JSON_SCALAR = re.compile(r"[A-Za-z0-9.+-]+")


def _value_end(text: str, i: int) -> int | None:
    """Where the JSON value at ``text[i]`` ends (None: the text ends first). Only the
    structure is followed; the value is checked by ``json.loads`` once whole."""
    if i >= len(text):
        return None
    if text[i] in '"{[':
        depth = 0
        for m in _JSON_STRUCT.finditer(text, i):
            t = m.group()
            if t == '"':
                return None
            if t[0] != '"':
                depth += 1 if t in "{[" else -1
            if depth == 0:
                return m.end()
        return None
    m = _JSON_SCALAR.match(text, i)
    if m is None:
        raise ToolSyntaxError(f"unexpected {text[i]!r} in JSON at character {i}")
    return m.end() if m.end() < len(text) else None


_ESC_TAIL = re.compile(r"\\(?:u[0-9A-Fa-f]{0,3})?$")  # an escape the text ends inside
_HIGH_SURROGATE = re.compile(r"\\u[dD][89abAB][0-9A-Fa-f]{2}$")


def _string_so_far(text: str, i: int) -> str | None:
    """The certain prefix of the JSON string that starts at ``text[i]`` and is unfinished
    (None: not a string, or not valid so far). An escape the text ends inside, or the first
    half of a surrogate pair, waits for the next text."""
    if not text.startswith('"', i):
        return None
    body = text[i + 1 :]
    m = _ESC_TAIL.search(body)
    if m is not None:
        # an even run of backslashes before the tail's: the tail's opens an escape
        run = len(body[: m.start()]) - len(body[: m.start()].rstrip("\\"))
        if run % 2 == 0:
            body = body[: m.start()]
    body = _HIGH_SURROGATE.sub("", body)
    try:
        return json.loads('"' + body + '"')
    except json.JSONDecodeError:
        return None


def _decode(raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError as e:
        raise ToolSyntaxError(f"malformed JSON in a tool call: {e.msg}") from None


def _object_fields(text: str, i: int) -> tuple[list[tuple[str, int, int | None]], int | None]:
    """The fields of the JSON object at ``text[i]`` read so far, ``(key, value start, value
    end or None)``, and the index past the object (None: unfinished)."""
    fields: list[tuple[str, int, int | None]] = []
    if i >= len(text):
        return fields, None
    if text[i] != "{":
        raise ToolSyntaxError(f"expected a JSON object at character {i}")
    j = _skip_ws(text, i + 1)
    if text.startswith("}", j):
        return fields, j + 1
    while j < len(text):
        if text[j] != '"':
            raise ToolSyntaxError(f"expected a key at character {j}")
        end = _value_end(text, j)
        if end is None:
            break
        key = _decode(text[j:end])
        j = _skip_ws(text, end)
        if j >= len(text):
            break
        if text[j] != ":":
            raise ToolSyntaxError(f"expected ':' at character {j}")
        j = _skip_ws(text, j + 1)
        if j >= len(text):
            break
        end = _value_end(text, j)
        fields.append((key, j, end))
        if end is None:
            break
        j = _skip_ws(text, end)
        if j < len(text) and text[j] == "}":
            return fields, j + 1
        if j < len(text) and text[j] != ",":
            raise ToolSyntaxError(f"expected ',' or '}}' at character {j}")
        j = _skip_ws(text, j + 1)
    return fields, None


def _set_args(call: PartialCall, text: str, start: int, end: int | None) -> None:
    """The arguments value at ``text[start:end]`` (end None: unfinished). An object is kept
    as written, and streams as it grows; JSON text in a string is decoded once whole."""
    if end is None:
        call.args = text[start:] if text.startswith("{", start) else ""
        return
    call.args = _args_as_written(text[start:end])


def _args_as_written(raw: str) -> str:
    """Whole arguments JSON ``raw``: an object is kept as written, JSON text in a string is
    decoded (it must be an object itself)."""
    value = _decode(raw)
    if isinstance(value, dict):
        return raw
    if isinstance(value, str):
        return _args_text(value)
    raise ToolSyntaxError("the arguments are not a JSON object")


def _json_args(text: str, i: int, calls: list[PartialCall], name: str, id: str = "") -> int:
    """A call of ``name`` whose arguments are the JSON object at ``text[i:]`` (after
    blanks) is read into ``calls``; the index past the object."""
    call = PartialCall(name, id=id)
    calls.append(call)
    j = _skip_ws(text, i)
    if j >= len(text):
        raise _Unfinished
    if text[j] != "{":
        raise ToolSyntaxError(f"expected the arguments object at character {j}")
    end = _value_end(text, j)
    _set_args(call, text, j, end)
    if end is None:
        raise _Unfinished
    call.done = True
    return end


def _json_call(text: str, i: int, calls: list[PartialCall], args_keys: Sequence[str],
               name_key: str = "name", id_key: str = "id") -> int:  # fmt: skip
    """The call object at ``text[i:]`` (after blanks) is read into ``calls`` (once its name
    is known); the index past it."""
    i = _skip_ws(text, i)
    fields, end = _object_fields(text, i)
    spans = {k: (s, e) for k, s, e in reversed(fields)}  # the first of a repeated key
    name_span = spans.get(name_key, (0, None))
    if name_span[1] is None:
        if end is None:
            raise _Unfinished
        raise ToolSyntaxError(f"a tool call must be an object with a string {name_key!r}")
    name = _decode(text[name_span[0] : name_span[1]])
    if not isinstance(name, str):
        raise ToolSyntaxError(f"a tool call's {name_key!r} must be a string")
    call = PartialCall(name)
    s, e = spans.get(id_key, (0, None))
    if e is not None:
        call.id = str(_decode(text[s:e]) or "")
    calls.append(call)
    key = next((k for k in args_keys if k in spans), None)
    if key is not None:
        _set_args(call, text, *spans[key])
    if end is None:
        raise _Unfinished
    _decode(text[i:end])  # the whole object is well-formed JSON
    call.args = call.args or "{}"
    call.done = True
    return end


def _json_call_array(text: str, i: int, calls: list[PartialCall], args_keys: Sequence[str],
                     **keys: str) -> int:  # fmt: skip
    """A JSON array of call objects (or one object) at ``text[i:]``; the index past it."""
    i = _skip_ws(text, i)
    if i >= len(text):
        raise _Unfinished
    if text[i] == "{":
        return _json_call(text, i, calls, args_keys, **keys)
    if text[i] != "[":
        raise ToolSyntaxError(f"expected an array of calls at character {i}")
    j = _skip_ws(text, i + 1)
    while True:
        j = _skip_ws(text, _json_call(text, j, calls, args_keys, **keys))
        if j >= len(text):
            raise _Unfinished
        if text[j] == "]":
            return j + 1
        if text[j] != ",":
            raise ToolSyntaxError(f"expected ',' or ']' at character {j}")
        j += 1


def _lit(text: str, i: int, lit: str) -> int:
    """The index past ``lit`` at ``text[i:]`` (after blanks)."""
    i = _skip_ws(text, i)
    if text.startswith(lit, i):
        return i + len(lit)
    if lit.startswith(text[i:]):
        raise _Unfinished
    raise ToolSyntaxError(f"expected {lit!r} at character {i}")


def _more(text: str, i: int, opener: str, closing: str = "") -> bool:
    """After a call: whether another one follows (or may: the text ends in a part of
    ``opener``); other text after the calls (and their ``closing`` text) is an error."""
    rest = text[_skip_ws(text, i) :]
    if closing and rest.startswith(closing):
        rest = rest[len(closing) :].strip()
        if rest:
            raise ToolSyntaxError("text after the tool calls")
    if not rest:
        return False
    if rest.startswith(opener) or opener.startswith(rest):
        return True
    raise ToolSyntaxError("text after the tool calls")


def _header(text: str, i: int, pattern: re.Pattern[str], opener: str, close: str) -> re.Match[str]:
    """A call's header (``pattern``, which starts with ``opener`` and ends at ``close``) at
    ``text[i:]`` after blanks."""
    j = _skip_ws(text, i)
    m = pattern.match(text, j)
    if m is not None:
        return m
    rest = text[j:]
    if opener.startswith(rest) or (rest.startswith(opener) and close not in rest[len(opener) :]):
        raise _Unfinished
    raise ToolSyntaxError(f"expected {opener!r} at character {j}")


def gbnf_literal(text: str) -> str:
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def gbnf_until(g: GrammarBuilder, name: str, stop: str) -> str:
    """A rule for any text that does not contain ``stop`` (it may end with a proper prefix
    of ``stop`` only where the following rule continues it)."""

    def cls(ch: str) -> str:
        return "[^" + ("\\" + ch if ch in "]\\^-" else ch.replace("\n", "\\n")) + "]"

    alts = [cls(stop[0])]
    for k in range(1, len(stop)):
        alts.append(gbnf_literal(stop[:k]) + " " + cls(stop[k]))
    return g.rule(name, "(" + " | ".join(alts) + ")*")


class ToolFormat:
    """How one model family writes tool calls (see the module docstring)."""

    name = ""
    starts: tuple[str, ...] = ()  # text that opens a call (lazy-grammar triggers)
    patterns: tuple[str, ...] = ()  # trigger patterns (``^...$``: the whole reply)
    always_grammar = False  # the grammar holds from the first token, even with 'auto'
    id_length = 32  # the length of the ids given to calls the model wrote none for
    # what the family's template implies for every reply, tools or not:
    think = (THINK_START, THINK_END)  # the tags around reasoning
    dropped: tuple[str, ...] = ()  # marker texts taken out of the content
    opener = ""  # text a generation prompt ends with that the reply continues
    markers: tuple[str, ...] = ()  # special tokens whose text the reply keeps

    def trigger_patterns(self, tools: list[Tool]) -> tuple[str, ...]:
        """The lazy grammar's trigger patterns for these tools."""
        return self.patterns

    def calls_rule(self, g: GrammarBuilder, tools: list[Tool], parallel: bool) -> str:
        raise NotImplementedError

    def required_root(self, g: GrammarBuilder, calls: str, think_end: str | None) -> str:
        """The grammar of a whole reply that must call a tool (``think_end``: the prompt
        opened a reasoning block, which this tag closes)."""
        if think_end is None:
            return calls
        think = gbnf_until(g, "think-text", think_end)
        return g.rule("reasoning-then-calls", f"{think} {gbnf_literal(think_end)} space {calls}")

    def scan_calls(self, text: str, calls: list[PartialCall], tools: list[Tool]) -> None:
        """Read the calls in ``text`` (which starts with one of :attr:`starts`) into
        ``calls``; raises ``_Unfinished`` where the text ends first. A format that does not
        define it has its calls sent whole when the reply ends."""
        raise NotImplementedError

    def parse_calls(self, text: str, tools: list[Tool]) -> list[ToolCall]:
        """The calls in ``text``, which starts with one of :attr:`starts`."""
        calls: list[PartialCall] = []
        try:
            self.scan_calls(text, calls, tools)
        except _Unfinished:
            raise ToolSyntaxError("the tool calls are unfinished") from None
        if not calls or not all(c.done for c in calls):
            raise ToolSyntaxError("no tool call")
        return [ToolCall(c.name, c.args, c.id) for c in calls]

    def stream_calls(self, text: str, tools: list[Tool]) -> list[PartialCall]:
        """The calls of an unfinished ``text`` as far as they are certain."""
        calls: list[PartialCall] = []
        try:
            self.scan_calls(text, calls, tools)
        except (_Unfinished, ToolSyntaxError, NotImplementedError):
            pass
        return calls

    def find_start(self, text: str) -> int:
        """Where the first call begins in ``text`` (-1: none)."""
        hits = [i for i in (text.find(s) for s in self.starts) if i >= 0]
        return min(hits) if hits else -1


def _call_objects(g: GrammarBuilder, tools: list[Tool], prefix: str, args_key: str,
                  extra: Mapping[str, Any] | None = None) -> str:  # fmt: skip
    """A rule for ``{"name": NAME, args_key: {...}}`` of any of ``tools``."""
    alts = []
    for t in tools:
        props: dict[str, Any] = {"name": {"const": t.name}, args_key: t.schema()}
        props.update(extra or {})
        schema = {"type": "object", "properties": props, "required": list(props),
                  "additionalProperties": False}  # fmt: skip
        alts.append(g.schema(schema, f"{prefix}-{_rule_name(t.name)}"))
    return g.rule(f"{prefix}-call", " | ".join(alts))


def _rule_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9-]+", "-", name)


def _one_call(g: GrammarBuilder, tools: list[Tool], call: Callable[[Tool, str], str]) -> str:
    """The rule for one call of any of ``tools`` whose arguments are a JSON object:
    ``call(tool, args)`` writes the call around the rule of the tool's arguments."""
    alts = []
    for t in tools:
        args = g.schema(t.schema(), f"tool-{_rule_name(t.name)}-args")
        alts.append(g.rule(f"tool-{_rule_name(t.name)}", call(t, args)))
    return g.rule("tool-call", " | ".join(alts))


class Hermes(ToolFormat):
    name = "hermes"
    starts = ("<tool_call>",)

    def calls_rule(self, g: GrammarBuilder, tools: list[Tool], parallel: bool) -> str:
        obj = _call_objects(g, tools, "tool", "arguments")
        one = g.rule("tool-call", f'"<tool_call>" space {obj} space "</tool_call>"')
        return g.rule("tool-calls", f"{one} (space {one})*" if parallel else one)

    def scan_calls(self, text: str, calls: list[PartialCall], tools: list[Tool]) -> None:
        i = 0
        while True:
            i = _json_call(text, _lit(text, i, "<tool_call>"), calls, ("arguments", "parameters"))
            i = _lit(text, i, "</tool_call>")
            if not _more(text, i, "<tool_call>"):
                return


def _tagged_args(g: GrammarBuilder, t: Tool, arg: Callable[[str, str, bool], str]) -> str:
    """The arguments of a call of ``t`` in a tagged format (one element per parameter):
    the required parameters in order, then any of the optional ones. ``arg(name, rule,
    text)`` writes a parameter's element around its value's ``rule`` (``text``: the value
    is written as it is, not as JSON)."""
    tn = _rule_name(t.name)
    required, optional = [], []
    req = set(t.schema().get("required") or [])
    for pname, pschema in (t.schema().get("properties") or {}).items():
        text = _is_string_schema(pschema)
        value = "" if text else g.schema(pschema, f"tool-{tn}-arg-{_rule_name(pname)}-value")
        r = g.rule(f"tool-{tn}-arg-{_rule_name(pname)}", arg(pname, value, text))
        (required if pname in req else optional).append(r)
    body = " ".join(required)
    if optional:
        body += " (" + " | ".join(optional) + ")*"
    return body


class Qwen3Coder(ToolFormat):
    name = "qwen3-coder"
    starts = ("<tool_call>",)
    _ARG_END = "\n</parameter>\n"

    def calls_rule(self, g: GrammarBuilder, tools: list[Tool], parallel: bool) -> str:
        # a text value never holds "</parameter>" (the format could not be read back)
        text_arg = g.rule("xml-arg-string", gbnf_until(g, "xml-arg-text", "</parameter>")
                          + ' "</parameter>\\n"')  # fmt: skip

        def arg(pname: str, value: str, text: bool) -> str:
            head = gbnf_literal(f"<parameter={pname}>" + "\n")
            return f"{head} {text_arg}" if text else f"{head} {value} {end}"

        end = gbnf_literal(self._ARG_END)
        fns = []
        for t in tools:
            opener = gbnf_literal(f"<function={t.name}>" + "\n")
            body = _tagged_args(g, t, arg)
            fns.append(g.rule(f"tool-{_rule_name(t.name)}", f'{opener} {body} "</function>\\n"'))
        one = g.rule("tool-call", f'"<tool_call>\\n" ({" | ".join(fns)}) "</tool_call>" space')
        return g.rule("tool-calls", f"{one}+" if parallel else one)

    _FUNCTION = re.compile(r"<function=([^>\n]+)>\n?")
    _PARAM = re.compile(r"<parameter=([^>\n]+)>")

    def scan_calls(self, text: str, calls: list[PartialCall], tools: list[Tool]) -> None:
        by_name = {t.name: t for t in tools}
        i = 0
        while True:
            m = _header(text, _lit(text, i, "<tool_call>"), self._FUNCTION, "<function=", ">")
            call = PartialCall(m.group(1).strip())
            calls.append(call)
            t = by_name.get(call.name)
            props = t.schema().get("properties", {}) if t is not None else {}
            i = _xml_args(text, m.end(), call, props, self._PARAM, "<parameter=",
                          "</parameter>", "</function>")  # fmt: skip
            i = _lit(text, i, "</tool_call>")
            if not _more(text, i, "<tool_call>"):
                return


def _xml_args(text: str, i: int, call: PartialCall, props: Mapping[str, Any],
              head: re.Pattern[str], opener: str, close: str, end: str,
              head_close: str = ">", strip: bool = True) -> int:  # fmt: skip
    """Tagged parameters (``head`` = ``opener``NAME...``head_close``, a value, ``close``)
    up to ``end``, into ``call.args`` as the JSON object they make (text values as strings,
    others as JSON when they parse); the index past ``end``. With ``strip`` a value loses
    one new line on each side. While the text is unfinished ``call.args`` is the object's
    certain prefix: a text value grows with the text."""
    parts: list[str] = []
    while True:
        j = _skip_ws(text, i)
        if text.startswith(end, j):
            call.args = "{" + ", ".join(parts) + "}"
            call.done = True
            return j + len(end)
        call.args = "{" + ", ".join(parts)
        if end.startswith(text[j:]):
            raise _Unfinished
        m = _header(text, j, head, opener, head_close)
        pname = m.group(1).strip()
        key = json.dumps(pname, ensure_ascii=False) + ": "
        schema = props.get(pname)
        v = m.end() + (strip and text.startswith("\n", m.end()))
        k = text.find(close, v)
        if k < 0:
            if _is_string_schema(schema):
                held = ("\n" + close, close) if strip else (close,)
                raw = text[v : len(text) - _held(text[v:], held)]
                key += '"' + json.dumps(raw, ensure_ascii=False)[1:-1]
            call.args = "{" + ", ".join([*parts, key])
            raise _Unfinished
        raw = text[v:k]
        raw = raw[:-1] if strip and raw.endswith("\n") else raw
        parts.append(key + json.dumps(_xml_value(raw, schema), ensure_ascii=False))
        i = k + len(close)


def _schema_types(schema: Any) -> set[str]:
    if not isinstance(schema, dict):
        return set()
    t = schema.get("type")
    if isinstance(t, str):
        return {t}
    if isinstance(t, list):
        return {x for x in t if isinstance(x, str)}
    if "enum" in schema and all(isinstance(x, str) for x in schema["enum"]):
        return {"string"}
    return set()


def _is_string_schema(schema: Any) -> bool:
    """A parameter written as raw text (its schema allows strings, or says nothing)."""
    types = _schema_types(schema)
    return not types or "string" in types


def _xml_value(raw: str, schema: Any) -> Any:
    if _schema_types(schema) and not _is_string_schema(schema):
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw
    return raw


class JsonArray(ToolFormat):
    """A marker, then a JSON array of ``{"name", "arguments"}`` objects (``extra`` fields
    too): Mistral's ``[TOOL_CALLS]``, Granite's ``<|tool_call|>``."""

    marker = ""
    extra: ClassVar[Mapping[str, Any]] = {}

    @property
    def starts(self) -> tuple[str, ...]:  # type: ignore[override]
        return (self.marker,)

    def calls_rule(self, g: GrammarBuilder, tools: list[Tool], parallel: bool) -> str:
        obj = _call_objects(g, tools, "tool", "arguments", self.extra)
        items = f'{obj} ("," space {obj})*' if parallel else obj
        return g.rule("tool-calls", f'{gbnf_literal(self.marker)} "[" space {items} space "]"')

    def scan_calls(self, text: str, calls: list[PartialCall], tools: list[Tool]) -> None:
        i = _json_call_array(text, _lit(text, 0, self.marker), calls, ("arguments", "parameters"))
        if text[i:].strip():
            raise ToolSyntaxError(f"text after the {self.marker} array")


class Mistral(JsonArray):
    name, marker = "mistral", "[TOOL_CALLS]"
    id_length = 9  # its templates refuse other ids in the history
    extra: ClassVar[Mapping[str, Any]] = {"id": {"type": "string", "pattern": "^[a-zA-Z0-9]{9}$"}}


class Granite(JsonArray):
    """IBM Granite 3.x."""

    name, marker = "granite", "<|tool_call|>"


class DeepSeekR1(ToolFormat):
    """DeepSeek R1 (and its distills): calls between ``<｜tool▁calls▁begin｜>`` and
    ``<｜tool▁calls▁end｜>``, each ``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME`` and
    its arguments in a json code block."""

    name = "deepseek-r1"
    CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
    CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
    starts = (CALLS_BEGIN, CALL_BEGIN)

    def __init__(self, v31: bool = False) -> None:
        self.v31 = v31  # DeepSeek V3.1: NAME<｜tool▁sep｜>{json}, no "function", no code block
        if v31:
            self.name = "deepseek-v3.1"

    def calls_rule(self, g: GrammarBuilder, tools: list[Tool], parallel: bool) -> str:

        def call(t: Tool, args: str) -> str:
            if self.v31:
                head = gbnf_literal(f"{self.CALL_BEGIN}{t.name}{self.SEP}")
                return f"{head} {args} {gbnf_literal(self.CALL_END)}"
            head = gbnf_literal(f"{self.CALL_BEGIN}function{self.SEP}{t.name}\n```json\n")
            return f"{head} {args} {gbnf_literal(f'{chr(10)}```{self.CALL_END}')}"

        one = _one_call(g, tools, call)
        calls = f"{one} (space {one})*" if parallel else one
        return g.rule("tool-calls", f"{gbnf_literal(self.CALLS_BEGIN)} space {calls} space "
                      f"{gbnf_literal(self.CALLS_END)}")  # fmt: skip

    _HEAD = re.compile(
        r"<｜tool▁call▁begin｜>\s*function\s*<｜tool▁sep｜>([^\n]+)\n```(?:json)?\s*(?=\{)"
    )
    _HEAD_V31 = re.compile(r"<｜tool▁call▁begin｜>\s*([^<\n]+?)\s*<｜tool▁sep｜>")

    def scan_calls(self, text: str, calls: list[PartialCall], tools: list[Tool]) -> None:
        i = _skip_ws(text, 0)
        if text.startswith(self.CALLS_BEGIN, i):
            i += len(self.CALLS_BEGIN)
        head, close = (self._HEAD_V31, self.SEP) if self.v31 else (self._HEAD, "{")
        while True:
            m = _header(text, i, head, self.CALL_BEGIN, close)
            i = _json_args(text, m.end(), calls, m.group(1).strip())
            if not self.v31:
                i = _lit(text, i, "```")
            i = _lit(text, i, self.CALL_END)
            if not _more(text, i, self.CALL_BEGIN, self.CALLS_END):
                return


class Glm(ToolFormat):
    """GLM 4.5-4.7, Ling 3, Laguna, Spark: ``<tool_call>NAME`` then ``<arg_key>K</arg_key>
    <arg_value>V</arg_value>`` pairs (text values as they are, others as JSON), then
    ``</tool_call>``."""

    name = "glm"
    starts = ("<tool_call>",)

    def calls_rule(self, g: GrammarBuilder, tools: list[Tool], parallel: bool) -> str:
        text_value = g.rule("glm-arg-text", gbnf_until(g, "glm-text", "</arg_value>"))

        def arg(pname: str, value: str, text: bool) -> str:
            return (f'space "<arg_key>" {gbnf_literal(pname)} "</arg_key>" space '
                    f'"<arg_value>" {text_value if text else value} "</arg_value>"')  # fmt: skip

        fns = []
        for t in tools:
            body = _tagged_args(g, t, arg)
            fns.append(g.rule(f"tool-{_rule_name(t.name)}", f"{gbnf_literal(t.name)} {body} space"))
        one = g.rule("tool-call", f'"<tool_call>" ({" | ".join(fns)}) "</tool_call>"')
        return g.rule("tool-calls", f"{one} (space {one})*" if parallel else one)

    _NAME = re.compile(r"<tool_call>\s*([^\s<]+)(?=[\s<])")
    _NAME_SO_FAR = re.compile(r"<tool_call>\s*[^\s<]*")
    _ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>", re.DOTALL)

    def scan_calls(self, text: str, calls: list[PartialCall], tools: list[Tool]) -> None:
        by_name = {t.name: t for t in tools}
        i = 0
        while True:
            j = _skip_ws(text, i)
            m = self._NAME.match(text, j)
            if m is None:
                rest = text[j:]
                if "<tool_call>".startswith(rest) or self._NAME_SO_FAR.fullmatch(rest):
                    raise _Unfinished
                raise ToolSyntaxError(f"expected '<tool_call>NAME' at character {j}")
            call = PartialCall(m.group(1))
            calls.append(call)
            t = by_name.get(call.name)
            props = t.schema().get("properties", {}) if t is not None else {}
            # values as written (no new line stripped), as llama.cpp reads GLM's
            i = _xml_args(text, m.end(), call, props, self._ARG, "<arg_key>", "</arg_value>",
                          "</tool_call>", head_close="<arg_value>", strip=False)  # fmt: skip
            if not _more(text, i, "<tool_call>"):
                return


class FunctionaryV31(ToolFormat):
    """Functionary v3.1 (Llama 3.1 based): ``<function=NAME>{json}</function>``."""

    name = "functionary-v3.1"
    starts = ("<function=",)

    def calls_rule(self, g: GrammarBuilder, tools: list[Tool], parallel: bool) -> str:
        one = _one_call(g, tools, lambda t, args: (f"{gbnf_literal(f'<function={t.name}>')} "
                                                   f'{args} "</function>"'))  # fmt: skip
        return g.rule("tool-calls", f"{one} (space {one})*" if parallel else one)

    _CALL = re.compile(r"<function=([^>]+)>")

    def scan_calls(self, text: str, calls: list[PartialCall], tools: list[Tool]) -> None:
        i = 0
        while True:
            m = _header(text, i, self._CALL, "<function=", ">")
            i = _lit(text, _json_args(text, m.end(), calls, m.group(1)), "</function>")
            if not _more(text, i, "<function="):
                return


class Llama3(ToolFormat):
    name = "llama3"
    starts = ("<|python_tag|>",)
    patterns = (r'^\s*(\{\s*"name"\s*:\s*")[\s\S]*$',)

    def calls_rule(self, g: GrammarBuilder, tools: list[Tool], parallel: bool) -> str:
        obj = _call_objects(g, tools, "tool", "parameters")
        return g.rule("tool-calls", f'("<|python_tag|>")? {obj}')

    def find_start(self, text: str) -> int:
        i = text.find("<|python_tag|>")
        if i >= 0:
            return i
        j = _skip_ws(text, 0)
        return j if re.match(r'\{\s*"name"\s*:', text[j:]) else -1

    def scan_calls(self, text: str, calls: list[PartialCall], tools: list[Tool]) -> None:
        i = _skip_ws(text, 0)
        if text.startswith("<|python_tag|>", i):
            i += len("<|python_tag|>")
        while True:
            i = _skip_ws(text, _json_call(text, i, calls, ("parameters", "arguments")))
            if i < len(text) and text[i] == ";":
                i += 1
                continue
            if text[i:].strip():
                raise ToolSyntaxError("text after the tool call")
            return


class CommandR7B(ToolFormat):
    """Command R7B: ``<|START_ACTION|>[{"tool_call_id": "0", "tool_name": NAME,
    "parameters": {...}}, ...]<|END_ACTION|>``; reasoning between ``<|START_THINKING|>``
    and ``<|END_THINKING|>``, the answer between ``<|START_RESPONSE|>`` and
    ``<|END_RESPONSE|>``."""

    name = "command-r7b"
    ACTION, ACTION_END = "<|START_ACTION|>", "<|END_ACTION|>"
    starts = (ACTION,)
    think = ("<|START_THINKING|>", "<|END_THINKING|>")
    dropped = ("<|START_RESPONSE|>", "<|END_RESPONSE|>")
    markers = (*think, *dropped, ACTION, ACTION_END)

    def calls_rule(self, g: GrammarBuilder, tools: list[Tool], parallel: bool) -> str:
        alts = []
        for t in tools:
            props = {"tool_call_id": {"type": "string", "pattern": "^[0-9]{1,10}$"},
                     "tool_name": {"const": t.name}, "parameters": t.schema()}  # fmt: skip
            schema = {"type": "object", "properties": props, "required": list(props),
                      "additionalProperties": False}  # fmt: skip
            alts.append(g.schema(schema, f"tool-{_rule_name(t.name)}"))
        obj = g.rule("tool-call", " | ".join(alts))
        items = f'{obj} ("," space {obj})*' if parallel else obj
        return g.rule("tool-calls", f'{gbnf_literal(self.ACTION)} "[" space {items} space "]" '
                      f"{gbnf_literal(self.ACTION_END)}")  # fmt: skip

    def required_root(self, g: GrammarBuilder, calls: str, think_end: str | None) -> str:
        start, end = self.think
        block = f"{gbnf_until(g, 'think-text', end)} {gbnf_literal(end)}"
        if think_end is None:  # the model may still think first
            block = f"({gbnf_literal(start)} {block})?"
        return g.rule("reasoning-then-calls", f"{block} space {calls}")

    def scan_calls(self, text: str, calls: list[PartialCall], tools: list[Tool]) -> None:
        i = _json_call_array(text, _lit(text, 0, self.ACTION), calls, ("parameters",),
                             name_key="tool_name", id_key="tool_call_id")  # fmt: skip
        if text[i:].strip():
            i = _lit(text, i, self.ACTION_END)
        if text[i:].strip():
            raise ToolSyntaxError("text after the tool calls")


class Cohere2MoE(CommandR7B):
    """Cohere2 MoE: Command R7B's calls and reasoning, the answer between
    ``<|START_TEXT|>`` and ``<|END_TEXT|>``."""

    name = "cohere2moe"
    dropped = ("<|START_TEXT|>", "<|END_TEXT|>")
    markers = (*CommandR7B.think, *dropped, CommandR7B.ACTION, CommandR7B.ACTION_END)


class FunctionaryV32(ToolFormat):
    """Functionary v3.2: the generation prompt ends with ``>>>``; each part of the reply is
    a recipient and a new line, then ``all`` and text for the user, or a function's name
    and its JSON arguments; every further part starts with ``>>>``."""

    name = "functionary-v3.2"
    starts = (">>>",)
    opener = ">>>"
    dropped = (">>>all\n",)
    # '>>>' and a recipient that is not 'all' (and can no longer become it)
    _START = re.compile(r">>>(?!(?:a|al|all)?$)(?!all\n)")
    _CALL = re.compile(r">>>([^\n]+)\n")

    def trigger_patterns(self, tools: list[Tool]) -> tuple[str, ...]:
        names = "|".join(re.escape(t.name) for t in tools)
        return (f">>>(?:{names})\n", f"^(?:{names})\n")

    def calls_rule(self, g: GrammarBuilder, tools: list[Tool], parallel: bool) -> str:
        one = _one_call(g, tools, lambda t, args: f"{gbnf_literal(t.name + chr(10))} space {args}")
        g.rule("tool-calls-rest", f'{one} (">>>" {one})*' if parallel else one)
        return g.rule("tool-calls", '">>>"? tool-calls-rest')

    def required_root(self, g: GrammarBuilder, calls: str, think_end: str | None) -> str:
        text = gbnf_until(g, "content-text", ">>>")
        return g.rule("content-then-calls", f'("all\\n" {text} ">>>")? tool-calls-rest')

    def find_start(self, text: str) -> int:
        m = self._START.search(text)
        return m.start() if m else -1

    def scan_calls(self, text: str, calls: list[PartialCall], tools: list[Tool]) -> None:
        i = 0
        while True:
            m = _header(text, i, self._CALL, ">>>", "\n")
            name = m.group(1).strip()
            if name not in {t.name for t in tools}:  # 'all' (text), or not a call
                raise ToolSyntaxError(f"{name!r} is not one of the tools")
            i = _json_args(text, m.end(), calls, name)
            if not _more(text, i, ">>>"):
                return


class MiniMaxM2(ToolFormat):
    """MiniMax M2: ``<minimax:tool_call>``, then per call ``<invoke name="NAME">`` and its
    ``<parameter name="P">VALUE</parameter>`` elements (text values as they are, others as
    JSON), ``</invoke>``, then ``</minimax:tool_call>``."""

    name = "minimax-m2"
    BEGIN, END = "<minimax:tool_call>", "</minimax:tool_call>"
    starts = (BEGIN,)
    _INVOKE = re.compile(r'<invoke name="([^"]+)">')
    _PARAM = re.compile(r'<parameter name="([^"]+)">')

    def calls_rule(self, g: GrammarBuilder, tools: list[Tool], parallel: bool) -> str:
        text_value = gbnf_until(g, "minimax-arg-text", "</parameter>")

        def arg(pname: str, value: str, text: bool) -> str:
            head = gbnf_literal(f'<parameter name="{pname}">')
            return f'{head} {text_value if text else value} "</parameter>" space'

        fns = []
        for t in tools:
            head = gbnf_literal(f'<invoke name="{t.name}">')
            body = _tagged_args(g, t, arg)
            fns.append(g.rule(f"tool-{_rule_name(t.name)}", f'{head} space {body} "</invoke>"'))
        one = g.rule("tool-call", " | ".join(fns))
        calls = f"{one} (space {one})*" if parallel else one
        return g.rule("tool-calls", f"{gbnf_literal(self.BEGIN)} space {calls} space "
                      f"{gbnf_literal(self.END)}")  # fmt: skip

    def scan_calls(self, text: str, calls: list[PartialCall], tools: list[Tool]) -> None:
        by_name = {t.name: t for t in tools}
        i = _lit(text, 0, self.BEGIN)
        while True:
            m = _header(text, i, self._INVOKE, '<invoke name="', ">")
            call = PartialCall(m.group(1))
            calls.append(call)
            t = by_name.get(call.name)
            props = t.schema().get("properties", {}) if t is not None else {}
            i = _xml_args(text, m.end(), call, props, self._PARAM, '<parameter name="',
                          "</parameter>", "</invoke>")  # fmt: skip
            if not _more(text, i, "<invoke", self.END):
                return


class KimiK2(ToolFormat):
    """Kimi K2: ``<|tool_calls_section_begin|>``, then per call ``<|tool_call_begin|>
    functions.NAME:INDEX<|tool_call_argument_begin|>{...}<|tool_call_end|>`` (the
    ``functions.NAME:INDEX`` text is the call's id), then ``<|tool_calls_section_end|>``."""

    name = "kimi-k2"
    SECTION, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
    CALL, ARGS, CALL_END = (
        "<|tool_call_begin|>",
        "<|tool_call_argument_begin|>",
        "<|tool_call_end|>",
    )
    starts = (SECTION, CALL)
    markers = (SECTION, SECTION_END, CALL, ARGS, CALL_END, THINK_START, THINK_END)
    _CALL = re.compile(r"<\|tool_call_begin\|>\s*(functions\.([^:<\s]+):\d+)\s*"
                       r"<\|tool_call_argument_begin\|>")  # fmt: skip

    def calls_rule(self, g: GrammarBuilder, tools: list[Tool], parallel: bool) -> str:
        one = _one_call(g, tools, lambda t, args: (
            f"{gbnf_literal(f'{self.CALL}functions.{t.name}:')} [0-9]+ "
            f"{gbnf_literal(self.ARGS)} {args} {gbnf_literal(self.CALL_END)}?"))  # fmt: skip
        calls = f"{one} (space {one})*" if parallel else one
        return g.rule("tool-calls", f"({gbnf_literal(self.SECTION)} space)? {calls} "
                      f"(space {gbnf_literal(self.SECTION_END)})?")  # fmt: skip

    def scan_calls(self, text: str, calls: list[PartialCall], tools: list[Tool]) -> None:
        i = _skip_ws(text, 0)
        if text.startswith(self.SECTION, i):
            i += len(self.SECTION)
        while True:
            m = _header(text, i, self._CALL, self.CALL, self.ARGS)
            i = _skip_ws(text, _json_args(text, m.end(), calls, m.group(2), m.group(1)))
            if text.startswith(self.CALL_END, i):
                i = _skip_ws(text, i + len(self.CALL_END))
            if not _more(text, i, self.CALL, self.SECTION_END):
                return


GENERIC_INSTRUCTION = ("Respond in JSON format, either with `tool_call` (a request to call "
                       "tools) or with `response` reply to the user's request")  # fmt: skip


class Generic(ToolFormat):
    name = "generic"
    always_grammar = True

    def calls_rule(self, g: GrammarBuilder, tools: list[Tool], parallel: bool) -> str:
        raise NotImplementedError  # see grammar()

    def schema(self, tools: list[Tool], required: bool, parallel: bool) -> dict[str, Any]:
        calls = [{"type": "object", "properties": {"name": {"const": t.name},
                  "arguments": t.schema()}, "required": ["name", "arguments"]}
                 for t in tools]  # fmt: skip
        call = calls[0] if len(calls) == 1 else {"anyOf": calls}
        if parallel:
            wrap = {
                "type": "object",
                "properties": {"tool_calls": {"type": "array", "items": call, "minItems": 1}},
                "required": ["tool_calls"],
            }
        else:
            wrap = {"type": "object", "properties": {"tool_call": call},
                    "required": ["tool_call"]}  # fmt: skip
        if required:
            return wrap
        response = {"type": "object", "properties": {"response": {"type": "string"}},
                    "required": ["response"]}  # fmt: skip
        return {"anyOf": [wrap, response]}

    def find_start(self, text: str) -> int:
        return _skip_ws(text, 0) if text.strip() else -1

    def response_so_far(self, text: str) -> str | None:
        """The ``response`` of the reply ``text`` as far as it is certain (None: the reply
        is not, or not yet, a response)."""
        try:
            fields, _ = _object_fields(text, _skip_ws(text, 0))
        except ToolSyntaxError:
            return None
        if not fields or fields[0][0] != "response":
            return None
        _, start, end = fields[0]
        if end is None:
            return _string_so_far(text, start)
        value = json.loads(text[start:end]) if text.startswith('"', start) else None
        return value if isinstance(value, str) else None

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        obj = _decode(text.strip())
        if not isinstance(obj, dict):
            raise ToolSyntaxError("the reply is not one JSON object")
        if "tool_call" in obj or "tool_calls" in obj:
            return "", self.parse_calls(text, [])
        if isinstance(obj.get("response"), str):
            return obj["response"], []
        raise ToolSyntaxError("the reply has neither 'tool_call' nor 'response'")

    def scan_calls(self, text: str, calls: list[PartialCall], tools: list[Tool]) -> None:
        fields, end = _object_fields(text, _skip_ws(text, 0))
        for key, start, _ in fields:
            if key == "tool_call":
                _json_call(text, start, calls, ("arguments",))
            elif key == "tool_calls":
                _json_call_array(text, start, calls, ("arguments",))
        if end is None:
            raise _Unfinished
        if text[end:].strip():
            raise ToolSyntaxError("text after the JSON reply")


# ---------------------------------------------------------------------------- gpt-oss
HARMONY_TOKENS = ("<|channel|>", "<|constrain|>", "<|message|>", "<|start|>", "<|end|>")
_H_START = "<|start|>assistant"
_H_HEADER = re.compile(
    r"(?:\s+to=([\w.-]+))?\s*<\|channel\|>(\w+)(?:\s+to=([\w.-]+))?"
    r"(?:\s*(?:<\|constrain\|>)?\s*[A-Za-z0-9_-]+)?\s*<\|message\|>"
)


def is_harmony(source: str) -> bool:
    """gpt-oss's template (messages in channels: analysis, commentary, final)."""
    return "<|channel|>" in source


@dataclass
class HarmonyMessage:
    channel: str
    recipient: str  # "" or e.g. "functions.get_weather"
    body: str
    raw: str  # the message as written, header included


def harmony_messages(text: str) -> tuple[list[HarmonyMessage], str]:
    """The assistant messages of a reply (the prompt ended with ``<|start|>assistant``) and
    the text that follows them unread (an unfinished header, or text in no message)."""
    out: list[HarmonyMessage] = []
    i = 0
    while i < len(text):
        if out and text.startswith(_H_START, i):
            i += len(_H_START)
        m = _H_HEADER.match(text, i)
        if m is None:
            break
        j = m.end()
        ends = [k for k in (text.find("<|end|>", j), text.find("<|start|>", j)) if k >= 0]
        k = min(ends) if ends else len(text)
        raw_end = k + len("<|end|>") if text.startswith("<|end|>", k) else k
        out.append(HarmonyMessage(m.group(2), m.group(1) or m.group(3) or "", text[j:k],
                                  text[i:raw_end]))  # fmt: skip
        i = raw_end
    return out, text[i:]


def harmony_reply(text: str, plan: ChatPlan, final: bool,
                  partial: list[PartialCall] | None = None) -> Reply:  # fmt: skip
    """Reasoning (analysis), content (final and commentary preambles) and calls (messages
    to ``functions.NAME``, arguments as written) of a gpt-oss reply; an unfinished reply
    gives what is certain, its calls so far in ``partial``."""
    msgs, rest = harmony_messages(text)
    reply = Reply()
    for m in msgs:
        if m.recipient.startswith("functions."):
            name, body = m.recipient[len("functions.") :], m.body.strip()
            if not final:
                if partial is not None:  # the body so far (blanks held: they may end it)
                    partial.append(PartialCall(name, body if body.startswith("{") else ""))
                continue
            try:
                args = _args_as_written(body)
            except ToolSyntaxError:
                reply.content += m.raw
                continue
            reply.tool_calls.append(ToolCall(name, args))
        elif m.recipient:
            continue  # a built-in tool the request did not offer
        elif m.channel == "analysis" and plan.reasoning:
            reply.reasoning += m.body
        elif m.channel == "analysis":
            reply.content += m.raw
        else:
            reply.content += m.body
    if final and rest.strip():
        reply.content += rest
    return reply


class Harmony(ToolFormat):
    """gpt-oss: a call is a message to ``functions.NAME`` (named in the role header or the
    channel header), its body the JSON arguments; the reply ends with ``<|call|>``."""

    name = "harmony"
    patterns = (
        r"^\s+to$",
        r"^<\|channel\|>(?:commentary|analysis)\s+to=functions$",
        r"<\|start\|>assistant(\s+to)",
        r"<\|start\|>assistant(<\|channel\|>(?:commentary|analysis)\s+to)",
    )

    def calls_rule(self, g: GrammarBuilder, tools: list[Tool], parallel: bool) -> str:
        chan = '("commentary" | "analysis")'
        constraint = g.rule("harmony-constraint",
                            '([ \\t\\n]* "<|constrain|>"? [A-Za-z0-9_-]+)?')  # fmt: skip
        alts = []
        for t in tools:
            tn = _rule_name(t.name)
            args = g.schema(t.schema(), f"tool-{tn}-args")
            to = gbnf_literal("to=functions." + t.name)
            role = f'[ \\t\\n]+ {to} "<|channel|>" {chan} {constraint} "<|message|>" {args}'
            channel = f'"<|channel|>" {chan} [ \\t\\n]+ {to} {constraint} "<|message|>" {args}'
            alts.append(g.rule(f"tool-{tn}", f"({role}) | ({channel})"))
        return g.rule("tool-call", " | ".join(alts))

    def required_root(self, g: GrammarBuilder, calls: str, think_end: str | None) -> str:
        body = gbnf_until(g, "harmony-text", "<|end|>")
        analysis = g.rule("harmony-analysis",
                          f'"<|channel|>analysis<|message|>" {body} "<|end|>" "{_H_START}"')  # fmt: skip
        return g.rule("harmony-reply", f"{analysis}* {calls}")

    def parse_calls(self, text: str, tools: list[Tool]) -> list[ToolCall]:
        raise NotImplementedError  # see harmony_reply

    def find_start(self, text: str) -> int:
        return -1


def detect_format(source: str) -> ToolFormat:
    """The tool format of a chat template (its text)."""
    if is_harmony(source):
        return Harmony()
    if ">>>all" in source and ">>>${recipient}" in source:
        return FunctionaryV32()
    if CommandR7B.ACTION in source and Cohere2MoE.dropped[0] in source:
        return Cohere2MoE()
    if CommandR7B.ACTION in source and CommandR7B.think[0] in source:
        return CommandR7B()
    if "<tool_call>" in source and "<function=" in source and "<parameter=" in source:
        return Qwen3Coder()
    if "<tool_call>" in source and "<arg_key>" in source:
        return Glm()
    if "<tool_call>" in source and "<invoke name=" not in source:
        return Hermes()
    if MiniMaxM2.BEGIN in source and "<invoke name=" in source and "]<]minimax[>[" not in source:
        return MiniMaxM2()
    if KimiK2.SECTION in source and KimiK2.CALL in source:
        return KimiK2()
    if "<｜tool▁calls▁begin｜>" in source:
        return DeepSeekR1(v31="```json" not in source)
    if "<function=" in source and "</function>" in source and "<parameter=" not in source:
        return FunctionaryV31()
    if "<|tool_call|>" in source:
        return Granite()
    if "[TOOL_CALLS]" in source and "[ARGS]" not in source and "[CALL_ID]" not in source:
        return Mistral()
    if "<|start_header_id|>" in source and ("<|python_tag|>" in source or "ipython" in source):
        return Llama3()
    return Generic()


# ---------------------------------------------------------------------------- plans
@dataclass
class ChatPlan:
    """What a chat request's tools and reasoning settings imply."""

    fmt: ToolFormat | None = None  # None: tools are not in play
    tools: list[Tool] = field(default_factory=list)
    mode: str = "none"  # auto | required | none
    parallel: bool = False
    reasoning: bool = True  # split reasoning blocks off (reasoning_format != none)
    legacy: bool = False  # deepseek-legacy: the reasoning block also stays in the content
    think: tuple[str, str] = (THINK_START, THINK_END)  # the reasoning block's tags
    think_open: bool = False  # the prompt ends inside a reasoning block
    dropped: tuple[str, ...] = ()  # marker texts taken out of the content
    opener: str = ""  # text a generation prompt may end with that the reply continues
    prefix: str = ""  # ... and that this prompt ends with (read with the reply)
    grammar: str | None = None
    lazy: bool = False
    trigger_words: tuple[str, ...] = ()
    trigger_patterns: tuple[str, ...] = ()
    preserved: tuple[str, ...] = ()  # special-token texts kept in the reply text
    harmony: bool = False  # gpt-oss: channels, not <think> blocks

    @property
    def active(self) -> bool:
        return self.fmt is not None

    def read_prompt(self, prompt: str) -> None:
        """What the rendered prompt implies for the reply: whether it opened a reasoning
        block, and whether it ends with text the reply continues."""
        self.think_open = prompt.rstrip().endswith(self.think[0])
        self.prefix = self.opener if self.opener and prompt.endswith(self.opener) else ""

    def build_grammar(self) -> None:
        fmt = self.fmt
        if fmt is None:
            return
        self.lazy = self.mode == "auto" and not fmt.always_grammar
        if self.lazy:
            self.trigger_words = fmt.starts
            self.trigger_patterns = fmt.trigger_patterns(self.tools)
        self.grammar = self._grammar_text(fmt)
        self.preserved += tuple(s for s in fmt.starts if s.startswith(("[", "<|")))

    def _grammar_text(self, fmt: ToolFormat) -> str:
        """The grammar's text, kept for the latest requests' tool sets (an agent sends the
        same tools every turn; 1,200 tools take ~0.4 s to convert)."""
        think_end = self.think[1] if self.think_open and not self.lazy else None
        key = (type(fmt), repr(vars(fmt)), self.mode, self.parallel, self.lazy, think_end,
               json.dumps([t.as_json() for t in self.tools], ensure_ascii=False))  # fmt: skip
        with _GRAMMARS_LOCK:
            text = _GRAMMARS.get(key)
            if text is not None:
                _GRAMMARS.move_to_end(key)
                return text
        g = GrammarBuilder()
        if isinstance(fmt, Generic):
            calls = g.schema(fmt.schema(self.tools, self.mode == "required", self.parallel),
                             "tool-reply")  # fmt: skip
        else:
            calls = fmt.calls_rule(g, self.tools, self.parallel)
        g.rule("root", calls if self.lazy else fmt.required_root(g, calls, think_end))
        text = g.grammar()
        with _GRAMMARS_LOCK:
            _GRAMMARS[key] = text
            while len(_GRAMMARS) > GRAMMAR_CACHE_SIZE:
                _GRAMMARS.popitem(last=False)
        return text


GRAMMAR_CACHE_SIZE = 8
_GRAMMARS: OrderedDict[tuple, str] = OrderedDict()
_GRAMMARS_LOCK = threading.Lock()


def plan_chat(source: str, tools: list[Tool], mode: str, *, parallel: bool,
              reasoning_format: str = "deepseek") -> ChatPlan:  # fmt: skip
    """The plan of a chat request for a template whose text is ``source`` (the prompt is
    rendered afterwards; see :func:`system_for_generic`, :meth:`ChatPlan.read_prompt` and
    :meth:`ChatPlan.build_grammar`)."""
    fmt = detect_format(source)
    plan = ChatPlan(
        reasoning=reasoning_format != "none",
        parallel=parallel,
        legacy=reasoning_format == "deepseek-legacy",
        think=fmt.think,
        dropped=fmt.dropped,
        opener=fmt.opener,
        preserved=fmt.markers,
    )
    if tools and mode != "none":
        plan.fmt, plan.tools, plan.mode = fmt, tools, mode
    if is_harmony(source):
        plan.harmony, plan.preserved = True, HARMONY_TOKENS
    return plan


def generic_messages(messages: list[dict[str, Any]], tools: list[Tool]) -> list[dict[str, Any]]:
    """The conversation as a template without tool support can render it: the tools and
    the JSON answer format in the system message, earlier tool calls as the assistant's
    JSON, tool results as user messages (``{"tool_response": ...}``)."""
    text = ("You can call any of the following tools to satisfy the user's requests: "
            + json.dumps([t.as_json() for t in tools], indent=2, ensure_ascii=False)
            + "\n\n" + GENERIC_INSTRUCTION)  # fmt: skip
    out: list[dict[str, Any]] = []
    for m in messages:
        role = m.get("role")
        if role == "tool":
            body = {"tool_response": {"tool": m.get("name") or m.get("tool_call_id") or "",
                                      "content": m.get("content")}}  # fmt: skip
            out.append({"role": "user", "content": json.dumps(body, ensure_ascii=False)})
            continue
        if role == "assistant" and m.get("tool_calls"):
            calls = []
            for tc in m["tool_calls"]:
                fn = tc.get("function", {}) if isinstance(tc, dict) else {}
                args = fn.get("arguments", {})
                if isinstance(args, str):
                    try:
                        args = json.loads(args)
                    except json.JSONDecodeError:
                        pass
                calls.append({"name": fn.get("name", ""), "arguments": args})
            body = {"tool_call": calls[0]} if len(calls) == 1 else {"tool_calls": calls}
            out.append({"role": "assistant", "content": json.dumps(body, ensure_ascii=False)})
            continue
        out.append(dict(m))
    if out and out[0].get("role") == "system" and isinstance(out[0].get("content"), str):
        out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + text}
    else:
        out.insert(0, {"role": "system", "content": text})
    return out


# ---------------------------------------------------------------------------- parsing
def split_reasoning(text: str, think_open: bool,
                    tags: tuple[str, str] = (THINK_START, THINK_END)) -> tuple[str, str, bool]:  # fmt: skip
    """``(reasoning, rest, closed)`` of a reply (closed: the block has ended)."""
    start, end = tags
    if not think_open:
        j = _skip_ws(text, 0)
        if not text.startswith(start, j):
            return "", text, True
        text = text[j + len(start) :]
    k = text.find(end)
    if k < 0:
        return text.strip(), "", False
    return text[:k].strip(), text[k + len(end) :].lstrip(), True


def _drop(text: str, markers: Sequence[str]) -> str:
    for m in markers:
        text = text.replace(m, "")
    return text


def parse_reply(text: str, plan: ChatPlan) -> Reply:
    """A finished reply's reasoning, content and tool calls (text that does not parse as
    the format's calls stays content)."""
    return _parse(plan.prefix + text, plan)


def _parse(text: str, plan: ChatPlan) -> Reply:
    """:func:`parse_reply` of a reply read with the prompt's :attr:`ChatPlan.prefix`."""
    if plan.harmony:
        reply = harmony_reply(text, plan, final=True)
        for c in reply.tool_calls:
            c.id = c.id or new_call_id()
        return reply
    reasoning = ""
    if plan.reasoning:
        reasoning, rest, _ = split_reasoning(text, plan.think_open, plan.think)
        text = text if plan.legacy else rest
    reply = Reply(_drop(text, plan.dropped), reasoning)
    fmt = plan.fmt
    if fmt is None:
        return reply
    at = fmt.find_start(text)
    if at < 0:
        return reply
    try:
        if isinstance(fmt, Generic):
            content, calls = fmt.parse(text[at:])
            reply.content = content
        else:
            calls = fmt.parse_calls(text[at:], plan.tools)
            reply.content = _drop(text[:at], plan.dropped).rstrip()
    except (ToolSyntaxError, json.JSONDecodeError, KeyError):
        if isinstance(fmt, Generic):  # cut short inside the response: what it says so far
            so_far = fmt.response_so_far(text[at:])
            reply.content = reply.content if so_far is None else so_far
        return reply
    for c in calls:
        c.id = c.id or new_call_id(fmt.id_length)
    reply.tool_calls = calls
    return reply


def _held(text: str, markers: Sequence[str]) -> int:
    """How many characters at the end of ``text`` could begin one of ``markers``."""
    best = 0
    for m in markers:
        for k in range(min(len(m) - 1, len(text)), best, -1):
            if text.endswith(m[:k]):
                best = k
                break
    return best


def _call_delta(index: int, arguments: str, call: PartialCall | None = None) -> dict[str, Any]:
    """A streamed ``tool_calls`` delta: the first of a call carries its id and name."""
    fn: dict[str, Any] = {"arguments": arguments}
    out: dict[str, Any] = {"index": index}
    if call is not None:
        out.update(id=call.id, type="function")
        fn = {"name": call.name, **fn}
    out["function"] = fn
    return {"tool_calls": [out]}


class ReplyStream:
    """Streamed deltas of a chat reply: ``feed(text)`` returns the ``reasoning_content``,
    ``content`` and ``tool_calls`` deltas that are certain, holding back text that may
    still become a marker. A call's first delta carries its id and name, the next ones
    add to its arguments as the model writes them (the formats that define
    :meth:`ToolFormat.scan_calls`; the others' calls come whole at the end). ``finish()``
    returns the last deltas and the whole :class:`Reply`, which the deltas add up to."""

    def __init__(self, plan: ChatPlan) -> None:
        self.plan = plan
        self.text = plan.prefix
        self.sent_reasoning = 0  # characters of the reasoning already sent
        self.sent_content = ""  # the content sent so far
        self.sent_calls: list[PartialCall] = []  # the calls as far as they were sent
        self.phase = "think?" if plan.reasoning and not plan.legacy else "content"
        if self.phase == "think?" and plan.think_open:
            self.phase = "think"
        self.think_at = len(self.text)  # where the reasoning starts in self.text
        self.content_at = len(self.text) if self.phase == "think" else 0
        self.calls_at = -1  # where the calls start
        self._hr = self._hc = ""  # gpt-oss: the reasoning and content sent so far

    def feed(self, text: str) -> list[dict[str, Any]]:
        self.text += text
        if self.plan.harmony:  # markers are whole special tokens: diff what is certain
            calls: list[PartialCall] = []
            now = harmony_reply(self.text, self.plan, final=False, partial=calls)
            return self._diff(now.reasoning, now.content) + self._call_deltas(calls)
        start, end_tag = self.plan.think
        out: list[dict[str, Any]] = []
        if self.phase == "think?":
            j = _skip_ws(self.text, 0)
            rest = self.text[j:]
            if rest.startswith(start):
                self.phase, self.think_at = "think", j + len(start)
            elif not rest or start.startswith(rest):
                return out
            else:
                self.phase = "content"
        if self.phase == "think":
            if self.sent_reasoning == 0:
                self.think_at = _skip_ws(self.text, self.think_at)
            body = self.text[self.think_at :]
            k = body.find(end_tag)
            end = k if k >= 0 else len(body) - _held(body, [end_tag])
            new = body[self.sent_reasoning : end]
            if k >= 0:
                new = new.rstrip()
            if new:
                out.append({"reasoning_content": new})
                self.sent_reasoning += len(new)
            if k < 0:
                return out
            self.phase = "content-ws"
            self.content_at = self.think_at + k + len(end_tag)
        if self.phase == "content-ws":
            j = _skip_ws(self.text, self.content_at)
            if j == len(self.text):
                return out
            self.content_at, self.phase = j, "content"
        if self.phase == "content":
            out += self._content()
        if self.phase == "calls":
            out += self._calls()
        return out

    def _content(self) -> list[dict[str, Any]]:
        body = self.text[self.content_at :]
        plan, fmt = self.plan, self.plan.fmt
        if fmt is None:
            end = len(body) - _held(body, plan.dropped)
        else:
            at = fmt.find_start(body)
            if at >= 0:
                end = at
                self.phase, self.calls_at = "calls", self.content_at + at
            elif (
                isinstance(fmt, Llama3)
                and not self.sent_content
                and (not body.strip() or body.lstrip().startswith("{"))
            ):
                return []  # may still be a whole-reply call
            else:
                end = len(body) - _held(body, fmt.starts + plan.dropped)
        content = _drop(body[:end], plan.dropped)
        if fmt is not None:  # blanks before a call are not content: hold them
            content = content.rstrip()
        new = content[len(self.sent_content) :]
        if not new:
            return []
        self.sent_content = content
        return [{"content": new}]

    def _calls(self) -> list[dict[str, Any]]:
        fmt = self.plan.fmt
        assert fmt is not None
        text = self.text[self.calls_at :]
        out = []
        if isinstance(fmt, Generic):  # one JSON object: a response, or calls
            response = fmt.response_so_far(text)
            if response is not None and len(response) > len(self.sent_content):
                out.append({"content": response[len(self.sent_content) :]})
                self.sent_content = response
        calls = fmt.stream_calls(text, self.plan.tools)
        return out + self._call_deltas(calls, fmt.id_length)

    def _call_deltas(self, calls: list[PartialCall], id_length: int = 32) -> list[dict[str, Any]]:
        """Deltas for what ``calls`` (as far as read) add to the calls sent so far."""
        out = []
        for i, c in enumerate(calls):
            if i == len(self.sent_calls):
                c.id = c.id or new_call_id(id_length)
                self.sent_calls.append(PartialCall(c.name, c.args, c.id))
                out.append(_call_delta(i, c.args, c))
                continue
            sent = self.sent_calls[i]
            if len(c.args) > len(sent.args) and c.args.startswith(sent.args):
                out.append(_call_delta(i, c.args[len(sent.args) :]))
                sent.args = c.args
        return out

    def _diff(self, reasoning: str, content: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if len(reasoning) > self.sent_reasoning and reasoning.startswith(self._hr):
            out.append({"reasoning_content": reasoning[self.sent_reasoning :]})
            self._hr, self.sent_reasoning = reasoning, len(reasoning)
        if len(content) > len(self.sent_content) and content.startswith(self._hc):
            out.append({"content": content[len(self.sent_content) :]})
            self._hc, self.sent_content = content, content
        return out

    def finish(self) -> tuple[list[dict[str, Any]], Reply]:
        reply = _parse(self.text, self.plan)
        sent = self.sent_calls
        calls = reply.tool_calls
        agrees = len(calls) >= len(sent) and all(
            c.name == s.name and c.arguments.startswith(s.args) for c, s in zip(calls, sent)
        )
        if not agrees:  # cut short inside a call: the reply is what was sent
            calls = [ToolCall(s.name, s.args, s.id) for s in sent]
            reply = Reply(self.sent_content, reply.reasoning, calls)
        out: list[dict[str, Any]] = []
        if self.plan.harmony:
            out = self._diff(reply.reasoning, reply.content)
        else:
            sent_r = self._sent_reasoning_text()
            if reply.reasoning.startswith(sent_r) and len(reply.reasoning) > len(sent_r):
                out.append({"reasoning_content": reply.reasoning[len(sent_r) :]})
            sent_c = self.sent_content
            if reply.content.startswith(sent_c) and len(reply.content) > len(sent_c):
                out.append({"content": reply.content[len(sent_c) :]})
        for i, c in enumerate(calls):
            if i >= len(sent):
                out.append(_call_delta(i, c.arguments, PartialCall(c.name, id=c.id)))
                continue
            c.id = sent[i].id
            if len(c.arguments) > len(sent[i].args):
                out.append(_call_delta(i, c.arguments[len(sent[i].args) :]))
        return out, reply

    def _sent_reasoning_text(self) -> str:
        return self.text[self.think_at : self.think_at + self.sent_reasoning].strip()
