"""Router mode (``serve`` without ``-m``): models from a directory, routed by the request's
``model``, loaded on first use, at most ``--models-max`` loaded (least recently used idle
one out), ``/models`` with load states, ``/models/load`` and ``/models/unload``, unloading
after idle time, an unknown model answered 404 with the list, a broken file an error on its
own requests only."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import openai
import pytest

from llamacpy import cli
from llamacpy.api.serving import ServingModel
from llamacpy.engine import ContextParams
from llamacpy.server import ServerConfig, ServerState
from llamacpy.server.router import Router, models_in
from test_server import running


def test_models_in_a_directory(tmp_path):
    for name in ("b.gguf", "a.gguf", "big-00001-of-00002.gguf", "big-00002-of-00002.gguf",
                 "notes.txt"):  # fmt: skip
        (tmp_path / name).write_bytes(b"")
    found = models_in(tmp_path)
    assert list(found) == ["a", "b", "big"]
    assert found["big"].name == "big-00001-of-00002.gguf"


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["serve"], "give a model with -m"),
        (["serve", "-m", "x.gguf", "--models-dir", "."], "not both"),
        (["serve", "--models-dir", "/nonexistent-dir"], "is not a directory"),
        (["serve", "--models-dir", ".", "--models-max", "0"], "--models-max"),
    ],
)
def test_router_flags_are_checked(argv, needle, capsys):
    assert cli.main(argv) == 1
    assert needle in capsys.readouterr().err


def _router(smollm2_path: Path, tmp_path: Path, **kw) -> Router:
    for name in ("a", "b"):
        (tmp_path / f"{name}.gguf").symlink_to(smollm2_path)
    (tmp_path / "broken.gguf").write_bytes(b"junk" * 8)
    cfg = ServerConfig(timeout=600)

    def make_state(name: str, path: Path) -> ServerState:
        def load():
            params = ContextParams(n_ctx=512, n_batch=128, n_ubatch=128, n_threads=1,
                                   n_threads_batch=1)  # fmt: skip
            return ServingModel.load(str(path), params, n_parallel=1, max_queue=2), None

        return ServerState(cfg, loader=load, model_name=name)

    return Router(cfg, models_in(tmp_path), make_state, **kw)


def _states(http: httpx.Client) -> dict[str, str]:
    return {m["id"]: m["status"]["value"] for m in http.get("/models").json()["data"]}


def test_routing_loading_and_eviction(smollm2_path, tmp_path):
    with running(_router(smollm2_path, tmp_path, max_loaded=1)) as base:
        http = httpx.Client(base_url=base, timeout=600)
        client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0)
        assert _states(http) == {"a": "unloaded", "b": "unloaded", "broken": "unloaded"}
        ask = [{"role": "user", "content": "Hi"}]
        r = client.chat.completions.create(model="a", messages=ask, max_tokens=4, temperature=0)
        assert r.model == "a" and r.choices[0].message.content
        assert _states(http)["a"] == "loaded"
        r2 = client.chat.completions.create(model="b", messages=ask, max_tokens=4, temperature=0)
        assert r2.choices[0].message.content == r.choices[0].message.content  # same weights
        assert _states(http) == {"a": "unloaded", "b": "loaded", "broken": "unloaded"}
        # a broken file: an error on its request only, and it evicts nothing
        with pytest.raises(openai.InternalServerError) as e:
            client.chat.completions.create(model="broken", messages=ask, max_tokens=2)
        assert "broken.gguf" in str(e.value) and "not a GGUF file" in str(e.value)
        assert _states(http)["b"] == "loaded" and _states(http)["broken"] == "failed"
        # an unknown model: 404 with the list
        with pytest.raises(openai.NotFoundError) as e:
            client.chat.completions.create(model="nope", messages=ask, max_tokens=2)
        assert "available: a, b, broken" in str(e.value)
        # no model named: the one loaded; GET routes take ?model=
        native = http.post("/completion", json={"prompt": "Hi", "n_predict": 2}).json()
        assert native["model"] == "b"
        assert http.get("/props", params={"model": "b"}).status_code == 200
        # explicit unload and load
        assert http.post("/models/unload", json={"model": "b"}).json() == {"success": True}
        assert _states(http)["b"] == "unloaded"
        r = http.post("/completion", json={"prompt": "Hi", "n_predict": 2})
        assert r.status_code == 400 and "several models" in r.json()["error"]["message"]
        assert http.post("/models/load", json={"model": "a"}).json() == {"success": True}
        assert _states(http)["a"] == "loaded"
        assert http.post("/models/load", json={}).status_code == 400


def test_no_autoload_and_idle_sleep(smollm2_path, tmp_path):
    router = _router(smollm2_path, tmp_path, autoload=False, sleep_idle=1.0)
    with running(router) as base:
        http = httpx.Client(base_url=base, timeout=600)
        body = {"model": "a", "prompt": "Hi", "n_predict": 2}
        r = http.post("/completion", json=body)
        assert r.status_code == 400 and "POST /models/load" in r.json()["error"]["message"]
        assert http.post("/models/load", json={"model": "a"}).status_code == 200
        assert http.post("/completion", json=body).status_code == 200
        deadline = time.monotonic() + 10
        while _states(http)["a"] == "loaded" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _states(http)["a"] == "unloaded"  # idle for a second: its memory is freed

        def chunks():  # no Content-Length: the router counts what it reads
            for _ in range(5):
                yield b" " * (1 << 20)

        r = http.post("/v1/completions", content=chunks(),
                      headers={"content-type": "application/json"})  # fmt: skip
        assert r.status_code == 413
