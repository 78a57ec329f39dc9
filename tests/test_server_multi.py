"""Several completions per request: ``n`` (llama-server's ``n_cmpl``) completions of one
prompt decode the prompt once and continue from a copy of its cache, and several prompts
in one ``/completion`` or ``/v1/completions`` request; choices carry their ``index``
(prompt ``i // n``), usage counts each prompt once, streams interleave the choices, and
the official ``openai`` client reads all of it."""

from __future__ import annotations

import json
from types import SimpleNamespace

import httpx
import openai
import pytest

from llamacpy.api.serving import ServingModel
from llamacpy.engine import ContextParams
from llamacpy.server import ServerConfig, ServerState
from test_server import running

N_SLOTS = 3


@pytest.fixture(scope="module")
def server(smollm2_path):
    params = ContextParams(n_ctx=3 * 512, n_batch=256, n_ubatch=256, n_threads=1,
                           n_threads_batch=1, n_seq_max=N_SLOTS)  # fmt: skip
    model = ServingModel.load(str(smollm2_path), params, n_parallel=N_SLOTS, max_queue=8)
    state = ServerState(ServerConfig(timeout=300), model, model_name="m")
    with running(state) as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=300)
        http = httpx.Client(base_url=base, timeout=300)
        yield SimpleNamespace(client=client, http=http, model=model)
        http.close()


PROMPT = "The three primary colors are"


def test_n_greedy_choices_equal_one_completion_and_prompt_decoded_once(server):
    one = server.client.completions.create(model="m", prompt=PROMPT, max_tokens=24,
                                           temperature=0)  # fmt: skip
    counters = server.model.scheduler.counters
    before = counters.n_prompt_tokens
    r = server.client.completions.create(model="m", prompt=PROMPT + " red,", max_tokens=24,
                                         temperature=0, n=3)  # fmt: skip
    n_prompt = len(server.http.post("/tokenize", json={"content": PROMPT + " red,",
                                                       "add_special": True}).json()["tokens"])  # fmt: skip
    assert counters.n_prompt_tokens - before <= n_prompt  # once, not three times
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert len({c.text for c in r.choices}) == 1
    assert r.usage.prompt_tokens == n_prompt
    single = server.client.completions.create(model="m", prompt=PROMPT + " red,", max_tokens=24,
                                              temperature=0)  # fmt: skip
    assert r.choices[0].text == single.choices[0].text
    assert r.usage.completion_tokens == 3 * single.usage.completion_tokens
    assert one.choices[0].text  # the plain request still works


def test_n_sampled_choices_differ(server):
    r = server.client.completions.create(model="m", prompt="Once upon a time", max_tokens=20,
                                         temperature=1.5, top_p=1.0, n=3,
                                         extra_body={"top_k": 0})  # fmt: skip
    assert len({c.text for c in r.choices}) >= 2


def test_chat_n_streamed_and_with_tools(server):
    msgs = [{"role": "user", "content": "Say a color."}]
    stream = server.client.chat.completions.create(model="m", messages=msgs, n=2,
                                                   max_tokens=12, temperature=0, stream=True)  # fmt: skip
    texts: dict[int, str] = {}
    finished = set()
    for ch in stream:
        for c in ch.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
            if c.finish_reason:
                finished.add(c.index)
    assert finished == {0, 1} and texts[0] == texts[1] and texts[0]
    whole = server.client.chat.completions.create(model="m", messages=msgs, n=2,
                                                  max_tokens=12, temperature=0)  # fmt: skip
    assert [c.message.content for c in whole.choices] == [texts[0], texts[1]]
    tools = [{"type": "function", "function": {"name": "pick", "parameters": {
        "type": "object", "properties": {"color": {"type": "string", "maxLength": 12}},
        "required": ["color"]}}}]  # fmt: skip
    r = server.client.chat.completions.create(model="m", messages=msgs, n=3, tools=tools,
                                              tool_choice="required", max_tokens=64, seed=4)  # fmt: skip
    assert len(r.choices) == 3
    for c in r.choices:  # each choice has its own grammar state
        assert c.finish_reason == "tool_calls" and c.message.tool_calls[0].function.name == "pick"


def test_several_prompts(server):
    prompts = ["The capital of France is", "One, two, three,"]
    r = server.client.completions.create(model="m", prompt=prompts, max_tokens=8,
                                         temperature=0, n=2, echo=True)  # fmt: skip
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    for c in r.choices:
        assert c.text.startswith(prompts[c.index // 2])
    assert r.choices[0].text == r.choices[1].text and r.choices[2].text == r.choices[3].text
    alone = server.client.completions.create(model="m", prompt=prompts[1], max_tokens=8,
                                             temperature=0, echo=True)  # fmt: skip
    assert r.choices[2].text == alone.choices[0].text
    native = server.http.post("/completion", json={"prompt": prompts, "n_predict": 8,
                                                   "temperature": 0}).json()  # fmt: skip
    assert isinstance(native, list) and [x["index"] for x in native] == [0, 1]
    assert [x["prompt"] for x in native] == prompts
    assert prompts[0] + native[0]["content"] == r.choices[0].text
    # streamed: every choice closes, the stream ends once
    events = []
    with server.http.stream("POST", "/v1/completions", json={
            "prompt": prompts, "max_tokens": 6, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}) as resp:  # fmt: skip
        for line in resp.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
    assert events[-1] == "[DONE]"
    objs = [json.loads(e) for e in events[:-1]]
    done = [c["index"] for o in objs for c in o["choices"] if c["finish_reason"]]
    assert sorted(done) == [0, 1]
    assert objs[-1]["usage"]["completion_tokens"] == 12


@pytest.mark.parametrize(
    "body,needle",
    [
        ({"prompt": "x", "n": N_SLOTS + 1}, "'n'"),
        ({"prompt": "x", "n": 0}, "'n'"),
        ({"prompt": ["a"] * 200}, "too many prompts"),
        ({"prompt": [["a"], {"b": 1}]}, "'prompt'"),
    ],
)
def test_bad_multi_requests(server, body, needle):
    r = server.http.post("/v1/completions", json={"max_tokens": 2, **body})
    assert r.status_code == 400 and needle in r.json()["error"]["message"], r.text
    ok = server.client.completions.create(model="m", prompt="Hi", max_tokens=2)
    assert ok.choices[0].text is not None
