"""Greedy continuations identical to ``llama-completion``'s on varied prompts (prose, code,
lists, other languages, and one prompt past Gemma-3's 512-token sliding window), through
``llamacpy run`` and through the server's ``/completion``. Fixture: the first prompts of
``scripts/check_greedy_prompts.py --write-fixture`` (which runs all of them, 53 per model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from llamacpy import cli
from llamacpy.api.serving import ServingModel
from llamacpy.engine import ContextParams
from llamacpy.server import ServerConfig, ServerState, create_app

FIXTURE = json.loads(
    (Path(__file__).parent / "fixtures" / "engine" / "greedy_prompts.json").read_text()
)
N = FIXTURE["n_predict"]
PATHS = {"smollm2-135m": "smollm2_path", "gemma3-270m": "gemma3_path"}

pytestmark = [pytest.mark.real_model, pytest.mark.slow]


@pytest.fixture(scope="module", params=sorted(FIXTURE["models"]))
def model(request):
    return request.param, request.getfixturevalue(PATHS[request.param])


def test_command_line(model, capsys):
    name, path = model
    rows = FIXTURE["models"][name]
    assert len(rows) >= 12 and any(len(r["prompt"]) > 3000 for r in rows)
    differ = []
    for r in rows:
        code = cli.main(["run", "-m", str(path), "-c", "2048", "-t", "2", "--temp", "0",
                         "--no-display-prompt", "-n",
                         str(N), "-p", r["prompt"]])  # fmt: skip
        out, err = capsys.readouterr()
        assert code == 0, err
        if out != r["text"] + "\n":
            differ.append((r["prompt"][:40], out[:80], r["text"][:80]))
    assert not differ, differ


def test_server(model):
    name, path = model
    params = ContextParams(n_ctx=2048, n_threads=2, n_threads_batch=2)
    serving = ServingModel.load(str(path), params, n_parallel=1)
    state = ServerState(ServerConfig(), serving, model_name=name)
    differ = []
    with TestClient(create_app(state), base_url="http://localhost") as client:
        for r in FIXTURE["models"][name]:
            res = client.post("/completion", json={"prompt": r["prompt"], "n_predict": N, "cache_prompt": False,
                                                   "temperature": 0})  # fmt: skip
            assert res.status_code == 200, res.text
            if res.json()["content"] != r["text"]:
                differ.append((r["prompt"][:40], res.json()["content"][:80], r["text"][:80]))
    assert not differ, differ
