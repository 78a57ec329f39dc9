"""``llamacpy serve`` over HTTP with the real SmolLM2 model: the `openai` package as the
client (chat and completions, streamed and not, models), llama-server's native routes with
raw httpx, error shapes for bad input (and the server still serving afterwards), API keys,
CORS, backpressure (429 + Retry-After), client disconnects freeing the slot, continuous
batching giving the same greedy text as one request alone, and SIGTERM.

One in-process server (uvicorn in a thread, 3 slots) serves most tests; one engine thread
each, as the test machine is shared.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import httpx
import openai
import pytest
from starlette.testclient import TestClient

from llamacpy.api.serving import ServingModel
from llamacpy.engine import ContextParams
from llamacpy.server import ServerConfig, ServerState, create_app, serve

KEY = "test-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
N_SLOTS = 3
N_CTX = 1536  # 512 per slot
PROMPTS = [
    "The capital of France is",
    "Once upon a time, there was a",
    "def fibonacci(n):",
    "List three colors:",
    "Water boils at",
]


@contextlib.contextmanager
def running(state: ServerState) -> Iterator[str]:
    """Serve ``state`` on a free loopback port in a thread; yields the base URL once it
    listens."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    holder: dict = {}
    t = threading.Thread(target=serve, args=(state,), daemon=True,
                         kwargs={"sock": sock, "on_ready": lambda s: holder.setdefault("s", s)})  # fmt: skip
    t.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(base + "/health", timeout=2).status_code in (200, 503):
                break  # listening (503: still loading)
        time.sleep(0.05)
    try:
        yield base
    finally:
        holder["s"].should_exit = True
        t.join(30)
        sock.close()


@pytest.fixture(scope="module")
def server(smollm2_path):
    params = ContextParams(n_ctx=N_CTX, n_batch=128, n_ubatch=128, n_threads=1, n_threads_batch=1)
    model = ServingModel.load(str(smollm2_path), params, n_parallel=N_SLOTS, max_queue=2)
    cfg = ServerConfig(api_keys=(KEY, "second-key"), max_body=64 * 1024, timeout=600, metrics=True)
    state = ServerState(cfg, model, model_name="smollm2")
    with running(state) as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0, timeout=600)
        http = httpx.Client(base_url=base, headers=AUTH, timeout=600)
        yield SimpleNamespace(base=base, model=model, client=client, http=http)
        http.close()


def native(server, **body) -> dict:
    r = server.http.post("/completion", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def sse_events(lines: Iterator[str]) -> Iterator[str]:
    for line in lines:
        if line.startswith("data: "):
            yield line[6:]


def wait_idle(server, timeout: float = 10.0) -> list[dict]:
    end = time.monotonic() + timeout
    while True:
        slots = server.http.get("/slots").json()
        if not any(s["is_processing"] for s in slots) or time.monotonic() > end:
            return slots
        time.sleep(0.02)


# --------------------------------------------------------------------------- simple routes
def test_slot_erase_and_unsupported_actions(server):
    r = server.http.post("/completion", json={"prompt": "The sky is", "n_predict": 3,
                                              "id_slot": 1, "temperature": 0})  # fmt: skip
    assert r.status_code == 200
    first = r.json()["content"]
    wait_idle(server)
    cached = server.http.get("/slots").json()[1]["n_past"]
    assert cached > 0
    r = server.http.post("/slots/1?action=erase")
    assert r.status_code == 200 and r.json() == {"id_slot": 1, "n_erased": cached}
    assert server.http.get("/slots").json()[1]["n_past"] == 0
    again = server.http.post("/completion", json={"prompt": "The sky is", "n_predict": 3,
                                                  "id_slot": 1, "temperature": 0})  # fmt: skip
    assert again.json()["timings"]["cache_n"] == 0 and again.json()["content"] == first
    for url, status in [("/slots/1?action=save", 501), ("/slots/1?action=restore", 501),
                        ("/slots/9?action=erase", 400), ("/slots/x?action=erase", 400),
                        ("/slots/0?action=explode", 400)]:  # fmt: skip
        bad = server.http.post(url)
        assert bad.status_code == status and "error" in bad.json(), (url, bad.text)


def test_max_tokens_zero_gives_one_token(server):
    """As llama-server: a limit of 0 still samples one token, then stops with length."""
    r = server.client.chat.completions.create(model="x", messages=[{"role": "user",
                                              "content": "hi"}], max_tokens=0)  # fmt: skip
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 1
    n = server.http.post("/completion", json={"prompt": "hi", "n_predict": 0}).json()
    assert n["tokens_predicted"] == 1 and n["stop_type"] == "limit"


def test_health_models_props_slots(server):
    assert httpx.get(server.base + "/health").json() == {"status": "ok"}  # public
    models = server.client.models.list()
    assert [m.id for m in models.data] == ["smollm2"]
    assert server.client.models.retrieve("smollm2").owned_by == "llamacpp"
    props = server.http.get("/props").json()
    assert props["total_slots"] == N_SLOTS
    assert props["default_generation_settings"]["n_ctx"] == N_CTX // N_SLOTS
    assert "im_start" in props["chat_template"]
    slots = server.http.get("/slots").json()
    assert [s["id"] for s in slots] == list(range(N_SLOTS))
    assert all(s["n_ctx"] == N_CTX // N_SLOTS for s in slots)
    page = httpx.get(server.base + "/")
    assert page.status_code == 200 and "/v1/chat/completions" in page.text


def test_tokenize_detokenize_apply_template(server):
    ids = server.http.post("/tokenize", json={"content": "Hello world"}).json()["tokens"]
    assert ids == server.model.tokenize("Hello world", add_special=False)
    pieces = server.http.post("/tokenize", json={"content": "Hello", "with_pieces": True}).json()
    assert pieces["tokens"][0]["piece"] == "Hello"
    assert server.http.post("/detokenize", json={"tokens": ids}).json() == {
        "content": "Hello world"
    }
    msgs = [{"role": "user", "content": "Hi"}]
    prompt = server.http.post("/apply-template", json={"messages": msgs}).json()["prompt"]
    assert prompt.endswith("<|im_start|>assistant\n") and "Hi" in prompt


def test_metrics(server):
    native(server, prompt="Hello", n_predict=2, temperature=0)
    text = server.http.get("/metrics").text
    for name in ("prompt_tokens_total", "tokens_predicted_total", "n_decode_total",
                 "requests_processing", "requests_deferred", "kv_cache_usage_ratio"):  # fmt: skip
        assert f"\nllamacpp:{name} " in "\n" + text
    assert "# TYPE llamacpp:prompt_tokens_total counter" in text


# --------------------------------------------------------------------------- openai client
def test_openai_chat(server):
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    out = server.client.chat.completions.create(
        model="smollm2", messages=msgs, max_tokens=12, temperature=0
    )
    choice = out.choices[0]
    assert out.object == "chat.completion" and choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length") and choice.message.content
    assert out.usage.completion_tokens <= 12
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
    stream = server.client.chat.completions.create(
        model="smollm2", messages=msgs, max_tokens=12, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content  # streamed == whole
    finals = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finals == [choice.finish_reason]
    assert (
        chunks[-1].choices == []
        and chunks[-1].usage.completion_tokens == out.usage.completion_tokens
    )


def test_openai_completions(server):
    out = server.client.completions.create(model="smollm2", prompt="1, 2, 3,", max_tokens=6,
                                           temperature=0)  # fmt: skip
    assert out.object == "text_completion" and out.choices[0].finish_reason == "length"
    assert out.choices[0].text.startswith(" 4")
    parts = list(server.client.completions.create(model="smollm2", prompt="1, 2, 3,",
                                                  max_tokens=6, temperature=0, stream=True))  # fmt: skip
    assert "".join(p.choices[0].text for p in parts) == out.choices[0].text
    assert parts[-1].choices[0].finish_reason == "length"
    # echo + logprobs: the prompt comes back with its logprobs (the first one None)
    lp = server.client.completions.create(model="smollm2", prompt="1, 2, 3,", max_tokens=3,
                                          temperature=0, echo=True, logprobs=2)  # fmt: skip
    c = lp.choices[0]
    assert c.text == "1, 2, 3," + out.choices[0].text[: len(c.text) - 8]
    n_prompt = lp.usage.prompt_tokens
    assert len(c.logprobs.tokens) == n_prompt + 3
    assert c.logprobs.token_logprobs[0] is None and c.logprobs.top_logprobs[0] is None
    assert all(v <= 0 for v in c.logprobs.token_logprobs[1:])
    assert all(len(t) >= 1 for t in c.logprobs.top_logprobs[1:])


def test_openai_chat_logprobs_and_stop(server):
    msgs = [{"role": "user", "content": "Count from 1 to 10, separated by commas."}]
    out = server.client.chat.completions.create(model="smollm2", messages=msgs, max_tokens=8,
                                                temperature=0, logprobs=True, top_logprobs=3)  # fmt: skip
    content = out.choices[0].logprobs.content
    assert len(content) == out.usage.completion_tokens
    assert all(len(t.top_logprobs) >= 1 and t.logprob <= 0 for t in content)
    full = native(server, prompt="1, 2, 3, 4,", n_predict=10, temperature=0)["content"]
    cut = native(server, prompt="1, 2, 3, 4,", n_predict=10, temperature=0, stop=[" 7"])
    assert cut["stop_type"] == "word" and cut["stopping_word"] == " 7"
    assert cut["content"] == full[: full.index(" 7")]


# --------------------------------------------------------------------------- native routes
def test_native_completion(server):
    res = native(server, prompt="The capital of France is", n_predict=8, temperature=0,
                 return_tokens=True, n_probs=2)  # fmt: skip
    for key in ("content", "tokens", "id_slot", "stop", "model", "tokens_predicted",
                "tokens_evaluated", "generation_settings", "prompt", "stop_type",
                "stopping_word", "tokens_cached", "timings", "completion_probabilities"):  # fmt: skip
        assert key in res, key
    assert res["stop"] is True and res["stop_type"] == "limit" and res["tokens_predicted"] == 8
    assert len(res["tokens"]) == 8 and res["content"].startswith(" Paris")
    p = res["completion_probabilities"][0]
    assert set(p) == {"id", "token", "bytes", "logprob", "top_logprobs"}
    assert p["id"] == res["tokens"][0] and len(p["top_logprobs"]) == 2
    assert set(res["timings"]) >= {"prompt_n", "prompt_ms", "predicted_n", "predicted_ms"}
    # token-id prompt and the mixed form give the same result
    ids = server.model.tokenize("The capital of France is")
    assert native(server, prompt=ids, n_predict=8, temperature=0)["content"] == res["content"]
    mixed = ["The capital", *server.model.tokenize(" of France is", add_special=False)]
    assert native(server, prompt=mixed, n_predict=8, temperature=0)["content"] == res["content"]


def test_native_stream(server):
    body = {"prompt": "Count: 1, 2, 3, 4,", "n_predict": 8, "temperature": 0, "stream": True}
    with server.http.stream("POST", "/completion", json=body) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(e) for e in sse_events(r.iter_lines())]
    assert all(not e["stop"] for e in events[:-1]) and events[-1]["stop"] is True
    assert events[-1]["stop_type"] == "limit" and "timings" in events[-1]
    text = "".join(e["content"] for e in events)
    whole = native(server, prompt="Count: 1, 2, 3, 4,", n_predict=8, temperature=0)
    assert text == whole["content"]


def test_prompt_cache_reuse(server):
    prompt = "Counting in a quiet village by the sea: 1, 2, 3, 4, 5,"
    a = native(server, prompt=prompt, n_predict=6, temperature=0)
    b = native(server, prompt=prompt, n_predict=6, temperature=0)
    assert b["content"] == a["content"]
    assert b["timings"]["cache_n"] >= a["tokens_evaluated"] - 1  # picked the slot with it
    c = native(server, prompt=prompt, n_predict=6, temperature=0, cache_prompt=False)
    assert c["timings"]["cache_n"] == 0 and c["content"] == a["content"]


# --------------------------------------------------------------------------- batching
def test_concurrent_requests_match_single_requests(server):
    """Continuous batching: requests decoded together (prompt chunks mixed with other
    sequences' tokens) produce the same greedy tokens as each request alone. The only
    tolerated difference is a flip where the alone run's two best tokens were within 0.5
    nats (f16 attention sums depend on where the KV cells lie, as in llama.cpp); a request
    reading another's cache or losing its place diverges at confident tokens."""

    def run(p: str) -> list[tuple[int, float]]:
        res = native(server, prompt=p, n_predict=16, temperature=0, cache_prompt=False, n_probs=2)
        return [(c["id"], c["top_logprobs"][0]["logprob"] - c["top_logprobs"][1]["logprob"])
                for c in res["completion_probabilities"]]  # fmt: skip

    alone = [run(p) for p in PROMPTS]
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(pool.map(run, PROMPTS))
    for a, b in zip(alone, together):
        k = next((i for i, (x, y) in enumerate(zip(a, b)) if x[0] != y[0]), None)
        assert len(a) == len(b) or k is not None
        if k is not None:
            assert a[k][1] < 0.5, f"diverged at a confident token {k}: {a} vs {b}"
    assert len({tuple(t for t, _ in a) for a in alone}) == len(PROMPTS)
    c = server.model.scheduler.counters
    assert c.n_busy_slots > c.n_decode  # several sequences per decode


def test_queue_full_is_429_and_nothing_is_lost(server):
    """3 slots + 2 queued are accepted at once; the next request gets 429 + Retry-After
    immediately; the accepted ones all complete."""
    body = {"prompt": "Tell me a long story.", "n_predict": 40, "temperature": 0,
            "ignore_eos": True, "stream": True}  # fmt: skip
    with contextlib.ExitStack() as stack:
        streams = [stack.enter_context(server.http.stream("POST", "/completion", json=body))
                   for _ in range(N_SLOTS + 2)]  # fmt: skip
        assert all(s.status_code == 200 for s in streams)
        t0 = time.monotonic()
        r = server.http.post("/completion", json={**body, "stream": False})
        assert r.status_code == 429 and time.monotonic() - t0 < 2
        assert r.headers["retry-after"] == "1"
        assert r.json()["error"]["type"] == "rate_limit_error"
        with pytest.raises(openai.RateLimitError):
            server.client.completions.create(model="smollm2", prompt="hi", max_tokens=1)
        finals = []
        for s in streams:
            events = [json.loads(e) for e in sse_events(s.iter_lines())]
            finals.append(events[-1])
    assert all(f["stop"] and f["tokens_predicted"] == 40 for f in finals)
    assert not any(s["is_processing"] for s in wait_idle(server))


API_ROUTES = [  # the other APIs' routes, each with a small valid body
    ("/v1/messages", {"model": "m", "max_tokens": 2, "messages": [{"role": "user",
                                                                   "content": "Hi"}]}),
    ("/v1/messages/count_tokens", {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}),
    ("/v1/responses", {"model": "m", "input": "Hi", "max_output_tokens": 2}),
    ("/api/chat", {"model": "m", "stream": False, "options": {"num_predict": 2},
                   "messages": [{"role": "user", "content": "Hi"}]}),
    ("/api/generate", {"model": "m", "prompt": "Hi", "stream": False,
                       "options": {"num_predict": 2}}),
]  # fmt: skip


@pytest.mark.parametrize("path, body", API_ROUTES, ids=[p for p, _ in API_ROUTES])
def test_every_api_route_has_the_guards(server, path, body):
    """Auth, body limit, JSON checks and backpressure apply to the Anthropic, Responses and
    Ollama routes as to the others; each answers a valid request."""
    anon = httpx.Client(base_url=server.base, timeout=600)
    assert anon.post(path, json=body).status_code == 401
    big = {**body, "pad": "x" * (70 * 1024)}
    assert server.http.post(path, json=big).status_code == 413
    r = server.http.post(path, content=b"{nope", headers={"content-type": "application/json"})
    assert r.status_code == 400
    r = server.http.post(path, content=b"{}", headers={"content-type": "text/plain"})
    assert r.status_code == 415
    assert server.http.post(path, json=body).status_code == 200
    if path.endswith("count_tokens"):
        return  # (no completion: never queued)
    hold = {"prompt": "Tell me a long story.", "n_predict": 30, "temperature": 0,
            "ignore_eos": True, "stream": True}  # fmt: skip
    with contextlib.ExitStack() as stack:
        streams = [stack.enter_context(server.http.stream("POST", "/completion", json=hold))
                   for _ in range(N_SLOTS + 2)]  # fmt: skip
        r = server.http.post(path, json=body)
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        for st in streams:
            list(st.iter_lines())
    wait_idle(server)


def test_disconnect_frees_the_slot(server):
    body = {"prompt": "Write a very long essay.", "n_predict": 400, "temperature": 0,
            "ignore_eos": True, "stream": True}  # fmt: skip
    with server.http.stream("POST", "/completion", json=body) as r:
        lines = sse_events(r.iter_lines())
        next(lines), next(lines)
        assert any(s["is_processing"] for s in server.http.get("/slots").json())
    t0 = time.monotonic()
    assert not any(s["is_processing"] for s in wait_idle(server, 5.0))
    assert time.monotonic() - t0 < 5.0
    # a whole (non-streamed) request whose client goes away is cancelled too
    with pytest.raises(httpx.ReadTimeout):
        server.http.post("/completion", json={**body, "stream": False}, timeout=0.5)
    assert not any(s["is_processing"] for s in wait_idle(server, 5.0))
    assert native(server, prompt="Hi", n_predict=2)["stop"]


# --------------------------------------------------------------------------- bad input
BAD = [
    ("malformed json", b'{"prompt": "x", ', 400, "invalid_request_error"),
    ("not an object", b'["prompt"]', 400, "invalid_request_error"),
    ("nan", b'{"prompt": "x", "temperature": NaN}', 400, "invalid_request_error"),
    ("infinity", b'{"prompt": "x", "top_p": Infinity}', 400, "invalid_request_error"),
    ("wrong type", json.dumps({"prompt": "x", "n_predict": "ten"}).encode(), 400, None),
    ("wrong type bool", json.dumps({"prompt": "x", "stream": "yes"}).encode(), 400, None),
    ("huge temperature", json.dumps({"prompt": "x", "temperature": 1e300}).encode(), 400, None),
    ("top_p above 1", json.dumps({"prompt": "x", "top_p": 1.5}).encode(), 400, None),
    ("negative top_k", json.dumps({"prompt": "x", "top_k": -5}).encode(), 400, None),
    ("huge seed", json.dumps({"prompt": "x", "seed": 2**40}).encode(), 400, None),
    ("missing prompt", json.dumps({"n_predict": 1}).encode(), 400, None),
    ("empty prompt", json.dumps({"prompt": ""}).encode(), 400, None),
    ("bad prompt type", json.dumps({"prompt": {"a": 1}}).encode(), 400, None),
    ("invalid token id", json.dumps({"prompt": [1, 2, 10**9]}).encode(), 400, None),
    ("negative token id", json.dumps({"prompt": [-1]}).encode(), 400, None),
    ("too many stops", json.dumps({"prompt": "x", "stop": ["a"] * 100}).encode(), 400, None),
    ("bad stop type", json.dumps({"prompt": "x", "stop": [1, 2]}).encode(), 400, None),
    (
        "bad logit bias",
        json.dumps({"prompt": "x", "logit_bias": {"999999": 1}}).encode(),
        400,
        None,
    ),
    ("n > slots", json.dumps({"prompt": "x", "n": N_SLOTS + 1}).encode(), 400, None),
    (
        "undefined grammar rule",
        json.dumps({"prompt": "x", "grammar": "root ::= x"}).encode(),
        400,
        None,
    ),
    ("bad sampler", json.dumps({"prompt": "x", "samplers": ["nope"]}).encode(), 400, None),
    ("n_probs too big", json.dumps({"prompt": "x", "n_probs": 10**6}).encode(), 400, None),
    ("bad id_slot", json.dumps({"prompt": "x", "id_slot": 99}).encode(), 400, None),
    ("deep nesting", b'{"prompt": "x", "a": ' + b"[" * 200 + b"]" * 200 + b"}", 400, None),
]


@pytest.mark.parametrize("body,status,etype", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_is_a_4xx_json_error(server, body, status, etype):
    r = server.http.post("/completion", content=body,
                         headers={"Content-Type": "application/json"})  # fmt: skip
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == status and isinstance(err["message"], str)
    assert err["type"] == (etype or "invalid_request_error")
    assert native(server, prompt="Hi", n_predict=1)["stop"]  # still serving


def test_prompt_longer_than_the_context(server):
    long = " ".join(["word"] * 600)
    r = server.http.post("/completion", json={"prompt": long, "n_predict": 4})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "exceed_context_size_error"
    assert err["n_ctx"] == N_CTX // N_SLOTS and err["n_prompt_tokens"] > err["n_ctx"]
    with pytest.raises(openai.BadRequestError):
        server.client.chat.completions.create(
            model="x", messages=[{"role": "user", "content": long}], max_tokens=4
        )


def test_huge_n_predict_is_capped_by_the_context(server):
    res = native(server, prompt="Hello", n_predict=10**9, temperature=0, ignore_eos=True,
                 stream=False, t_max_predict_ms=1500)  # fmt: skip
    assert res["stop"] and res["stop_type"] == "limit"
    assert res["generation_settings"]["n_predict"] <= N_CTX // N_SLOTS


def test_bad_chat_requests(server):
    for body in ({"messages": []}, {"messages": "hi"}, {"messages": [{"content": "x"}]},
                 {"messages": [{"role": "user", "content": "x"}], "response_format":
                  {"type": "xml"}},
                 {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}):  # fmt: skip
        r = server.http.post("/v1/chat/completions", json=body)
        assert r.status_code == 400, (body, r.text)
        assert r.json()["error"]["type"] == "invalid_request_error"


def test_oversized_body_is_413(server):
    big = {"prompt": "x" * (70 * 1024)}
    r = server.http.post("/completion", json=big)
    assert r.status_code == 413 and r.json()["error"]["code"] == 413

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted while reading
        yield b'{"prompt": "'
        for _ in range(80):
            yield b"x" * 1024
        yield b'"}'

    r = server.http.post("/completion", content=chunks(),
                         headers={"Content-Type": "application/json"})  # fmt: skip
    assert r.status_code == 413
    assert native(server, prompt="Hi", n_predict=1)["stop"]


def test_unknown_route_and_method(server):
    r = server.http.get("/nope")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    assert server.http.get("/completion").status_code == 405


def test_embeddings_need_the_embedding_flag(server):
    r = server.http.post("/v1/embeddings", json={"input": "hello"})
    assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"
    with pytest.raises(openai.APIStatusError):
        server.client.embeddings.create(model="x", input="hello")


# --------------------------------------------------------------------------- auth
def test_api_key(server):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY},
                    {"X-Api-Key": "nope"}):  # fmt: skip
        r = httpx.post(server.base + "/completion", json={"prompt": "x"}, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        assert KEY not in r.text
    assert httpx.get(server.base + "/v1/models", headers={"X-Api-Key": KEY}).status_code == 200
    ok = httpx.get(server.base + "/slots", headers={"Authorization": "Bearer second-key"})
    assert ok.status_code == 200
    bad = openai.OpenAI(base_url=server.base + "/v1", api_key="wrong", max_retries=0)
    assert [m.id for m in bad.models.list().data] == ["smollm2"]  # public, as llama-server
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model="smollm2", prompt="x", max_tokens=1)
    assert httpx.get(server.base + "/slots", headers={"X-Api-Key": "nope"}).status_code == 401


def test_cors_closed_by_default_and_opt_in():
    closed = TestClient(create_app(ServerState(ServerConfig())), base_url="http://localhost")
    r = closed.get("/health", headers={"Origin": "http://evil.example"})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
    pre = closed.options("/v1/chat/completions", headers={
        "Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})  # fmt: skip
    assert "access-control-allow-origin" not in pre.headers
    cfg = ServerConfig(cors_origins=("http://ok.example",), api_keys=("k",))
    opened = TestClient(create_app(ServerState(cfg)), base_url="http://localhost")
    pre = opened.options("/v1/chat/completions", headers={
        "Origin": "http://ok.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization"})  # fmt: skip
    assert pre.status_code == 200
    assert pre.headers["access-control-allow-origin"] == "http://ok.example"
    r = opened.get("/health", headers={"Origin": "http://other.example"})
    assert "access-control-allow-origin" not in r.headers


def test_loading_is_503_and_embeddings_route_with_embedder():
    class FakeEmbedder:
        """``Llama.embed``'s interface: pooled vectors (or per-token ones)."""

        per_token = False

        def tokenizer(self):
            raise AssertionError

        def embed(self, items, normalize=False, truncate=True, return_count=False):
            assert normalize == 2
            vecs = [[0.5, -1.0, float(i)] for i in range(len(items))]
            if self.per_token:
                vecs = [[v, v] for v in vecs]
            return (vecs, 2 * len(items)) if return_count else vecs

    gate = threading.Event()

    embedder = FakeEmbedder()

    def loader():
        gate.wait(10)
        return None, embedder

    state = ServerState(ServerConfig(), loader=loader, model_name="emb")
    with running(state) as base:
        r = httpx.get(base + "/health")
        assert r.status_code == 503 and r.json()["error"]["message"] == "Loading model"
        gate.set()
        while httpx.get(base + "/health").status_code != 200:
            time.sleep(0.02)
        client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0)
        emb = client.embeddings.create(model="emb", input=["a", "b"])  # base64 by default
        assert [d.embedding for d in emb.data] == [[0.5, -1.0, 0.0], [0.5, -1.0, 1.0]]
        emb = client.embeddings.create(model="emb", input="a", encoding_format="float")
        assert emb.data[0].embedding == [0.5, -1.0, 0.0]
        native_emb = httpx.post(base + "/embedding", json={"content": "a"}).json()
        assert native_emb == [{"index": 0, "embedding": [[0.5, -1.0, 0.0]]}]
        r = httpx.post(base + "/v1/chat/completions", json={"messages": []})
        assert r.status_code == 501
        r = httpx.post(base + "/v1/embeddings", json={"input": 5})
        assert r.status_code == 400
        embedder.per_token = True  # pooling none: per-token vectors, native route only
        r = httpx.post(base + "/v1/embeddings", json={"input": "a"})
        assert r.status_code == 400 and "Pooling type 'none'" in r.json()["error"]["message"]
        native_emb = httpx.post(base + "/embedding", json={"content": "a"}).json()
        assert native_emb == [{"index": 0, "embedding": [[0.5, -1.0, 0.0], [0.5, -1.0, 0.0]]}]


# --------------------------------------------------------------------------- the command
def serve_process(model: Path, log: Path, *flags: str) -> tuple[subprocess.Popen, str]:
    """``llamacpy serve`` as a process on a free port (2 slots, 1 thread) with ``flags``,
    once ``/health`` answers 200 (or after a minute); its output goes to ``log``."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    env = {**os.environ, "NUMBA_NUM_THREADS": "1"}
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "llamacpy", "serve", "-m", str(model), "--port", str(port),
             "-c", "512", "-np", "2", "-t", "1", *flags],
            stdout=out, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600  # a cold kernel cache compiles first
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(base + "/health", timeout=1).status_code == 200:
                break
        time.sleep(0.1)
    return proc, base


@pytest.mark.slow
def test_serve_command_drains_before_it_stops(smollm2_path, tmp_path):
    """``--drain-seconds``: after SIGTERM, /health and new requests answer 503 (a load
    balancer takes the replica out and retries elsewhere) while the in-flight stream goes
    on to its end; then the process exits 0."""
    proc, base = serve_process(smollm2_path, tmp_path / "log", "--drain-seconds", "3")
    try:
        body = {"prompt": "Count: 1, 2, 3,", "n_predict": 48, "temperature": 0,
                "ignore_eos": True, "stream": True}  # fmt: skip
        with httpx.stream("POST", base + "/completion", json=body, timeout=600) as r:
            lines = sse_events(r.iter_lines())
            first = json.loads(next(lines))
            proc.send_signal(signal.SIGTERM)
            t_signal = time.monotonic()
            health = 200
            while health == 200 and time.monotonic() < t_signal + 2:
                health = httpx.get(base + "/health", timeout=5).status_code
            assert health == 503
            new = httpx.post(base + "/completion", json={"prompt": "Hi", "n_predict": 2},
                             timeout=5)  # fmt: skip
            assert new.status_code == 503 and new.headers.get("retry-after") == "1"
            rest = [json.loads(e) for e in lines]
        events = [first, *rest]
        assert events[-1]["stop"] and events[-1]["tokens_predicted"] == 48
        assert proc.wait(30) == 0
        assert time.monotonic() - t_signal >= 2.5  # it waited out the drain
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_drain_seconds_is_checked(capsys):
    from llamacpy import cli

    assert cli.main(["serve", "-m", "x.gguf", "--drain-seconds", "-1"]) == 1
    assert "--drain-seconds must be 0..3600" in capsys.readouterr().err


@pytest.mark.slow
def test_serve_command_sigterm_is_graceful(smollm2_path, tmp_path):
    """``llamacpy serve`` as a process: in-flight streams finish after SIGTERM, the process
    exits 0, and the API key never appears in its output (even with -v)."""
    keyfile = tmp_path / "keys"
    keyfile.write_text("# keys\nfile-key-secret\n")
    log = tmp_path / "log"
    proc, base = serve_process(smollm2_path, log, "--api-key-file", str(keyfile), "-v",
                               "--shutdown-timeout", "20")  # fmt: skip
    headers = {"Authorization": "Bearer file-key-secret"}
    try:
        body = {"prompt": "Count: 1, 2, 3,", "n_predict": 24, "temperature": 0,
                "ignore_eos": True, "stream": True}  # fmt: skip
        with httpx.stream("POST", base + "/completion", json=body, headers=headers,
                          timeout=600) as r:  # fmt: skip
            assert r.status_code == 200
            lines = sse_events(r.iter_lines())
            first = json.loads(next(lines))
            proc.send_signal(signal.SIGTERM)
            rest = [json.loads(e) for e in lines]
        events = [first, *rest]
        assert events[-1]["stop"] and events[-1]["tokens_predicted"] == 24
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert "file-key-secret" not in text
    assert "POST /completion" in text  # -v logs requests, without their headers


def test_logit_bias_false_bans_the_token_and_is_echoed_as_false(server):
    base = native(server, prompt="The capital of France is", n_predict=2, temperature=0)
    first = server.http.post("/tokenize", json={"content": base["content"]}).json()["tokens"][0]
    r = native(server, prompt="The capital of France is", n_predict=2, temperature=0,
               logit_bias=[[first, False]])  # fmt: skip
    assert r["generation_settings"]["logit_bias"] == [[first, False]]
    again = server.http.post("/tokenize", json={"content": r["content"]}).json()["tokens"]
    assert again[0] != first


@pytest.mark.parametrize(
    "route, body",
    [
        ("/completion", {"prompt": "a\ud800b", "n_predict": 1}),
        ("/completion", {"prompt": "hi", "n_predict": 1, "stop": ["\ud800"]}),
        ("/completion", {"prompt": "hi", "n_predict": 1, "stream": True, "stop": ["\udfff"]}),
        ("/v1/completions", {"prompt": "a\ud800b", "max_tokens": 1}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x\udc00"}]}),
        ("/tokenize", {"content": "a\ud800"}),
    ],
)
def test_lone_surrogates_are_a_400_on_every_route(server, route, body):
    # json.dumps writes the escapes (\\ud800) that a client would send
    r = server.http.post(route, content=json.dumps(body).encode(),
                         headers={"Content-Type": "application/json"})  # fmt: skip
    assert r.status_code == 400, r.text
    assert "lone surrogate" in r.json()["error"]["message"]
    # a valid pair is one character and is fine
    ok = server.http.post("/tokenize", json={"content": "\U0001f600"})
    assert ok.status_code == 200


def _completion_lines(rec) -> list[str]:
    return [m for r in rec.handler.records if "/completion" in (m := r.getMessage())]


def test_access_log_counts_tokens_and_disconnects(server):
    from test_server_transport import _recording

    lg = logging.getLogger("llamacpy.access")
    level = lg.level
    lg.setLevel(logging.INFO)
    body = {"prompt": "Hello", "n_predict": 2, "temperature": 0}
    try:
        with _recording("llamacpy.access") as rec:
            native(server, **body)
            with server.http.stream("POST", "/completion", json={**body, "stream": True}) as r:
                list(r.iter_lines())
            with server.http.stream("POST", "/completion", json={
                **body, "n_predict": 400, "ignore_eos": True, "stream": True}) as r:  # fmt: skip
                lines = sse_events(r.iter_lines())
                next(lines)
            wait_idle(server)
            end = time.monotonic() + 30
            while len(_completion_lines(rec)) < 3 and time.monotonic() < end:
                time.sleep(0.05)
    finally:
        lg.setLevel(level)
    lines = _completion_lines(rec)
    assert len(lines) == 3, lines
    assert all('"POST /completion" 200 ' in ln for ln in lines)
    assert all("prompt=1 predicted=2" in ln for ln in lines[:2]), lines
    assert lines[2].endswith("client disconnected") and "Hello" not in "".join(lines)
