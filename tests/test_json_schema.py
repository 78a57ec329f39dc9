"""JSON schema to GBNF: llama.cpp's test schemas give its grammar text to the character,
llama.cpp's schema integration cases match and reject the same strings, hostile schemas
are typed errors naming their JSON path."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pytest

from llamacpy.errors import UsageError
from llamacpy.grammar import JsonSchemaError, json_schema_to_grammar, parse_grammar
from llamacpy.grammar.json_schema import JsonSchemaWarning
from llamacpy.grammar.matcher import GrammarMatcher, GrammarVocab
from llamacpy.grammar.schema_nodes import MAX_DEPTH, dump_json

FIX = Path(__file__).parent / "fixtures" / "grammar"
CASES = json.loads((FIX / "json_schema_cases.json").read_text())
INTEGRATION = [c for c in json.loads((FIX / "integration_cases.json").read_text()) if "schema" in c]


def trim(text: str) -> str:
    """llama.cpp's test ``trim``."""
    return re.sub(r"(^|\n)[ \t]+", r"\1", text.strip(" \n\r\t"))


def convert(schema):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", JsonSchemaWarning)
        return json_schema_to_grammar(schema)


def test_fixture_counts():
    assert len(CASES) == 81 and sum(c["ok"] for c in CASES) == 78
    assert len(INTEGRATION) == 33


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_llama_cpp_grammar_text(case):
    if not case["ok"]:
        with pytest.raises(JsonSchemaError):
            convert(case["schema"])
        return
    assert trim(convert(case["schema"])) == case["grammar"]
    parse_grammar(case["grammar"])  # the expectation is a usable grammar


def _matches(grammar: str, text: str) -> bool:
    m = GrammarMatcher(grammar, GrammarVocab([b"a"]))
    return all(m.accept_piece(c.encode(), 0) for c in text) and m.can_end


@pytest.mark.parametrize("case", INTEGRATION, ids=[c["name"] for c in INTEGRATION])
def test_llama_cpp_schema_integration_cases(case):
    grammar = convert(case["schema"])
    for s in case["pass"]:
        assert _matches(grammar, "".join(s)), s
    for s in case["fail"]:
        assert not _matches(grammar, "".join(s)), s


def test_unsupported_pattern_warns_and_accepts_any_string():
    with pytest.warns(JsonSchemaWarning, match=r"pattern \^\(\?=a\)a\$ is not supported"):
        g = json_schema_to_grammar({"type": "string", "pattern": "^(?=a)a$"})
    assert g.startswith("char ::=") and "root ::= string\n" in g


@pytest.mark.parametrize(
    ("value", "text"),
    [(1.0, "1.0"), (-2.5, "-2.5"), (1e14, "100000000000000.0"), (1e15, "1e+15"),
     (0.0001, "0.0001"), (1e-05, "1e-05"), (1.5e300, "1.5e+300"), (123456.789, "123456.789"),
     (-0.0, "-0.0"), ({"b": [1, None, True], "a": "é\n"}, '{"b":[1,null,true],"a":"é\\n"}')],
)  # fmt: skip
def test_constants_are_written_as_nlohmann_json_dumps_them(value, text):
    assert dump_json(value) == text


def _nested(depth: int) -> str:
    return '{"type":"object","properties":{"a":' * depth + "{}" + "}}" * depth


@pytest.mark.parametrize(
    ("schema", "path", "message"),
    [
        (_nested(100_000), "#", "nested too deeply"),
        (_nested(MAX_DEPTH + 5), "#" + "/properties/a" * MAX_DEPTH, "nested too deeply"),
        (
            {
                "$defs": {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(5000)},
                "$ref": "#/$defs/d0",
            },
            "#/$defs/d255",
            "nested too deeply",
        ),
        (
            {"properties": {"x": {"$ref": "https://example.com/a.json"}}},
            "#/properties/x",
            "only references into the same document",
        ),
        ({"properties": {"x": {"$ref": "#/$defs/missing"}}}, "#/properties/x", "not found"),
        (
            {"$defs": {"a": {"$ref": "#/$defs/a"}}, "allOf": [{"$ref": "#/$defs/a"}]},
            "#/$defs/a",
            "refers to itself",
        ),
        (
            json.loads('{"type":["object","object"],"properties":{"a":' * 20 + "{}" + "}}" * 20),
            "#/",
            "too large",
        ),
        ({"items": {"type": "string", "pattern": "^(a$"}}, "#/items", "unbalanced"),
        ({"properties": {"x": 3}}, "#/properties/x", "schema must be an object"),
        ({"items": False}, "#/items", "the schema false"),
        ({"anyOf": [False, False]}, "#/anyOf", "every alternative is the schema false"),
        ({"type": "string", "minLength": -1}, "#", "minLength must be a non-negative"),
        ({"type": "integer", "minimum": 1e30}, "#", "out of the 64-bit integer range"),
        ('{"const": NaN}', "#", "not valid JSON"),
        ("{", "#", "not valid JSON"),
    ],
)
def test_hostile_schemas_are_typed_errors_with_their_path(schema, path, message):
    with pytest.raises(JsonSchemaError) as info:
        json_schema_to_grammar(schema)
    assert info.value.path.startswith(path) and message in str(info.value)
    assert isinstance(info.value, UsageError)  # exit 1 in the CLI, HTTP 400 in the server


def test_large_schemas_convert():
    """3000 optional properties: one rest rule per property after the first."""
    props = {f"p{i}": {"type": "integer"} for i in range(3000)}
    g = json_schema_to_grammar({"type": "object", "properties": props})
    assert g.count("-rest ::=") == 2999
    parse_grammar(g)


def test_recursive_schemas_give_recursive_grammars():
    g = json_schema_to_grammar({"$ref": "#/$defs/n", "$defs": {"n": {
        "type": "object", "properties": {"next": {"$ref": "#/$defs/n"}},
        "additionalProperties": False}}})  # fmt: skip
    assert _matches(g, '{"next": {"next": {}}}') and not _matches(g, '{"next": 1}')


def test_boolean_schemas_and_the_root_reference():
    """Past llama.cpp's converter (found in SchemaStore's schemas): ``true`` accepts any
    value, a ``false`` property may not appear, a ``false`` alternative is left out, and
    ``{"$ref": "#"}`` refers to the whole document."""
    g = json_schema_to_grammar({"type": "object", "properties": {"a": True, "b": False},
                                "additionalProperties": False})  # fmt: skip
    assert _matches(g, '{"a": [1, {"x": null}]}') and _matches(g, "{}")
    assert not _matches(g, '{"b": 1}')
    g = json_schema_to_grammar({"anyOf": [False, {"type": "integer"}]})
    assert _matches(g, "12") and not _matches(g, '"x"')
    tree = {"type": "object", "properties": {"v": {"type": "integer"},
            "kids": {"type": "array", "items": {"$ref": "#"}}},
            "required": ["v"], "additionalProperties": False}  # fmt: skip
    g = json_schema_to_grammar(tree)
    assert _matches(g, '{"v": 1, "kids": [{"v": 2}, {"v": 3, "kids": []}]}')
    assert not _matches(g, '{"v": 1, "kids": [{"w": 2}]}')
