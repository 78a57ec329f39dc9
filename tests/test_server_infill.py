"""``POST /infill`` against llama-server's answers (``tests/fixtures/generation/infill.json``,
from ``scripts/make_infill_fixtures.py``) on SmolLM2 given FIM tokens: the same prompt size
and the same greedy text for plain, prompt, extra-file, truncated, mixed-id and SPM requests;
a model without FIM tokens and bad bodies are clear 400s; the assembly in isolation."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from infill_cases import CASES, FIM_IDS, fim_model
from llamacpy.api.infill import infill_tokens
from test_server import running

FIXTURE = json.loads((Path(__file__).parent / "fixtures/generation/infill.json").read_text())


def _serve(path, spm=False):
    from llamacpy.api.serving import ServingModel
    from llamacpy.engine import ContextParams
    from llamacpy.server import ServerConfig, ServerState

    params = ContextParams(n_ctx=2048, n_batch=512, n_ubatch=512, n_threads=1, n_threads_batch=1)
    model = ServingModel.load(str(path), params, n_parallel=1)
    return model, ServerState(ServerConfig(spm_infill=spm), model, model_name="m")


@pytest.fixture(scope="module")
def fim_path(smollm2_path, tmp_path_factory):
    return fim_model(smollm2_path, tmp_path_factory.mktemp("fim"))


@pytest.mark.real_model
@pytest.mark.parametrize("spm", [False, True], ids=["psm", "spm"])
def test_answers_as_llama_server(fim_path, spm):
    want = {r["name"]: r for r in FIXTURE["cases"]}
    _, state = _serve(fim_path, spm)
    seen = 0
    with running(state) as base:
        for case in CASES:
            if case.get("spm", False) != spm:
                continue
            r = httpx.post(base + "/infill", json=case["body"], timeout=300)
            ref = want[case["name"]]
            assert r.status_code == ref["status"], (case["name"], r.text)
            if r.status_code == 200:
                got = r.json()
                assert got["tokens_evaluated"] == ref["n_prompt"], case["name"]
                assert got["content"] == ref["content"], case["name"]
            seen += 1
    assert seen == (1 if spm else len(CASES) - 1)


@pytest.mark.real_model
def test_refusals(fim_path, smollm2_path):
    _, state = _serve(smollm2_path)  # the plain file: no FIM tokens
    with running(state) as base:
        r = httpx.post(base + "/infill", json={"input_prefix": "a", "input_suffix": "b"})
        assert r.status_code == 400
        assert "no FIM prefix, suffix, middle token" in r.json()["error"]["message"]
    _, state = _serve(fim_path)
    with running(state) as base:
        for body, words in [
            ({"input_suffix": "b"}, '"input_prefix" is required'),
            ({"input_prefix": "a"}, '"input_suffix" is required'),
            ({"input_prefix": "a", "input_suffix": "b", "prompt": 5}, '"prompt" must be'),
            ({"input_prefix": 7, "input_suffix": "b"}, "'input_prefix' must be a string"),
            ({"input_prefix": ["a", 10**9], "input_suffix": "b"}, "not a string or a token"),
            ({"input_prefix": "a", "input_suffix": "b", "input_extra": {}}, "must be an array"),
            (
                {
                    "input_prefix": "a",
                    "input_suffix": "b",
                    "input_extra": [{"text": "t", "filename": 3}],
                },
                "field must be a string",
            ),
        ]:
            r = httpx.post(base + "/infill", json=body)
            assert r.status_code == 400 and words in r.json()["error"]["message"], (body, r.text)
        assert httpx.get(base + "/health").status_code == 200


def test_assembly_and_truncation(smollm2_path):
    from llamacpy.tokenizer import Tokenizer

    tok = Tokenizer.from_gguf(str(smollm2_path))
    for k, v in FIM_IDS.items():
        tok.vocab.special[k] = v
    pre, suf, mid, rep, sep = (FIM_IDS[k] for k in ("fim_pre", "fim_suf", "fim_mid", "fim_rep",
                                                     "fim_sep"))  # fmt: skip
    enc = lambda s: tok.encode(s, add_special=False, parse_special=False)  # noqa: E731
    extra = [{"filename": "a.py", "text": "A"}]
    out = infill_tokens(tok, [11, 12], [21], extra, [31], n_batch=512, n_predict=-1, n_ctx=2048)
    repo = [rep, *enc("myproject\n"), sep, *enc("a.py\n"), *enc("A"), sep, *enc("filename\n")]
    assert out == [*repo, pre, 11, 12, 31, suf, 21, mid]
    spm = infill_tokens(tok, [11, 12], [21], [], [], n_batch=512, n_predict=-1, n_ctx=2048,
                        spm=True)  # fmt: skip
    assert spm == [rep, *enc("myproject\n"), sep, *enc("filename\n"), suf, 21, pre, 11, 12, mid]
    # the prefix keeps its last 3/4 batch, the suffix its first batch/4 - 2 - len(prompt);
    # the extra context only what the context leaves after a batch and two generations
    long = list(range(100, 400))
    cut = infill_tokens(tok, long, long, extra, [31, 32], n_batch=64, n_predict=10, n_ctx=90)
    n_extra = 90 - 64 - 20
    assert cut == [*repo[-n_extra:], pre, *long[-48:], 31, 32, suf, *long[:12], mid]
    none = infill_tokens(tok, [1], [2], extra, [], n_batch=512, n_predict=-1, n_ctx=256)
    assert none == [pre, 1, suf, 2, mid]
