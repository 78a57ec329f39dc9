"""``--cache-reuse`` (llama-server's ``n_cache_reuse``): past the common prefix, cached chunks
that a new prompt repeats are moved into place instead of decoded again. The tokens reused
and the greedy text after them against llama-server's (``scripts/make_cache_reuse_fixtures.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from llamacpy.api.serving import ServingModel
from llamacpy.engine import ContextParams
from llamacpy.server import ServerConfig, ServerState
from test_server import running

FIX = json.loads((Path(__file__).parent / "fixtures/server/cache_reuse.json").read_text())


@pytest.fixture(scope="module")
def server(smollm2_path):
    params = ContextParams(n_ctx=2048, n_batch=512, n_ubatch=512, n_threads=2, n_threads_batch=2)
    model = ServingModel.load(str(smollm2_path), params, n_parallel=1, max_queue=4)
    cfg = ServerConfig(timeout=600, metrics=True, cache_reuse=FIX["n_cache_reuse"])
    with running(ServerState(cfg, model, model_name="smol")) as base:
        yield httpx.Client(base_url=base, timeout=600)


def _second(server, case, **extra):
    server.post("/completion", json={"prompt": case["first"], "n_predict": 8, "temperature": 0})
    r = server.post("/completion", json={"prompt": case["second"], "n_predict": 24,
                                         "temperature": 0, **extra})  # fmt: skip
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("i", range(len(FIX["cases"])))
def test_reused_tokens_and_text_as_llama_server(server, i):
    case = FIX["cases"][i]
    r = _second(server, case)
    t = r["timings"]
    assert (t["cache_n"], t["prompt_n"]) == (case["cache_n"], case["prompt_n"])
    assert r["content"] == case["content"]


def test_reuse_is_per_request_and_counted(server):
    case = FIX["cases"][0]
    off = _second(server, case, n_cache_reuse=0)  # off for this request: the prefix only
    assert off["timings"]["cache_n"] < case["cache_n"]
    before = server.get("/metrics").text
    on = _second(server, case)
    assert on["timings"]["cache_n"] == case["cache_n"]
    slot = server.get("/slots").json()[0]
    assert slot["n_cache_reused"] == case["cache_n"] - off["timings"]["cache_n"]

    def count(text):
        line = next(x for x in text.splitlines()
                    if x.startswith("llamacpp:prompt_cache_reuse_tokens_total"))  # fmt: skip
        return float(line.rsplit(" ", 1)[1])

    assert count(server.get("/metrics").text) - count(before) == slot["n_cache_reused"]
    bad = server.post("/completion", json={"prompt": "x", "n_cache_reuse": -1})
    assert bad.status_code == 400 and "n_cache_reuse" in bad.text


def test_reuse_needs_a_cache_that_holds_every_position(gemma3_path, smollm2_path):
    """Gemma-3's sliding-window layers keep only the window: nothing can be moved (llama.cpp
    turns reuse off there too), unless the window part holds the whole context."""
    from llamacpy.engine import Context

    def ctx(path, **kw):
        return Context(str(path), ContextParams(n_ctx=4096, n_threads=1, n_threads_batch=1, **kw))

    assert ctx(smollm2_path).can_shift
    assert not ctx(gemma3_path).can_shift
    assert ctx(gemma3_path, swa_full=True).can_shift
