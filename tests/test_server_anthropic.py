"""Anthropic's Messages API (``/v1/messages``, ``/v1/messages/count_tokens``) with the
official ``anthropic`` client: the same greedy text as the chat route, streamed events the
client assembles into the same Message, stop sequences, tool use with schema-valid input,
tool results in the history, token counts, and bad requests answered with Anthropic's
error shape while the server serves on."""

from __future__ import annotations

import json
from types import SimpleNamespace

import anthropic
import httpx
import jsonschema
import openai
import pytest

from llamacpy.api.anthropic import AnthropicRequestError, MessageEvents, chat_request
from test_server import running
from test_server_tools import ADD, WEATHER, make_server

ASK = [{"role": "user", "content": "What are the three primary colors?"}]
TOOLS = [
    {"name": "get_weather", "description": "Current weather in a city", "input_schema": WEATHER},
    {"name": "add", "description": "Add two integers", "input_schema": ADD},
]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
GREEDY = {"temperature": 0}  # (current clients have no temperature argument)


# ----------------------------------------------------------------- request conversion
def test_request_becomes_a_chat_request():
    body = chat_request({
        "model": "m", "max_tokens": 32, "system": [{"type": "text", "text": "Be brief."}],
        "stop_sequences": ["\n\n"], "temperature": 0.5, "top_k": 3, "top_p": 0.9,
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "use the tool", "signature": "x"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                 "input": {"city": "Paris"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1",
                 "content": [{"type": "text", "text": "18C"}]},
                {"type": "text", "text": "Thanks"}]},
        ],
        "tools": TOOLS, "tool_choice": {"type": "tool", "name": "add",
                                        "disable_parallel_tool_use": True},
        "thinking": {"type": "enabled", "budget_tokens": 64},
    })  # fmt: skip
    msgs = body["messages"]
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "user"]
    assert msgs[0]["content"] == "Be brief."
    assert msgs[2]["content"] == "Checking." and msgs[2]["reasoning_content"] == "use the tool"
    call = msgs[2]["tool_calls"][0]
    assert call["id"] == "toolu_1" and json.loads(call["function"]["arguments"]) == {
        "city": "Paris"
    }
    assert msgs[3] == {"role": "tool", "tool_call_id": "toolu_1", "content": "18C"}
    assert body["max_tokens"] == 32 and body["stop"] == ["\n\n"] and body["top_k"] == 3
    assert body["tool_choice"] == {"type": "function", "function": {"name": "add"}}
    assert body["parallel_tool_calls"] is False and body["thinking_budget_tokens"] == 64
    assert [t["function"]["name"] for t in body["tools"]] == ["get_weather", "add"]
    assert body["tools"][0]["function"]["parameters"] == WEATHER


@pytest.mark.parametrize(
    "patch, needle",
    [
        ({"max_tokens": None}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
         "image blocks are not supported"),
        ({"messages": [{"role": "user", "content": [{"type": "video"}]}]}, "content[0].type"),
        ({"messages": [{"role": "user", "content": 7}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a",
                                                     "name": "b", "input": {}}]}]},
         "tool_use block cannot be in a user message"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "server tools"),
        ({"tool_choice": {"type": "tool"}}, "tool_choice.name"),
        ({"tool_choice": {"type": "sometimes"}}, "tool_choice.type"),
        ({"stop_sequences": "x"}, "stop_sequences"),
        ({"thinking": {"type": "enabled", "budget_tokens": -1}}, "budget_tokens"),
    ],
)  # fmt: skip
def test_bad_requests_name_the_field(patch, needle):
    data = {"max_tokens": 8, "messages": ASK, **patch}
    data = {k: v for k, v in data.items() if v is not None}
    with pytest.raises(AnthropicRequestError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        chat_request(data)


def test_reply_blocks_and_stop_reasons():
    from llamacpy.api.anthropic import content_blocks, stop_reason

    msg = {"content": "Sunny.", "reasoning_content": "check the tool result",
           "tool_calls": [{"id": "c1", "type": "function",
                           "function": {"name": "add", "arguments": "{\"a\": 1}"}}]}  # fmt: skip
    blocks = content_blocks(msg)
    assert [b["type"] for b in blocks] == ["thinking", "text", "tool_use"]
    assert blocks[0]["thinking"] == "check the tool result"
    assert blocks[2] == {"type": "tool_use", "id": "c1", "name": "add", "input": {"a": 1}}
    assert stop_reason("length", "") == ("max_tokens", None)
    assert stop_reason("stop", "END") == ("stop_sequence", "END")
    assert stop_reason("stop", "") == ("end_turn", None)
    assert stop_reason("tool_calls", "") == ("tool_use", None)


def test_stream_events_open_and_close_blocks_in_order():
    ev = MessageEvents("msg_1", "m")
    out = ev.start(5)
    out += ev.deltas([{"reasoning_content": "hm"}, {"content": "Hi"}, {"content": "!"}])
    out += ev.deltas([{"tool_calls": [{"index": 0, "id": "c0", "type": "function",
                                       "function": {"name": "add", "arguments": "{\"a\""}}]},
                      {"tool_calls": [{"index": 0, "function": {"arguments": ":1}"}}]}])  # fmt: skip
    out += ev.end(("tool_use", None), 9)
    names = [n for n, _ in out]
    assert names == ["message_start", "content_block_start", "content_block_delta",
                     "content_block_stop", "content_block_start", "content_block_delta",
                     "content_block_delta", "content_block_stop", "content_block_start",
                     "content_block_delta", "content_block_delta", "content_block_stop",
                     "message_delta", "message_stop"]  # fmt: skip
    starts = [d for n, d in out if n == "content_block_start"]
    assert [s["index"] for s in starts] == [0, 1, 2]
    assert starts[2]["content_block"]["name"] == "add"
    parts = [d["delta"]["partial_json"] for n, d in out
             if n == "content_block_delta" and d["index"] == 2]  # fmt: skip
    assert json.loads("".join(parts)) == {"a": 1}
    assert out[-2][1]["usage"] == {"output_tokens": 9}


# ----------------------------------------------------------------- with the client
@pytest.fixture(scope="module")
def server(smollm2_path):
    _, state = make_server(smollm2_path)
    with running(state) as base:
        yield SimpleNamespace(
            client=anthropic.Anthropic(base_url=base, api_key="none", max_retries=0,
                                       timeout=300),
            oai=openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=300),
            http=httpx.Client(base_url=base, timeout=300),
        )  # fmt: skip


def test_messages_text_equals_the_chat_routes(server):
    msg = server.client.messages.create(model="m", max_tokens=24, extra_body=GREEDY, messages=ASK)
    chat = server.oai.chat.completions.create(model="m", max_tokens=24, temperature=0,
                                              messages=ASK)  # fmt: skip
    assert msg.type == "message" and msg.role == "assistant" and msg.id.startswith("msg_")
    assert [b.type for b in msg.content] == ["text"]
    assert msg.content[0].text == chat.choices[0].message.content
    assert (
        msg.stop_reason
        == {"length": "max_tokens", "stop": "end_turn"}[chat.choices[0].finish_reason]
    )
    assert msg.usage.input_tokens == chat.usage.prompt_tokens
    assert msg.usage.output_tokens == chat.usage.completion_tokens
    n = server.client.messages.count_tokens(model="m", messages=ASK)
    assert n.input_tokens == msg.usage.input_tokens


def test_streamed_message_is_the_whole_one(server):
    whole = server.client.messages.create(model="m", max_tokens=24, extra_body=GREEDY,
                                          messages=ASK)  # fmt: skip
    with server.client.messages.stream(model="m", max_tokens=24, extra_body=GREEDY,
                                       messages=ASK) as s:  # fmt: skip
        texts = list(s.text_stream)
        final = s.get_final_message()
    assert len(texts) > 3
    assert "".join(texts) == whole.content[0].text == final.content[0].text
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert final.usage.input_tokens == whole.usage.input_tokens


def test_stop_sequence_is_reported(server):
    whole = server.client.messages.create(model="m", max_tokens=24, extra_body=GREEDY,
                                          messages=ASK)  # fmt: skip
    words = whole.content[0].text.split()
    stop = words[min(3, len(words) - 1)]
    msg = server.client.messages.create(model="m", max_tokens=24, extra_body=GREEDY,
                                        messages=ASK, stop_sequences=[stop])  # fmt: skip
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == stop
    assert stop not in msg.content[0].text
    assert whole.content[0].text.startswith(msg.content[0].text)


@pytest.mark.parametrize("stream", [False, True])
def test_tool_use_with_schema_valid_input(server, stream):
    kw = dict(model="m", max_tokens=96, extra_body=GREEDY, tools=TOOLS,
              tool_choice={"type": "any"},
              messages=[{"role": "user", "content": "What is the weather in Paris?"}])  # fmt: skip
    if stream:
        with server.client.messages.stream(**kw) as s:
            msg = s.get_final_message()
    else:
        msg = server.client.messages.create(**kw)
    uses = [b for b in msg.content if b.type == "tool_use"]
    assert uses and msg.stop_reason == "tool_use"
    for u in uses:
        jsonschema.validate(u.input, SCHEMAS[u.name])
        assert u.id


def test_named_tool_and_tool_result_round_trip(server):
    first = server.client.messages.create(
        model="m",
        max_tokens=96,
        extra_body=GREEDY,
        tools=TOOLS,
        tool_choice={"type": "tool", "name": "add"},
        messages=[{"role": "user", "content": "What is 2 plus 3?"}],
    )
    use = next(b for b in first.content if b.type == "tool_use")
    assert use.name == "add"
    reply = server.client.messages.create(
        model="m", max_tokens=16, extra_body=GREEDY, tools=TOOLS,
        messages=[
            {"role": "user", "content": "What is 2 plus 3?"},
            {"role": "assistant", "content": [b.model_dump() for b in first.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                          "content": "5"}]},
        ],
    )  # fmt: skip
    assert reply.content and reply.usage.input_tokens > first.usage.input_tokens


def test_output_format_holds_the_reply_to_a_schema(server):
    schema = {"type": "object", "required": ["colors"], "additionalProperties": False,
              "properties": {"colors": {"type": "array", "maxItems": 3,
                                        "items": {"type": "string", "maxLength": 12}}}}  # fmt: skip
    msg = server.client.messages.create(
        model="m",
        max_tokens=96,
        extra_body=GREEDY,
        messages=ASK,
        output_config={"format": {"type": "json_schema", "schema": schema}},
    )
    jsonschema.validate(json.loads(msg.content[0].text), schema)


def test_errors_have_anthropics_shape_and_the_server_serves_on(server):
    with pytest.raises(anthropic.BadRequestError) as e:
        server.client.messages.create(model="m", max_tokens=0, messages=ASK)
    assert "max_tokens" in str(e.value)
    r = server.http.post("/v1/messages", json={"model": "m", "max_tokens": 8,
                                               "messages": [{"role": "user", "content": [
                                                   {"type": "image", "source": {}}]}]})  # fmt: skip
    assert r.status_code == 400
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "image" in body["error"]["message"]
    r = server.http.post("/v1/messages", content=b"{", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["type"] == "error"
    msg = server.client.messages.create(model="m", max_tokens=4, messages=ASK)
    assert msg.content
