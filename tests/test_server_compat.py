"""llama-server's documented API details, with the real SmolLM2 model: ``logit_bias`` keyed
by text, a negative temperature meaning greedy, streamed ``/completion`` chunks carrying the
slot and the prompt's token count, ``/metrics`` only with ``--metrics``."""

from __future__ import annotations

import json

import httpx

from llamacpy.server import ServerConfig, ServerState
from test_server import native, running, sse_events
from test_server import server as server  # the module-scoped fixture

PROMPT = "The capital of France is"


def test_negative_temperature_is_greedy(server):
    greedy = native(server, prompt=PROMPT, n_predict=6, temperature=0)
    cold = native(server, prompt=PROMPT, n_predict=6, temperature=-1, seed=7)
    assert cold["content"] == greedy["content"]
    assert cold["generation_settings"]["temperature"] == -1


def test_logit_bias_keyed_by_text_biases_each_of_its_tokens(server):
    base = native(server, prompt=PROMPT, n_predict=1, temperature=0)
    word = base["content"]  # " Paris"
    ids = server.model.tokenize(word, add_special=False, parse_special=False)
    for bias in ([[word, -100]], [[word, False]], {word: -100}):
        r = native(server, prompt=PROMPT, n_predict=1, temperature=0, logit_bias=bias)
        assert r["content"] != word, bias
        echoed = r["generation_settings"]["logit_bias"]
        assert [t for t, _ in echoed] == ids
    r = native(server, prompt=PROMPT, n_predict=1, temperature=0, logit_bias=[[word, 5]])
    assert r["content"] == word
    too_long = server.http.post("/completion", json={"prompt": PROMPT, "n_predict": 1,
                                                     "logit_bias": [["x" * 5000, 1]]})  # fmt: skip
    assert too_long.status_code == 400


def test_streamed_chunks_carry_the_slot_and_the_prompt_size(server):
    n_prompt = len(server.model.tokenize(PROMPT))
    body = {"prompt": PROMPT, "n_predict": 4, "temperature": 0, "stream": True}
    with server.http.stream("POST", "/completion", json=body) as r:
        events = [json.loads(e) for e in sse_events(r.iter_lines())]
    slot = events[-1]["id_slot"]
    assert slot >= 0 and len(events) >= 2
    for e in events:
        assert e["id_slot"] == slot and e["tokens_evaluated"] == n_prompt, e


def test_metrics_only_with_the_flag(server):
    assert server.http.get("/metrics").status_code == 200  # this server has metrics=True
    with running(ServerState(ServerConfig(), model_name="m")) as base:  # no --metrics
        r = httpx.get(base + "/metrics", timeout=600)
    assert r.status_code == 501 and "--metrics" in r.json()["error"]["message"]
