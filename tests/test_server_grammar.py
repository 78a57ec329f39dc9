"""Structured output over HTTP: native ``grammar`` / ``json_schema`` on ``/completion``,
OpenAI ``response_format`` (``json_object``, ``json_schema`` with ``strict``) on
``/v1/chat/completions`` and ``/v1/completions``, and the official ``openai`` client's
``chat.completions.parse`` with a pydantic model. Every JSON answer is validated with
``jsonschema``; hostile grammars and schemas are 400s naming the line and column or the
JSON path, and the server serves the next request."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Literal

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from llamacpy.api.serving import ServingModel
from llamacpy.engine import ContextParams
from llamacpy.server import ServerConfig, ServerState
from test_server import running

CITY = {"type": "object", "additionalProperties": False, "required": ["city", "population"],
        "properties": {"city": {"type": "string", "maxLength": 16},
                       "population": {"type": "integer", "minimum": 0, "maximum": 99999999}}}  # fmt: skip
ASK = [{"role": "user", "content": "Name a large city and its population, as JSON."}]


class City(BaseModel):
    name: str = Field(max_length=20)
    country: Literal["France", "Japan", "USA", "Brazil", "India"]
    population: int = Field(ge=0, le=50_000_000)


@pytest.fixture(scope="module")
def server(smollm2_path):
    params = ContextParams(n_ctx=1024, n_batch=128, n_ubatch=128, n_threads=1, n_threads_batch=1)
    model = ServingModel.load(str(smollm2_path), params, n_parallel=2, max_queue=4)
    state = ServerState(ServerConfig(timeout=600), model, model_name="smollm2")
    with running(state) as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=600)
        http = httpx.Client(base_url=base, timeout=600)
        yield SimpleNamespace(client=client, http=http)
        http.close()


def still_serving(server) -> None:
    r = server.http.post("/completion", json={"prompt": "Hi", "n_predict": 2,
                                              "grammar": 'root ::= "ok"'})  # fmt: skip
    assert r.status_code == 200 and r.json()["content"] == "ok", r.text


@pytest.mark.parametrize("seed", [1, 2])
def test_chat_json_schema_strict_validates(server, seed):
    rf = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY, "strict": True}}
    res = server.client.chat.completions.create(model="x", messages=ASK, response_format=rf,
                                                max_tokens=64, seed=seed)  # fmt: skip
    content = res.choices[0].message.content
    assert res.choices[0].finish_reason == "stop", content
    jsonschema.validate(json.loads(content), CITY)


def test_chat_json_object_with_and_without_schema(server):
    res = server.client.chat.completions.create(
        model="x", messages=ASK, max_tokens=96, temperature=0,
        response_format={"type": "json_object"})  # fmt: skip
    assert isinstance(json.loads(res.choices[0].message.content), dict)
    res = server.client.chat.completions.create(
        model="x", messages=ASK, max_tokens=64, seed=3,
        response_format={"type": "json_object", "schema": CITY})  # type: ignore[typeddict-unknown-key]  # fmt: skip
    jsonschema.validate(json.loads(res.choices[0].message.content), CITY)


@pytest.mark.parametrize("seed", [4, 5])
def test_openai_parse_with_a_pydantic_model(server, seed):
    res = server.client.chat.completions.parse(
        model="x", messages=[{"role": "user", "content": "Describe a big city as JSON."}],
        response_format=City, max_tokens=96, seed=seed)  # fmt: skip
    msg = res.choices[0].message
    assert res.choices[0].finish_reason == "stop", msg.content
    assert isinstance(msg.parsed, City)
    jsonschema.validate(json.loads(msg.content), City.model_json_schema())


def test_chat_stream_follows_the_schema(server):
    rf = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY}}
    stream = server.client.chat.completions.create(model="x", messages=ASK, response_format=rf,
                                                   max_tokens=64, seed=6, stream=True)  # fmt: skip
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    jsonschema.validate(json.loads(text), CITY)


def test_v1_completions_response_format(server):
    r = server.http.post("/v1/completions", json={
        "prompt": "A JSON object with a city and its population:", "max_tokens": 64, "seed": 7,
        "response_format": {"type": "json_schema", "json_schema": {"schema": CITY}}})  # fmt: skip
    assert r.status_code == 200, r.text
    jsonschema.validate(json.loads(r.json()["choices"][0]["text"]), CITY)


def test_native_grammar_and_json_schema(server):
    r = server.http.post("/completion", json={"prompt": "Is water wet? Answer:", "n_predict": 8,
                                              "grammar": 'root ::= " " ("yes" | "no") "."'})  # fmt: skip
    assert r.status_code == 200 and r.json()["content"] in (" yes.", " no."), r.text
    r = server.http.post("/completion", json={
        "prompt": "A JSON object with a city and its population:", "n_predict": 64, "seed": 8,
        "json_schema": CITY})  # fmt: skip
    assert r.status_code == 200, r.text
    jsonschema.validate(json.loads(r.json()["content"]), CITY)
    # native: an explicit grammar wins over json_schema (llama-server's handler)
    r = server.http.post("/completion", json={"prompt": "x", "n_predict": 4,
                                              "json_schema": CITY, "grammar": 'root ::= "z"'})  # fmt: skip
    assert r.json()["content"] == "z"


CHAT = "/v1/chat/completions"
NATIVE = "/completion"
HOSTILE = [
    (NATIVE, {"grammar": 'root ::= "a" (b'}, "grammar: expecting ')' at line 1, column 16"),
    (NATIVE, {"grammar": 'root ::= x\nx ::= x "a"'}, "left recursion in rule 'x'"),
    (NATIVE, {"grammar": 'root ::= "a"{99999999}'}, "repetitions exceeds 2000 at line 1"),
    (
        NATIVE,
        {"grammar": "root ::= " + "(" * 300 + '"a"' + ")" * 300},
        "groups nested deeper than 256 at line 1, column 266",
    ),
    (
        NATIVE,
        {"json_schema": {"properties": {"a": {"$ref": "https://evil.example/s.json"}}}},
        '"json_schema": JSON schema error at #/properties/a: unsupported $ref',
    ),
    (
        NATIVE,
        {
            "json_schema": {
                "$defs": {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(1000)},
                "$ref": "#/$defs/d0",
            }
        },
        "JSON schema error at #/$defs/d255: the schema is nested too deeply",
    ),
    (
        NATIVE,
        {"json_schema": {"type": "string", "pattern": "^(a$"}},
        "JSON schema error at #: Invalid pattern ^(a$: unbalanced parentheses",
    ),
    (
        CHAT,
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "schema": {
                        "$defs": {"a": {"$ref": "#/$defs/a"}},
                        "allOf": [{"$ref": "#/$defs/a"}],
                    }
                },
            }
        },
        "JSON schema error at #/$defs/a: allOf: $ref #/$defs/a refers to itself",
    ),
    (
        CHAT,
        {"response_format": {"type": "json_object", "schema": {"type": "integer", "minimum": "3"}}},
        "JSON schema error at #: minimum must be a number",
    ),
    (CHAT, {"json_schema": CITY, "grammar": 'root ::= "a"'}, "Cannot use both json_schema"),
    (CHAT, {"response_format": {"type": "xml"}}, "response_format type must be one of"),
    (
        "/v1/completions",
        {"response_format": {"type": "json_object", "schema": {"type": 3}}},
        "JSON schema error at #: type must be a string or an array of strings",
    ),
]


@pytest.mark.parametrize(("route", "body", "message"), HOSTILE,
                         ids=[f"{i}-{h[0]}" for i, h in enumerate(HOSTILE)])  # fmt: skip
def test_hostile_grammars_and_schemas_are_400_and_the_server_goes_on(server, route, body, message):
    base = {"messages": ASK} if route == CHAT else {"prompt": "x"}
    r = server.http.post(route, json={**base, "max_tokens": 4, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and message in err["message"], err
    still_serving(server)


def test_unknown_piece_token_is_a_400(server):
    r = server.http.post(NATIVE, json={"prompt": "x", "grammar": "root ::= <no-such-token>"})
    assert r.status_code == 400 and "not exactly one token" in r.json()["error"]["message"]
    still_serving(server)
