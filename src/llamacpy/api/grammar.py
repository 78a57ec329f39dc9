"""Grammars for the Python API, as llama-cpp-python has them (``LlamaGrammar``), and the
JSON schemas that requests give through ``response_format`` or ``json_schema`` (with
llama.cpp server's rules: an empty schema is any JSON object)."""

from __future__ import annotations

import os
import threading
import warnings
from collections import OrderedDict
from typing import Any

from ..errors import UsageError
from ..grammar import (
    GrammarMatcher,
    GrammarVocab,
    JsonSchemaError,
    JsonSchemaWarning,
    json_schema_to_grammar,
    parse_grammar,
)
from ..sampling import GrammarSampler

LLAMA_GRAMMAR_DEFAULT_ROOT = "root"


class LlamaGrammar:
    """A GBNF grammar, checked when it is made (:class:`~llamacpy.grammar.GrammarError`
    with line and column); each generation that uses it starts from its beginning."""

    def __init__(self, *args: Any, _grammar: str, **kwargs: Any) -> None:
        parse_grammar(_grammar, LLAMA_GRAMMAR_DEFAULT_ROOT, tokenize=lambda piece: [0])
        self._grammar = _grammar
        self._root = LLAMA_GRAMMAR_DEFAULT_ROOT

    @classmethod
    def from_string(cls, grammar: str, verbose: bool = True) -> LlamaGrammar:
        return cls(_grammar=grammar)

    @classmethod
    def from_file(cls, file: str | os.PathLike[str], verbose: bool = True) -> LlamaGrammar:
        try:
            with open(file, encoding="utf-8") as f:
                grammar = f.read()
        except (OSError, UnicodeDecodeError) as err:
            raise UsageError(f"from_file: error reading grammar file: {err}") from err
        if not grammar:
            raise UsageError(f"from_file: the grammar file {os.fspath(file)!r} is empty")
        return cls.from_string(grammar, verbose=verbose)

    @classmethod
    def from_json_schema(cls, json_schema: str | dict, verbose: bool = True) -> LlamaGrammar:
        """The grammar of a JSON schema (text or parsed), as llama.cpp converts it."""
        return cls.from_string(schema_grammar(json_schema, warn=verbose), verbose=verbose)

    def __repr__(self) -> str:
        return f"LlamaGrammar({len(self._grammar)} characters)"


def schema_grammar(schema: Any, *, warn: bool = True) -> str:
    """llama.cpp server's ``json_schema``: an empty schema is ``{"type": "object"}``."""
    if isinstance(schema, dict) and not schema:
        schema = {"type": "object"}
    with warnings.catch_warnings():
        if not warn:
            warnings.simplefilter("ignore", JsonSchemaWarning)
        return json_schema_to_grammar(schema)


def response_format_schema(response_format: Any, json_schema: Any = None) -> Any:
    """The schema an OpenAI ``response_format`` asks for (llama.cpp server's rules), else
    ``json_schema``: ``json_object`` (its ``schema``, or any object), ``json_schema``
    (``json_schema.schema``, ``strict`` or not), ``text`` or absent (None)."""
    if response_format is None:
        return json_schema
    if not isinstance(response_format, dict):
        raise UsageError("response_format must be an object")
    kind = response_format.get("type") or ""
    if kind == "json_object":
        if "schema" in response_format or not json_schema:
            return response_format.get("schema") or {}
        return json_schema
    if kind == "json_schema":
        wrapper = response_format.get("json_schema") or {}
        if not isinstance(wrapper, dict):
            raise JsonSchemaError("#", "response_format.json_schema must be an object")
        return wrapper.get("schema") or {}
    if kind not in ("", "text"):
        raise UsageError('response_format type must be one of "text", "json_object" or '
                         f'"json_schema", not {kind!r}')  # fmt: skip
    return json_schema


# the latest grammars' matchers, per vocabulary: a request that repeats a grammar (an agent
# sends the same tools every turn) skips its parse and starts with the states met before
MATCHER_CACHE_SIZE = 8
_MATCHERS: OrderedDict[tuple[str, int], tuple[GrammarVocab, GrammarMatcher]] = OrderedDict()
_MATCHERS_LOCK = threading.Lock()


def grammar_matcher(grammar: LlamaGrammar | str, tokenizer: Any) -> GrammarMatcher:
    """A fresh matcher for ``grammar`` (a :class:`LlamaGrammar` or GBNF text) over the
    tokenizer's vocabulary (built once per tokenizer); ``<piece>`` tokens resolved. The
    parsed grammar and its memoized states are kept for the latest
    :data:`MATCHER_CACHE_SIZE` grammars: a matcher is a clone at the start state."""
    text = grammar._grammar if isinstance(grammar, LlamaGrammar) else grammar
    vocab = GrammarVocab.from_tokenizer(tokenizer)
    key = (text, id(vocab))
    with _MATCHERS_LOCK:
        hit = _MATCHERS.get(key)
        template = hit[1] if hit is not None and hit[0] is vocab else None
        if template is not None:
            _MATCHERS.move_to_end(key)
    if template is None:
        parsed = parse_grammar(
            text, tokenize=lambda s: tokenizer.encode(s, add_special=False, parse_special=True)
        )
        template = GrammarMatcher(parsed, vocab)
        with _MATCHERS_LOCK:
            _MATCHERS[key] = (vocab, template)
            while len(_MATCHERS) > MATCHER_CACHE_SIZE:
                _MATCHERS.popitem(last=False)
    m = template.clone()
    m.reset()
    return m


def grammar_sampler(grammar: LlamaGrammar | str, tokenizer: Any) -> GrammarSampler:
    """A chain sampler for ``grammar`` (llama-cpp-python's place for it)."""
    return GrammarSampler(grammar_matcher(grammar, tokenizer))
