"""Tool calling over HTTP with the official ``openai`` client: ``tools`` with
``tool_choice`` ``required`` / a named function / ``auto``, replies parsed into
``tool_calls`` (whole, and as streamed deltas the client assembles), ``tool`` messages in
the history, each format (generic JSON on SmolLM2's and Gemma 3's own templates; Hermes,
Qwen3-Coder XML, Mistral and Llama 3 with those families' templates), arguments validated
against the tool's schema with ``jsonschema``; bad tool requests are 400s that name the
field, and the server serves the next request."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import httpx
import jsonschema
import openai
import pytest

from llama_cpp_testdata import llama_cpp_testdata  # noqa: F401  (fixture)
from llamacpy.api.serving import ServingModel
from llamacpy.engine import ContextParams
from llamacpy.server import ServerConfig, ServerState
from test_server import running

WEATHER = {"type": "object", "additionalProperties": False, "required": ["city"],
           "properties": {"city": {"type": "string", "maxLength": 20},
                          "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}  # fmt: skip
ADD = {"type": "object", "required": ["a", "b"],
       "properties": {"a": {"type": "integer", "minimum": -1000, "maximum": 1000},
                      "b": {"type": "integer", "minimum": -1000, "maximum": 1000}}}  # fmt: skip
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER,
                                      "description": "Current weather in a city"}},
    {"type": "function", "function": {"name": "add", "parameters": ADD,
                                      "description": "Add two integers"}},
]  # fmt: skip
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def make_server(path: Path, n_ctx: int = 2048):
    params = ContextParams(n_ctx=n_ctx, n_batch=256, n_ubatch=256, n_threads=1,
                           n_threads_batch=1)  # fmt: skip
    model = ServingModel.load(str(path), params, n_parallel=1, max_queue=4)
    state = ServerState(ServerConfig(timeout=300), model, model_name="m")
    return model, state


@pytest.fixture(scope="module")
def server(smollm2_path):
    model, state = make_server(smollm2_path)
    own = model.template
    with running(state) as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=300)
        http = httpx.Client(base_url=base, timeout=300)
        yield SimpleNamespace(client=client, http=http, model=model, own=own)
        http.close()


@pytest.fixture
def template(server, llama_cpp_testdata):  # noqa: F811
    """Serve with one of llama.cpp's templates (by file name) for one test."""

    def use(name: str) -> None:
        src = (llama_cpp_testdata / "models/templates" / name).read_text()
        server.model.template = server.model._template(src)

    yield use
    server.model.template = server.own


def check_calls(calls, names=None) -> None:
    assert calls, "no tool call"
    for c in calls:
        assert c.type == "function" and len(c.id) >= 9
        assert c.function.name in SCHEMAS
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])
    if names is not None:
        assert [c.function.name for c in calls] == names


def still_serving(server) -> None:
    r = server.client.chat.completions.create(model="m", messages=ASK, max_tokens=4)
    assert r.choices[0].message.content is not None


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_required_call_on_smollm2_generic(server, seed):
    r = server.client.chat.completions.create(model="m", messages=ASK, tools=TOOLS,
                                              tool_choice="required", max_tokens=96, seed=seed)  # fmt: skip
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    check_calls(choice.message.tool_calls)


def test_named_function_and_streamed_deltas(server):
    named = {"type": "function", "function": {"name": "add"}}
    msgs = [{"role": "user", "content": "What is 2 plus 3?"}]
    r = server.client.chat.completions.create(model="m", messages=msgs, tools=TOOLS,
                                              tool_choice=named, max_tokens=96, temperature=0)  # fmt: skip
    check_calls(r.choices[0].message.tool_calls, ["add"])
    with server.client.chat.completions.stream(model="m", messages=msgs, tools=TOOLS,
                                               tool_choice=named, max_tokens=96,
                                               temperature=0) as stream:  # fmt: skip
        final = stream.get_final_completion()
    streamed = final.choices[0].message.tool_calls
    check_calls(streamed, ["add"])
    assert streamed[0].function.arguments == r.choices[0].message.tool_calls[0].function.arguments
    assert final.choices[0].finish_reason == "tool_calls"


def test_tool_result_in_the_history(server):
    r = server.client.chat.completions.create(model="m", messages=ASK, tools=TOOLS,
                                              tool_choice="required", max_tokens=96, seed=5)  # fmt: skip
    msg = r.choices[0].message
    call = msg.tool_calls[0]
    history = [*ASK, msg.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": "18 degrees, sunny"}]  # fmt: skip
    for choice in ("auto", "none"):
        r2 = server.client.chat.completions.create(model="m", messages=history, tools=TOOLS,
                                                   tool_choice=choice, max_tokens=24, seed=6)  # fmt: skip
        m2 = r2.choices[0].message
        assert m2.content or m2.tool_calls
    prompt = server.http.post("/apply-template", json={"messages": history}).json()["prompt"]
    assert "18 degrees, sunny" in prompt


@pytest.mark.parametrize(
    "name,marker",
    [
        ("Qwen-Qwen2.5-7B-Instruct.jinja", "<tool_call>"),
        ("Qwen3-Coder.jinja", "<function="),
        ("mistralai-Mistral-Nemo-Instruct-2407.jinja", "[TOOL_CALLS]"),
        ("meta-llama-Llama-3.1-8B-Instruct.jinja", '"parameters"'),
        ("openai-gpt-oss-120b.jinja", "to=functions."),
        ("GLM-4.6.jinja", "<arg_key>"),
        ("llama-cpp-deepseek-r1.jinja", "get_weather\n```json"),
        ("ibm-granite-granite-3.3-2B-Instruct.jinja", "<|tool_call|>"),
        ("CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja", "<|START_ACTION|>"),
        ("meetkai-functionary-medium-v3.2.jinja", "\n{"),
    ],
)
def test_native_formats_with_their_templates(server, template, name, marker):
    template(name)
    rendered = server.http.post("/apply-template", json={"messages": ASK, "tools": TOOLS})
    assert rendered.status_code == 200 and "get_weather" in rendered.json()["prompt"]
    budget = {"reasoning_budget_tokens": 8}  # a thinking template: the block is cut short
    r = server.client.chat.completions.create(model="m", messages=ASK, tools=TOOLS,
                                              tool_choice="required", max_tokens=256,
                                              temperature=0, parallel_tool_calls=False,
                                              extra_body=budget)  # fmt: skip
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message
    check_calls(choice.message.tool_calls)
    assert len(choice.message.tool_calls) == 1
    # the raw text shows the format's own syntax
    raw = server.http.post("/v1/chat/completions", json={
        "messages": ASK, "tools": TOOLS, "tool_choice": "required", "max_tokens": 256,
        "temperature": 0, "parallel_tool_calls": False, "logprobs": True, **budget}).json()  # fmt: skip
    text = "".join(t["token"] for t in raw["choices"][0]["logprobs"]["content"])
    assert marker in text, text
    # auto: free text unless the model opens a call; either way a well-formed reply
    r = server.client.chat.completions.create(model="m", messages=ASK, tools=TOOLS,
                                              tool_choice="auto", max_tokens=24, seed=9)  # fmt: skip
    m = r.choices[0].message
    if m.tool_calls:
        check_calls(m.tool_calls)
    else:
        assert m.content is not None and r.choices[0].finish_reason in ("stop", "length")


def test_reasoning_content_split(server, template):
    template("Qwen-Qwen3-0.6B.jinja")  # its generation prompt leaves thinking to the model
    grammar = 'root ::= "<think>\\nPondering.\\n</think>\\n\\n" "Answer."'
    body = {"messages": ASK, "grammar": grammar, "max_tokens": 32, "temperature": 0}
    j = server.http.post("/v1/chat/completions", json=body).json()
    msg = j["choices"][0]["message"]
    assert (msg["reasoning_content"], msg["content"]) == ("Pondering.", "Answer.")
    j = server.http.post("/v1/chat/completions", json={**body, "reasoning_format": "none"}).json()
    assert j["choices"][0]["message"]["content"] == "<think>\nPondering.\n</think>\n\nAnswer."
    assert "reasoning_content" not in j["choices"][0]["message"]
    chunks = server.client.chat.completions.create(model="m", messages=ASK, stream=True,
                                                   max_tokens=32, temperature=0,
                                                   extra_body={"grammar": grammar})  # fmt: skip
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    reasoning = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
    content = "".join(d.content or "" for d in deltas)
    assert (reasoning.strip(), content) == ("Pondering.", "Answer.")


@pytest.mark.parametrize(
    "body,needle",
    [
        ({"tools": [{"type": "function", "function": {"name": "has space"}}]},
         "tools[0].function.name"),
        ({"tools": "get_weather"}, "'tools'"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "not one of the 'tools'"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "'tool_choice'"),
        ({"tool_choice": "required"}, "no 'tools'"),
        ({"tools": TOOLS, "grammar": 'root ::= "x"'}, "grammar"),
        ({"reasoning_format": "loud"}, "'reasoning_format'"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"x": {"$ref": "#/nowhere"}}}}}],
          "tool_choice": "required"}, "tools' grammar"),
    ],
)  # fmt: skip
def test_bad_tool_requests_are_400(server, body, needle):
    r = server.http.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 4, **body})
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]["message"], r.text
    still_serving(server)


def test_required_call_on_gemma3(gemma3_path):
    _, state = make_server(gemma3_path, n_ctx=1024)
    with running(state) as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=300)
        for seed in (1, 2):
            r = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS,
                                               tool_choice="required", max_tokens=96, seed=seed)  # fmt: skip
            assert r.choices[0].finish_reason == "tool_calls"
            check_calls(r.choices[0].message.tool_calls)


@pytest.mark.parametrize(
    "name,start,end,budgets",
    [
        ("Qwen-Qwen3-0.6B.jinja", "<think>", "</think>", (0, 5)),
        # SmolLM2 closes this block itself after two tokens: budgets below that
        ("CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja", "<|START_THINKING|>",
         "<|END_THINKING|>", (0, 1)),
    ],
)  # fmt: skip
def test_reasoning_budget(server, template, name, start, end, budgets):
    template(name)
    grammar = f'root ::= "{start}" [a-z \\n]+ "{end}" [a-z ]+'
    for budget in budgets:
        j = server.http.post("/v1/chat/completions", json={
            "messages": ASK, "grammar": grammar, "max_tokens": 24, "temperature": 0,
            "reasoning_budget_tokens": budget, "reasoning_budget_message": " ok"}).json()  # fmt: skip
        msg = j["choices"][0]["message"]
        assert msg["reasoning_content"].endswith("ok"), msg
        thought = server.http.post("/tokenize", json={"content": msg["reasoning_content"]})
        assert len(thought.json()["tokens"]) <= budget + 3


def test_enable_thinking_and_reasoning_effort(server, template):
    template("Qwen-Qwen3-0.6B.jinja")

    def prompt(**extra):
        r = server.http.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 1,
                                                           "logprobs": True, **extra})  # fmt: skip
        assert r.status_code == 200, r.text
        return server.http.post("/apply-template", json={"messages": ASK, **extra}).json()["prompt"]

    off = "<think>\n\n</think>"
    assert off not in prompt()
    assert prompt(chat_template_kwargs={"enable_thinking": False}).rstrip().endswith(off)
    assert prompt(reasoning_effort="none").rstrip().endswith(off)
    bad = server.http.post("/v1/chat/completions", json={
        "messages": ASK, "chat_template_kwargs": {"enable_thinking": "no"}})  # fmt: skip
    assert bad.status_code == 400 and "enable_thinking" in bad.text
