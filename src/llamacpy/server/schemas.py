"""Request bodies: strict JSON, typed fields with ranges, llama-server's field names.

Everything a client can get wrong becomes an :class:`~.errors.APIError` with a 4xx status
before any work is queued: malformed JSON (NaN and Infinity included), wrong types, values
out of range, fields that would change the result but are not supported, too many stop
strings, token ids outside the vocabulary.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import APIError, bad_request

MAX_STOP = 16  # stop strings per request
MAX_STOP_LEN = 1000  # characters per stop string
MAX_N_PROBS = 100
MAX_DEPTH = 64  # JSON nesting


def parse_json(body: bytes) -> dict[str, Any]:
    """A JSON object, or a 400 (NaN/Infinity are not JSON)."""

    def no_constants(name: str) -> Any:
        raise ValueError(f"{name} is not valid JSON")

    try:
        value = json.loads(body.decode("utf-8"), parse_constant=no_constants)
    except UnicodeDecodeError:
        raise bad_request("the request body is not valid UTF-8") from None
    except RecursionError:
        raise bad_request("the request body nests too deeply") from None
    except ValueError as e:
        raise bad_request(f"the request body is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise bad_request("the request body must be a JSON object")
    if _depth(value) > MAX_DEPTH:
        raise bad_request("the request body nests too deeply")
    if _SURROGATE_ESCAPE.search(body) and (where := _lone_surrogate(value)) is not None:
        # json accepts "\ud800" alone; it is no Unicode text (llama-server refuses it too)
        raise bad_request(f"the request body is not valid JSON: a lone surrogate escape in {where}")
    return value


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _lone_surrogate(v: Any, where: str = "the body") -> str | None:
    """Where a string (or key) of the parsed body holds a UTF-16 surrogate, or None."""
    if isinstance(v, str):
        return where if any("\ud800" <= ch <= "\udfff" for ch in v) else None
    if isinstance(v, dict):
        for k, x in v.items():
            name = f"'{k}'" if where == "the body" else f"{where}[{k!r}]"
            if (found := _lone_surrogate(k, f"a key of {where}")) or (
                found := _lone_surrogate(x, name)
            ):
                return found
    elif isinstance(v, list):
        for i, x in enumerate(v):
            if found := _lone_surrogate(x, f"{where}[{i}]"):
                return found
    return None


def _depth(v: Any, d: int = 0) -> int:
    if d > MAX_DEPTH:
        return d
    if isinstance(v, dict):
        return max((_depth(x, d + 1) for x in v.values()), default=d + 1)
    if isinstance(v, list):
        return max((_depth(x, d + 1) for x in v), default=d + 1)
    return d


class Fields:
    """Typed access to a request object; every error names the field."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        self.data = data

    def has(self, name: str) -> bool:
        return self.data.get(name) is not None

    def raw(self, name: str, default: Any = None) -> Any:
        v = self.data.get(name)
        return default if v is None else v

    def _typed(self, name: str, kind: type, what: str, default: Any = None) -> Any:
        """The field ``name`` (``default`` when absent or null); a 400 unless a ``kind``
        (``what`` in the message)."""
        v = self.data.get(name)
        if v is None:
            return default
        if not isinstance(v, kind):
            raise bad_request(f"'{name}' must be {what}")
        return v

    def bool(self, name: str, default: bool) -> bool:
        return self._typed(name, bool, "a boolean", default)

    def int(self, name: str, default: int, lo: int | None = None, hi: int | None = None) -> int:
        v = self.data.get(name)
        if v is None:
            return default
        if isinstance(v, float) and math.isfinite(v) and v == int(v):
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int):
            raise bad_request(f"'{name}' must be an integer")
        return _range(name, v, lo, hi)

    def float(
        self, name: str, default: float, lo: float | None = None, hi: float | None = None
    ) -> float:
        v = self.data.get(name)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise bad_request(f"'{name}' must be a finite number")
        return _range(name, float(v), lo, hi)

    def str(self, name: str, default: str | None = None, max_len: int = 1 << 20) -> str | None:
        v = self._typed(name, str, "a string")
        if v is None:
            return default
        if len(v) > max_len:
            raise bad_request(f"'{name}' is longer than {max_len} characters")
        return v

    def list(self, name: str) -> list[Any] | None:
        return self._typed(name, list, "an array")

    def obj(self, name: str) -> dict[str, Any] | None:
        return self._typed(name, dict, "an object")


def _range(name: str, v: Any, lo: Any, hi: Any) -> Any:
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        span = f"between {lo} and {hi}" if lo is not None and hi is not None else (
            f">= {lo}" if lo is not None else f"<= {hi}")  # fmt: skip
        raise bad_request(f"'{name}' must be {span}, not {v}")
    return v


MAX_N = 128  # completions per prompt (also at most the server's slots)
MAX_PROMPTS = 128  # prompts per request

# request field -> (SamplingParams field, kind, lo, hi); shared by every completion route
SAMPLING_FIELDS: list[tuple[str, str, str, float | None, float | None]] = [
    ("temperature", "temp", "float", None, 100.0),  # <= 0: greedy (llama-server)
    ("dynatemp_range", "dynatemp_range", "float", 0.0, 100.0),
    ("dynatemp_exponent", "dynatemp_exponent", "float", 0.0, 100.0),
    ("top_k", "top_k", "int", -1, 1 << 24),
    ("top_p", "top_p", "float", 0.0, 1.0),
    ("min_p", "min_p", "float", 0.0, 1.0),
    ("typical_p", "typ_p", "float", 0.0, 1.0),
    ("xtc_probability", "xtc_probability", "float", 0.0, 1.0),
    ("xtc_threshold", "xtc_threshold", "float", 0.0, 1.0),
    ("top_n_sigma", "top_n_sigma", "float", -1.0, 100.0),
    ("repeat_last_n", "penalty_last_n", "int", -1, 1 << 20),
    ("repeat_penalty", "penalty_repeat", "float", 0.0, 100.0),
    ("frequency_penalty", "penalty_freq", "float", -100.0, 100.0),
    ("presence_penalty", "penalty_present", "float", -100.0, 100.0),
    ("dry_multiplier", "dry_multiplier", "float", 0.0, 100.0),
    ("dry_base", "dry_base", "float", 1.0, 100.0),
    ("dry_allowed_length", "dry_allowed_length", "int", 0, 1 << 20),
    ("dry_penalty_last_n", "dry_penalty_last_n", "int", -1, 1 << 20),
    ("mirostat", "mirostat", "int", 0, 2),
    ("mirostat_tau", "mirostat_tau", "float", 0.0, 100.0),
    ("mirostat_eta", "mirostat_eta", "float", 0.0, 100.0),
    ("min_keep", "min_keep", "int", 0, 1 << 20),
    ("seed", "seed", "int", -1, 0xFFFFFFFF),
]


@dataclass
class CompletionRequest:
    """A parsed completion or chat request (prompt still as given)."""

    kind: str  # "native" | "completion" | "chat"
    prompt: Any = None  # completion routes: str or list of str/int
    prompts: list[Any] = field(default_factory=list)  # each prompt of the request
    n: int = 1  # completions of each prompt (n, llama-server's n_cmpl)
    messages: list[Any] | None = None
    tools: list[Any] | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    sampling: dict[str, Any] = field(default_factory=dict)
    n_predict: int = -1
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    n_probs: int = 0
    logprobs: str | None = None  # "native" | "openai"
    post_sampling_probs: bool = False
    echo: bool = False
    cache_prompt: bool = True
    n_cache_reuse: int | None = None  # None: the server's --cache-reuse
    id_slot: int = -1
    return_tokens: bool = False
    model: str | None = None
    timeout: float | None = None
    grammar: str | None = None  # GBNF (from grammar, json_schema or response_format)
    tool_choice: Any = None  # chat: as given (checked against the tools when planned)
    parallel_tool_calls: bool | None = None
    reasoning_format: str | None = None
    reasoning_budget: int | None = None  # tokens of a <think> block (None: the server's)
    budget_message: str | None = None


def _stop(f: Fields) -> list[str]:
    v = f.raw("stop")
    if v is None:
        return []
    items = [v] if isinstance(v, str) else v
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise bad_request("'stop' must be a string or an array of strings")
    if len(items) > MAX_STOP:
        raise bad_request(f"too many stop strings: {len(items)} (at most {MAX_STOP})")
    if any(len(s) > MAX_STOP_LEN for s in items):
        raise bad_request(f"a stop string is longer than {MAX_STOP_LEN} characters")
    return [s for s in items if s]


def _logit_bias(v: Any, n_vocab: int) -> list[tuple[int | str, float]]:
    """``{"token_id": bias}`` (OpenAI) or ``[[token_id, bias], ...]`` (llama-server); a bias
    of ``false`` bans the token. A key that is text, not a number, stays a string: every
    token of its tokenization gets the bias (llama-server), see ``routes._prepare``."""
    pairs = list(v.items()) if isinstance(v, dict) else v
    if not isinstance(pairs, list):
        raise bad_request("'logit_bias' must be an object or an array of [token, bias] pairs")
    if len(pairs) > n_vocab:
        raise bad_request("'logit_bias' has more entries than the vocabulary")
    out = []
    for p in pairs:
        if not (isinstance(p, list | tuple) and len(p) == 2):
            raise bad_request("'logit_bias' entries must be [token, bias] pairs")
        t, b = p
        try:
            tid = int(t) if isinstance(t, str | int) and not isinstance(t, bool) else None
        except ValueError:
            tid = None
        if tid is None and isinstance(t, str) and 0 < len(t) <= MAX_STOP_LEN:
            tid = t  # text
        elif tid is None or not 0 <= tid < n_vocab:
            raise bad_request(
                f"'logit_bias': {t!r} is not a token id of the model (0..{n_vocab - 1})"
            )
        if b is False:
            bias = float("-inf")
        elif isinstance(b, int | float) and not isinstance(b, bool) and math.isfinite(b):
            bias = _range("logit_bias", float(b), -100.0, 100.0)
        else:
            raise bad_request("'logit_bias' values must be finite numbers (or false)")
        out.append((tid, bias))
    return out


def _sampling(f: Fields, n_vocab: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, dest, kind, lo, hi in SAMPLING_FIELDS:
        if not f.has(name):
            continue
        out[dest] = f.int(name, 0, lo, hi) if kind == "int" else f.float(name, 0.0, lo, hi)  # type: ignore[arg-type]
    if f.has("ignore_eos"):
        out["ignore_eos"] = f.bool("ignore_eos", False)
    if f.has("samplers"):
        s = f.raw("samplers")
        if isinstance(s, list) and all(isinstance(x, str) for x in s) and s:
            out["samplers"] = tuple(s)
        elif isinstance(s, str) and s:
            out["samplers"] = s
        else:
            raise bad_request("'samplers' must be a non-empty array of sampler names")
    if f.has("dry_sequence_breakers"):
        b = f.list("dry_sequence_breakers")
        if not all(isinstance(x, str) for x in b or []) or len(b or []) > 64:
            raise bad_request("'dry_sequence_breakers' must be an array of at most 64 strings")
        out["dry_sequence_breakers"] = tuple(b or [])
    if f.has("logit_bias"):
        out["logit_bias"] = tuple(_logit_bias(f.raw("logit_bias"), n_vocab))
    return out


def _unsupported(f: Fields, kind: str) -> None:
    """Fields that would change the result but are not implemented: refuse, never ignore."""
    if f.int("best_of", 1, 1, 128) != 1:
        raise APIError(400, "best_of > 1 is not supported")
    if f.raw("suffix"):
        raise APIError(400, "'suffix' (fill-in-the-middle) is not supported")
    if kind != "chat" and f.has("messages"):
        raise bad_request("'messages' belongs to /v1/chat/completions; use 'prompt' here")


def _grammar(f: Fields, kind: str) -> str | None:
    """The GBNF a request asks for, checked (a 400 with line and column, or the JSON path).

    As llama-server: ``/completion`` takes ``json_schema`` unless ``grammar`` is given; the
    OpenAI routes refuse both together and read ``response_format`` (``json_object`` with
    or without ``schema``, ``json_schema`` with or without ``strict``); an empty schema is
    any JSON object."""
    from ..api.grammar import response_format_schema, schema_grammar
    from ..errors import UsageError
    from ..grammar import parse_grammar
    from ..grammar.parser import MAX_GRAMMAR_CHARS

    grammar = f.str("grammar", None, MAX_GRAMMAR_CHARS) or None
    schema = f.raw("json_schema")
    try:
        if kind == "native":
            schema = None if "grammar" in f.data else schema
        else:
            if schema is not None and grammar:
                raise bad_request("Cannot use both json_schema and grammar")
            schema = response_format_schema(f.raw("response_format"), schema)
        if schema is not None:
            grammar = schema_grammar(schema, warn=False)
        if grammar:
            parse_grammar(grammar, tokenize=lambda piece: [0])
    except UsageError as e:
        raise bad_request(f'"json_schema": {e}' if schema is not None else str(e)) from None
    return grammar


def parse_completion(data: dict[str, Any], kind: str, n_vocab: int) -> CompletionRequest:
    """Parse a ``/completion`` (native), ``/v1/completions`` or ``/v1/chat/completions`` body."""
    f = Fields(data)
    _unsupported(f, kind)
    r = CompletionRequest(kind=kind)
    r.model = f.str("model", None, 1000)
    r.grammar = _grammar(f, kind)
    r.n = f.int("n", 1, 1, MAX_N)
    if kind == "native" and f.has("n_cmpl"):
        r.n = f.int("n_cmpl", 1, 1, MAX_N)
    r.sampling = _sampling(f, n_vocab)
    r.stop = _stop(f)
    r.stream = f.bool("stream", False)
    so = f.obj("stream_options")
    if so is not None:
        r.include_usage = Fields(so).bool("include_usage", False)
    r.cache_prompt = f.bool("cache_prompt", True)
    if f.has("n_cache_reuse"):
        r.n_cache_reuse = f.int("n_cache_reuse", 0, 0, 1 << 20)
    r.id_slot = f.int("id_slot", -1, -1, 1 << 16)
    r.return_tokens = f.bool("return_tokens", False)
    if f.has("t_max_predict_ms"):
        ms = f.float("t_max_predict_ms", 0.0, 0.0, 1e9)
        r.timeout = ms / 1e3 if ms > 0 else None
    # n_predict: llama-server reads n_predict, then max_tokens / max_completion_tokens
    n = f.int("n_predict", -1, -1, 1 << 30) if kind == "native" else -1
    for name in ("max_tokens", "max_completion_tokens"):
        if f.has(name):
            n = f.int(name, -1, -1 if kind == "native" else 0, 1 << 30)
    if kind == "native" and f.has("n_predict"):
        n = f.int("n_predict", -1, -1, 1 << 30)
    r.n_predict = n
    if kind == "native":
        r.n_probs = f.int("n_probs", 0, 0, MAX_N_PROBS)
        r.post_sampling_probs = f.bool("post_sampling_probs", False)
        r.logprobs = "native" if r.n_probs > 0 else None
    elif kind == "completion":
        lp = f.raw("logprobs")
        if lp is not None:
            r.n_probs = f.int("logprobs", 0, 0, 20)
            r.logprobs = "openai"
        r.echo = f.bool("echo", False)
    else:
        if f.bool("logprobs", False):
            r.n_probs = f.int("top_logprobs", 0, 0, 20)
            r.logprobs = "openai"
        elif f.has("top_logprobs"):
            raise bad_request("'top_logprobs' needs 'logprobs': true")
    if kind == "chat":
        msgs = f.list("messages")
        if not msgs:
            raise bad_request("'messages' must be a non-empty array of messages")
        for m in msgs:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise bad_request("each message must be an object with a string 'role'")
        r.messages = msgs
        r.tools = f.list("tools")
        r.tool_choice = f.raw("tool_choice")
        if f.has("parallel_tool_calls"):
            r.parallel_tool_calls = f.bool("parallel_tool_calls", False)
        for name in ("reasoning_budget_tokens", "thinking_budget_tokens"):
            if f.has(name):
                r.reasoning_budget = f.int(name, -1, -1, 1 << 30)
        if f.has("reasoning_budget_message"):
            r.budget_message = f.str("reasoning_budget_message", "", MAX_STOP_LEN)
        if f.has("reasoning_format"):
            from ..api.tool_calls import REASONING_FORMATS

            r.reasoning_format = f.str("reasoning_format", "deepseek", 100)
            if r.reasoning_format not in REASONING_FORMATS:
                raise bad_request("'reasoning_format' must be one of "
                                  + ", ".join(REASONING_FORMATS))  # fmt: skip
        kw = f.obj("chat_template_kwargs")
        r.template_kwargs = dict(kw or {})
        if "enable_thinking" in r.template_kwargs and not isinstance(
            r.template_kwargs["enable_thinking"], bool
        ):
            raise bad_request("'chat_template_kwargs.enable_thinking' must be true or false")
        effort = f.str("reasoning_effort", None, 100)
        if effort == "none":  # OpenAI's reasoning_effort: "none" turns thinking off
            r.template_kwargs["enable_thinking"] = False
        elif effort:
            r.template_kwargs["reasoning_effort"] = effort
    else:
        if "prompt" not in data or data["prompt"] is None:
            raise bad_request("'prompt' is required")
        r.prompts = _prompts(data["prompt"])
        r.prompt = r.prompts[0]
    return r


def _one_prompt(v: Any) -> Any:
    """A string, token ids, or a mix of both (llama-server)."""
    if isinstance(v, str):
        return v
    if isinstance(v, list) and all(
        (isinstance(x, int) and not isinstance(x, bool)) or isinstance(x, str) for x in v
    ):
        return v
    raise bad_request("'prompt' must be a string, an array of token ids, a mix of both, or "
                      "an array of such prompts")  # fmt: skip


def _prompts(v: Any) -> list[Any]:
    """The request's prompts: one prompt, or an array of them (an array of strings is
    several prompts, as in OpenAI's API; an array of ids, or ids and strings, is one)."""
    if (
        isinstance(v, list)
        and v
        and (all(isinstance(x, list) for x in v) or (all(isinstance(x, str) for x in v)))
    ):
        if len(v) > MAX_PROMPTS:
            raise bad_request(f"too many prompts: {len(v)} (at most {MAX_PROMPTS})")
        return [_one_prompt(x) for x in v]
    return [_one_prompt(v)]


def check_tokens(tokens: list[Any], n_vocab: int, what: str = "prompt") -> list[int]:
    """Token ids as ints, all inside the vocabulary."""
    for t in tokens:
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < n_vocab:
            raise bad_request(f"{what}: {t!r} is not a valid token id (0..{n_vocab - 1})")
    return [int(t) for t in tokens]
