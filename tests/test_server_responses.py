"""OpenAI's Responses API (``/v1/responses``) with the official ``openai`` client: the same
greedy text as the chat route, streamed events the client assembles into the same Response,
``previous_response_id`` continuing a conversation (and its instructions not carried
over), function calls and their outputs, ``text.format`` held to a schema, retrieve and
delete, the store's bound, and bad requests answered 400 naming the field."""

from __future__ import annotations

import json
from types import SimpleNamespace

import httpx
import jsonschema
import openai
import pytest

from llamacpy.api.responses_api import (
    ResponseEvents,
    ResponsesRequestError,
    ResponseStore,
    chat_request,
    conversation,
)
from test_server import running
from test_server_tools import WEATHER, make_server

ASK = "What are the three primary colors?"
TOOLS = [{"type": "function", "name": "get_weather", "description": "Current weather in a city",
          "parameters": WEATHER}]  # fmt: skip


# ----------------------------------------------------------------- request conversion
def test_input_items_become_chat_messages():
    data = {
        "instructions": "Be brief.", "max_output_tokens": 9, "temperature": 0.1,
        "input": [
            {"role": "developer", "content": "Use metric units."},
            {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather",
             "arguments": "{\"city\": \"Paris\"}"},
            {"type": "function_call", "call_id": "c2", "name": "get_weather",
             "arguments": "{\"city\": \"Lyon\"}"},
            {"type": "function_call_output", "call_id": "c1", "output": "18C"},
            {"type": "reasoning", "id": "rs_1", "summary": []},
        ],
        "tools": TOOLS, "tool_choice": {"type": "function", "name": "get_weather"},
        "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}}},
    }  # fmt: skip
    conv = conversation(data, [{"role": "user", "content": "earlier"}])
    body = chat_request(data, conv)
    msgs = body["messages"]
    assert [m["role"] for m in msgs] == ["system", "user", "system", "user", "assistant", "tool"]
    assert msgs[0]["content"] == "Be brief." and msgs[1]["content"] == "earlier"
    assert [c["id"] for c in msgs[4]["tool_calls"]] == ["c1", "c2"]
    assert msgs[5] == {"role": "tool", "tool_call_id": "c1", "content": "18C"}
    assert body["max_tokens"] == 9 and body["temperature"] == 0.1
    assert body["tools"][0]["function"]["parameters"] == WEATHER
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert body["response_format"]["json_schema"]["schema"] == {"type": "object"}
    assert conv[0]["content"] == "earlier" and conv[1]["role"] == "system"  # no instructions


@pytest.mark.parametrize(
    "data, needle",
    [
        ({"input": []}, "'input'"),
        ({"input": 5}, "'input'"),
        ({"input": [{"role": "robot", "content": "x"}]}, r"input\[0\].role"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
         "input_image is not supported"),
        ({"input": [{"type": "computer_call"}]}, "computer_call"),
        ({"input": [{"type": "function_call", "name": "f"}]}, "call_id"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "only function tools"),
        ({"input": "x", "tool_choice": "sometimes"}, "tool_choice"),
        ({"input": "x", "text": {"format": {"type": "yaml"}}}, "text.format.type"),
        ({"input": "x", "instructions": 3}, "instructions"),
    ],
)  # fmt: skip
def test_bad_requests_name_the_field(data, needle):
    with pytest.raises(ResponsesRequestError, match=needle):
        chat_request(data, conversation(data, []))


def test_store_keeps_the_most_recently_used():
    store = ResponseStore(limit=2)
    for rid in ("a", "b"):
        store.put({"id": rid}, [])
    assert store.get("a") is not None  # a is now the most recent
    store.put({"id": "c"}, [])
    assert store.get("b") is None and store.get("a") and store.get("c")
    assert store.delete("a") and not store.delete("a")


def test_events_number_and_close_items():
    ev = ResponseEvents("resp_1")
    out = ev.start({"id": "resp_1"})
    out += ev.deltas([{"content": "Hi"}, {"content": " there"}])
    out += ev.deltas([{"tool_calls": [{"index": 0, "id": "c", "function": {
        "name": "f", "arguments": "{\"a\""}}]}, {"tool_calls": [{"index": 0, "function": {
            "arguments": ": 1}"}}]}])  # fmt: skip
    out += ev.end({"id": "resp_1", "status": "completed"})
    assert [e["sequence_number"] for _, e in out] == list(range(len(out)))
    kinds = [k for k, _ in out]
    assert kinds[-1] == "response.completed"
    assert kinds.count("response.output_item.added") == kinds.count("response.output_item.done")
    assert ev.items[0]["content"][0]["text"] == "Hi there"
    assert json.loads(ev.items[1]["arguments"]) == {"a": 1}


# ----------------------------------------------------------------- with the client
@pytest.fixture(scope="module")
def server(smollm2_path):
    _, state = make_server(smollm2_path)
    with running(state) as base:
        yield SimpleNamespace(
            client=openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0,
                                 timeout=300),
            http=httpx.Client(base_url=base, timeout=300), state=state,
        )  # fmt: skip


def test_text_equals_the_chat_routes(server):
    r = server.client.responses.create(model="m", input=ASK, max_output_tokens=24,
                                       temperature=0)  # fmt: skip
    chat = server.client.chat.completions.create(
        model="m", max_tokens=24, temperature=0, messages=[{"role": "user", "content": ASK}]
    )
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.output_text == chat.choices[0].message.content
    assert r.status == {"length": "incomplete", "stop": "completed"}[chat.choices[0].finish_reason]
    if r.status == "incomplete":
        assert r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.usage.output_tokens == chat.usage.completion_tokens


def test_streamed_response_is_the_whole_one(server):
    whole = server.client.responses.create(model="m", input=ASK, max_output_tokens=24,
                                           temperature=0)  # fmt: skip
    with server.client.responses.stream(model="m", input=ASK, max_output_tokens=24,
                                        temperature=0) as s:  # fmt: skip
        deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
        final = s.get_final_response()
    assert len(deltas) > 3 and "".join(deltas) == whole.output_text == final.output_text
    assert final.status == whole.status and final.usage.output_tokens == whole.usage.output_tokens
    assert server.client.responses.retrieve(final.id).output_text == final.output_text


def test_previous_response_continues_the_conversation(server):
    first = server.client.responses.create(
        model="m",
        input="My name is Ada.",
        temperature=0,
        max_output_tokens=8,
        instructions="Answer briefly.",
    )
    nxt = server.client.responses.create(
        model="m",
        input="What is my name?",
        temperature=0,
        max_output_tokens=8,
        previous_response_id=first.id,
    )
    chat = server.client.chat.completions.create(model="m", max_tokens=8, temperature=0,
                                                 messages=[  # instructions are not carried
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "What is my name?"}])  # fmt: skip
    assert nxt.output_text == chat.choices[0].message.content
    assert nxt.previous_response_id == first.id
    assert nxt.usage.input_tokens == chat.usage.prompt_tokens


def test_function_call_and_its_output(server):
    r = server.client.responses.create(
        model="m",
        input="What is the weather in Paris?",
        tools=TOOLS,
        tool_choice="required",
        temperature=0,
        max_output_tokens=96,
    )
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls and r.status == "completed"
    for c in calls:
        assert c.name == "get_weather" and c.call_id
        jsonschema.validate(json.loads(c.arguments), WEATHER)
    with server.client.responses.stream(model="m", input="What is the weather in Paris?",
                                        tools=TOOLS, tool_choice="required", temperature=0,
                                        max_output_tokens=96) as s:  # fmt: skip
        final = s.get_final_response()
    streamed = [o for o in final.output if o.type == "function_call"]
    assert [json.loads(c.arguments) for c in streamed] == [json.loads(c.arguments) for c in calls]
    nxt = server.client.responses.create(
        model="m",
        previous_response_id=r.id,
        tools=TOOLS,
        temperature=0,
        max_output_tokens=16,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "18C"}],
    )
    assert nxt.output and nxt.usage.input_tokens > r.usage.input_tokens


def test_text_format_holds_the_reply_to_a_schema(server):
    schema = {"type": "object", "required": ["color"], "additionalProperties": False,
              "properties": {"color": {"type": "string", "maxLength": 12}}}  # fmt: skip
    r = server.client.responses.create(
        model="m",
        input=ASK,
        temperature=0,
        max_output_tokens=48,
        text={"format": {"type": "json_schema", "name": "c", "schema": schema}},
    )
    jsonschema.validate(json.loads(r.output_text), schema)


def test_retrieve_delete_and_errors(server):
    r = server.client.responses.create(model="m", input=ASK, max_output_tokens=2)
    server.client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        server.client.responses.retrieve(r.id)
    with pytest.raises(openai.BadRequestError) as e:
        server.client.responses.create(model="m", input="x", previous_response_id="resp_nope")
    assert "resp_nope" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        server.client.responses.create(model="m", input=[{"role": "robot", "content": "x"}])
    assert "input[0].role" in str(e.value)
    kept = server.client.responses.create(model="m", input=ASK, max_output_tokens=2,
                                          store=False)  # fmt: skip
    with pytest.raises(openai.NotFoundError):
        server.client.responses.retrieve(kept.id)
    assert server.client.responses.create(model="m", input=ASK, max_output_tokens=2).output
