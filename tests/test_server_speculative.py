"""Speculative decoding in the server (``serve --spec-type``): a slot with proposals
verifies them in the step's batch with single-token numerics beside plain slots; one stream
returns the tokens plain serving returns; concurrent streams, disconnects and stop strings
leave every slot's cache consistent; the counters reach ``timings`` and ``/metrics``."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from llamacpy.api.serving import ServingModel
from llamacpy.api.speculative import DecodeCost, Speculator, make_proposer
from llamacpy.engine import ContextParams
from llamacpy.server import ServerConfig, ServerState
from test_server import running

pytestmark = pytest.mark.real_model

N_SLOTS = 3
TEXT = Path(__file__).read_text()[:1200]
PROMPT = f"Copy this text:\n{TEXT}\nCopy:\n{TEXT[:150]}"


def _server(path, speculator, deterministic=False):
    params = ContextParams(n_ctx=3 * 1024, n_batch=512, n_ubatch=512, n_threads=2,
                           n_threads_batch=2, n_seq_max=N_SLOTS,
                           deterministic=deterministic)  # fmt: skip
    model = ServingModel.load(str(path), params, n_parallel=N_SLOTS, max_queue=8,
                              speculator=speculator)  # fmt: skip
    return model, ServerState(ServerConfig(timeout=300, metrics=True), model, model_name="m")


@pytest.fixture(scope="module", params=["default", "deterministic"])
def servers(smollm2_path, request):
    """A plain and a speculating server (in deterministic contexts for the concurrency
    test: there a sequence's logits do not depend on the batches and cells it shared)."""
    cost = DecodeCost()

    def spec():
        return Speculator(make_proposer("prompt-lookup"), adaptive=False, cost=cost)

    det = request.param == "deterministic"
    _, plain_state = _server(smollm2_path, None, det)
    spec_model, spec_state = _server(smollm2_path, spec, det)
    with running(plain_state) as a, running(spec_state) as b:
        yield SimpleNamespace(
            plain=httpx.Client(base_url=a, timeout=300),
            spec=httpx.Client(base_url=b, timeout=300),
            model=spec_model,
            deterministic=det,
        )


def _complete(http, prompt=PROMPT, **kw):
    body = {"prompt": prompt, "n_predict": 48, "temperature": 0, **kw}
    r = http.post("/completion", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def _slot_caches_consistent(model):
    kv = model.ctx.kv
    for s in model.scheduler.slots:
        assert kv.seq_pos_max(s.id) == len(s.tokens) - 1, s.id


def test_one_stream_equals_plain_serving(servers):
    if servers.deterministic:
        pytest.skip("the default servers run this one")
    for prompt in (PROMPT, PROMPT[:700], "def fib(n):\n    if n < 2:\n        return n\n"):
        for kw in ({}, {"temperature": 0.8, "seed": 5}, {"stop": ["\n\n"]}):
            a = _complete(servers.plain, prompt, **kw)
            b = _complete(servers.spec, prompt, **kw)
            assert a["content"] == b["content"], (prompt[:20], kw)
            assert a["stop_type"] == b["stop_type"]
    t = b["timings"]
    c = servers.model.scheduler.counters
    assert c.n_draft_tokens > c.n_draft_accepted > 0  # proposals verified, some rejected
    assert "draft_n" in _complete(servers.spec)["timings"]
    _slot_caches_consistent(servers.model)
    assert t["predicted_n"] > 0
    m = servers.spec.get("/metrics")
    assert m.status_code == 200
    line = next(ln for ln in m.text.splitlines()
                if ln.startswith("llamacpp:spec_decode_num_draft_tokens_total "))  # fmt: skip
    assert int(float(line.split()[1])) == c.n_draft_tokens


def test_concurrent_streams_and_a_disconnect(servers):
    if not servers.deterministic:
        pytest.skip("the deterministic servers run this one")
    out: dict[int, str] = {}

    def go(i: int) -> None:
        out[i] = _complete(servers.spec, PROMPT[: 400 + 200 * i], n_predict=40)["content"]

    threads = [threading.Thread(target=go, args=(i,)) for i in range(N_SLOTS)]
    for t in threads:
        t.start()
    # a streamed request dropped after a few chunks
    with servers.spec.stream("POST", "/completion", json={"prompt": PROMPT, "n_predict": 200,
                             "temperature": 0, "stream": True}) as r:  # fmt: skip
        for n, _ in enumerate(r.iter_lines()):
            if n > 3:
                break
    for t in threads:
        t.join()
    assert len(out) == N_SLOTS and all(out.values())
    assert servers.model.scheduler.wait_idle(60)
    _slot_caches_consistent(servers.model)
    # the slots serve the same request as plain serving afterwards
    for prompt in (PROMPT, PROMPT[:500]):
        assert (
            _complete(servers.spec, prompt)["content"]
            == _complete(servers.plain, prompt)["content"]
        )
