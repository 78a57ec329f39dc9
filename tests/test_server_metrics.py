"""Request-level ``/metrics`` (histograms of time to first token, inter-token latency,
end-to-end latency, queue wait, prompt and generated tokens; KV-cache bytes, busy slots,
aborts and prompt-cache hits), read back with ``prometheus_client``'s own parser and checked
against the requests the test made."""

from __future__ import annotations

import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from llamacpy.api.serving import ServingModel
from llamacpy.engine import ContextParams
from llamacpy.engine.request_stats import Histogram
from llamacpy.server import ServerConfig, ServerState
from test_server import running


def test_histogram_buckets_are_cumulative():
    h = Histogram((1.0, 2.0, 5.0))
    for v in (0.5, 1.0, 1.5, 7.0):
        h.observe(v)
    assert h.cumulative() == [("1", 2), ("2", 3), ("5", 3), ("+Inf", 4)]
    assert h.count == 4 and h.sum == 10.0


def _families(text: str) -> dict:
    out = {}
    for fam in text_string_to_metric_families(text):
        out[fam.name] = fam
    return out


def _value(fams, name, suffix="", **labels):
    fam = fams[name]
    for s in fam.samples:
        if s.name == name + suffix and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    raise KeyError(name + suffix)


@pytest.fixture(scope="module")
def server(smollm2_path):
    params = ContextParams(n_ctx=1024, n_batch=128, n_ubatch=128, n_threads=1, n_threads_batch=1)
    model = ServingModel.load(str(smollm2_path), params, n_parallel=2, max_queue=4)
    state = ServerState(ServerConfig(timeout=600, metrics=True), model, model_name="smol")
    with running(state) as base:
        yield httpx.Client(base_url=base, timeout=600)


def test_request_metrics_count_what_happened(server):
    done = []
    prompt = "Once upon a time, in a land far away, there lived a"
    for _ in range(2):  # the second reuses the first's cached prompt
        r = server.post("/completion", json={"prompt": prompt, "n_predict": 6, "temperature": 0})
        done.append(r.json()["tokens_predicted"])
    with server.stream(
        "POST",
        "/completion",
        json={
            "prompt": "Tell me a long story.",
            "n_predict": 400,
            "stream": True,
            "ignore_eos": True,
            "temperature": 0,
        },
    ) as r:
        for line in r.iter_lines():  # leave after the first streamed token: an abort
            if line.startswith("data: "):
                break
    fams = {}
    for _ in range(100):  # the abort is seen by the engine thread shortly after
        fams = _families(server.get("/metrics").text)
        if _value(fams, "llamacpp:requests_aborted", "_total", model="smol") >= 1:
            break
        time.sleep(0.05)
    lab = {"model": "smol"}
    assert _value(fams, "llamacpp:requests_aborted", "_total", **lab) == 1
    assert _value(fams, "llamacpp:e2e_request_latency_seconds", "_count", **lab) == 3
    assert _value(fams, "llamacpp:time_to_first_token_seconds", "_count", **lab) == 3
    assert _value(fams, "llamacpp:request_queue_time_seconds", "_count", **lab) == 3
    gen_sum = _value(fams, "llamacpp:request_generation_tokens", "_sum", **lab)
    gen_n = _value(fams, "llamacpp:request_generation_tokens", "_count", **lab)
    assert gen_n == 3 and gen_sum >= sum(done) + 1
    itl = _value(fams, "llamacpp:inter_token_latency_seconds", "_count", **lab)
    assert itl == gen_sum - 3  # every token after each request's first
    inf = _value(fams, "llamacpp:e2e_request_latency_seconds", "_bucket", le="+Inf", **lab)
    assert inf == 3
    assert _value(fams, "llamacpp:prompt_cache_hits", "_total", **lab) >= 1
    assert _value(fams, "llamacpp:prompt_cache_hit_tokens", "_total", **lab) >= 10
    assert _value(fams, "llamacpp:slots_total", **lab) == 2
    assert _value(fams, "llamacpp:kv_cache_size_bytes", **lab) > 0
    used = _value(fams, "llamacpp:kv_cache_used_bytes", **lab)
    assert 0 < used <= _value(fams, "llamacpp:kv_cache_size_bytes", **lab)
    # llama-server's own series are still there, unlabelled
    assert _value(fams, "llamacpp:prompt_tokens", "_total") > 0
