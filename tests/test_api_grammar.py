"""The Python API's grammars as llama-cpp-python has them: ``LlamaGrammar``, ``grammar=``
(same text as llama-cpp-python 0.3.36 with the same grammar, seed and settings) and
``response_format`` in chat completions (outputs validated with ``jsonschema``)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from llamacpy import Llama, LlamaGrammar
from llamacpy.errors import UsageError
from llamacpy.grammar import GrammarError, JsonSchemaError, json_schema_to_grammar

FIX = Path(__file__).parent / "fixtures" / "grammar"
DATA = json.loads((FIX / "api_grammar.json").read_text())
CITY = {"type": "object", "additionalProperties": False, "required": ["city", "population"],
        "properties": {"city": {"type": "string", "maxLength": 16},
                       "population": {"type": "integer", "minimum": 0, "maximum": 99999999}}}  # fmt: skip
MESSAGES = [{"role": "user", "content": "Name a large city and its population, as JSON."}]


@pytest.fixture(scope="module")
def llm(smollm2_path):
    return Llama(str(smollm2_path), n_ctx=DATA["n_ctx"], n_threads=1, n_threads_batch=1,
                 verbose=False)  # fmt: skip


@pytest.fixture
def fresh(llm):
    llm.reset()
    llm.set_seed(0xFFFFFFFF)
    return llm


def test_fixture_count():
    assert len(DATA["cases"]) == 12
    assert (FIX / "schemas" / "person.gbnf").read_text() == json_schema_to_grammar(
        (FIX / "schemas" / "person.json").read_text()
    )


@pytest.mark.parametrize("case", DATA["cases"], ids=lambda c: c["name"])
def test_same_text_as_llama_cpp_python(fresh, case):
    grammar = LlamaGrammar.from_string((FIX / case["grammar"]).read_text())
    res = fresh(case["prompt"], max_tokens=DATA["max_tokens"], grammar=grammar, **case["kwargs"])
    assert res["choices"][0]["text"] == case["text"]
    assert res["choices"][0]["finish_reason"] == case["finish_reason"]


def test_grammar_constructors(tmp_path):
    from llamacpy.api import LlamaGrammar as ApiGrammar

    assert LlamaGrammar is ApiGrammar
    path = tmp_path / "g.gbnf"
    path.write_text('root ::= "yes" | "no"')
    assert LlamaGrammar.from_file(path)._grammar == 'root ::= "yes" | "no"'
    g = LlamaGrammar.from_json_schema(json.dumps(CITY))
    assert "city-kv ::=" in g._grammar and g._root == "root"
    assert LlamaGrammar.from_json_schema(CITY)._grammar == g._grammar
    with pytest.raises(GrammarError, match="expecting '\\)' at line 2, column 12"):
        LlamaGrammar.from_string('root ::= a\na ::= "x" (')
    with pytest.raises(JsonSchemaError, match="#/properties/a: unsupported \\$ref"):
        LlamaGrammar.from_json_schema({"properties": {"a": {"$ref": "other.json#/x"}}})
    with pytest.raises(UsageError, match="error reading grammar file"):
        LlamaGrammar.from_file(tmp_path / "missing.gbnf")
    path.write_text("")
    with pytest.raises(UsageError, match="is empty"):
        LlamaGrammar.from_file(path)


def test_completion_follows_the_grammar(fresh):
    grammar = LlamaGrammar.from_string('root ::= ("yes" | "no") "."')
    for kw in ({"temperature": 0.0}, {"seed": 3, "temperature": 1.5}):
        out = fresh.create_completion("Is the sea salty? Answer:", max_tokens=8, grammar=grammar,
                                      **kw)  # fmt: skip
        assert out["choices"][0]["text"] in ("yes.", "no.")
        assert out["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_chat_response_format_with_schema_validates(fresh, seed):
    for rf in ({"type": "json_object", "schema": CITY},
               {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY,
                                                       "strict": True}}):  # fmt: skip
        res = fresh.create_chat_completion(MESSAGES, response_format=rf, max_tokens=64,
                                           seed=seed, temperature=0.8)  # fmt: skip
        content = res["choices"][0]["message"]["content"]
        assert res["choices"][0]["finish_reason"] == "stop", content
        jsonschema.validate(json.loads(content), CITY)


def test_chat_json_object_is_an_object(fresh):
    res = fresh.create_chat_completion(MESSAGES, response_format={"type": "json_object"},
                                       max_tokens=96, temperature=0.0)  # fmt: skip
    content = res["choices"][0]["message"]["content"]
    assert res["choices"][0]["finish_reason"] == "stop", content
    assert isinstance(json.loads(content), dict)


def test_chat_response_format_errors(fresh):
    with pytest.raises(UsageError, match="response_format type"):
        fresh.create_chat_completion(MESSAGES, response_format={"type": "xml"}, max_tokens=1)
    with pytest.raises(JsonSchemaError, match="#/properties/a: schema must be an object"):
        fresh.create_chat_completion(MESSAGES, max_tokens=1, response_format={
            "type": "json_object", "schema": {"properties": {"a": 3}}})  # fmt: skip


WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
    "required": ["city"]}}}  # fmt: skip


@pytest.mark.parametrize("stream", [False, True])
def test_chat_tool_calls(fresh, stream):
    """``tools`` with ``tool_choice`` required or named: the reply is a call to that tool
    with arguments that fit its schema (the generic JSON format of SmolLM2's template)."""
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice in ("required", named):
        out = fresh.create_chat_completion(msgs, tools=[WEATHER_TOOL], tool_choice=choice,
                                           max_tokens=96, temperature=0, stream=stream)  # fmt: skip
        if stream:
            chunks = list(out)
            calls = []  # a call's first delta has its name, the next ones add arguments
            for c in chunks:
                for tc in c["choices"][0]["delta"].get("tool_calls", []):
                    if tc["index"] == len(calls):
                        calls.append({"function": dict(tc["function"])})
                    else:
                        calls[tc["index"]]["function"]["arguments"] += tc["function"]["arguments"]
            finish = chunks[-1]["choices"][0]["finish_reason"]
        else:
            calls = out["choices"][0]["message"]["tool_calls"]
            finish = out["choices"][0]["finish_reason"]
        assert finish == "tool_calls" and len(calls) == 1
        assert calls[0]["function"]["name"] == "get_weather"
        jsonschema.validate(json.loads(calls[0]["function"]["arguments"]),
                            WEATHER_TOOL["function"]["parameters"])  # fmt: skip
    with pytest.raises(UsageError, match="not one of the 'tools'"):
        fresh.create_chat_completion(msgs, tools=[WEATHER_TOOL], tool_choice={
            "type": "function", "function": {"name": "nope"}})  # fmt: skip


def test_repeated_grammars_reuse_their_matcher_and_stay_independent(smollm2_path):
    """The latest grammars' matchers are kept (an agent's tools repeat every turn): a
    repeated grammar's matcher is a new one at the start, sharing the memoized states, and
    advancing one does not move another; the oldest grammar leaves the cache."""
    from llamacpy.api import grammar as G
    from llamacpy.api.tool_calls import parse_tools, plan_chat
    from llamacpy.tokenizer import Tokenizer

    tok = Tokenizer.from_gguf(smollm2_path)
    tools = parse_tools([{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}])  # fmt: skip
    plans = [plan_chat("", tools, "required", parallel=False) for _ in range(2)]
    for p in plans:
        p.build_grammar()
    assert plans[0].grammar is plans[1].grammar  # the text was kept
    a = G.grammar_matcher(plans[0].grammar, tok)
    b = G.grammar_matcher(plans[1].grammar, tok)
    assert a is not b and a._store is b._store  # one parse, shared memo
    for t in tok.encode('{"tool_call": {"name": "f", "arguments": {"x": 1', add_special=False):
        assert a.allows(t)
        a.accept(t)
    assert a.state != b.state and b.state == b.start
    first = next(iter(G._MATCHERS))
    for i in range(G.MATCHER_CACHE_SIZE):
        G.grammar_matcher(f'root ::= "{i}"', tok)
    assert first not in G._MATCHERS and len(G._MATCHERS) == G.MATCHER_CACHE_SIZE
