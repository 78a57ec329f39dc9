"""SmolLM2-135M (llama, Q4_1 + Q8_0) against llama.cpp: greedy continuations, perplexity and
top-1 agreement, logits; plus the model registry."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from llamacpy.engine import Batch, Context, ContextParams, generate
from llamacpy.errors import ModelError
from llamacpy.gguf import GGMLType, GGUFWriter
from llamacpy.models import load_model, model_class, supported_architectures

FIX = Path(__file__).parent / "fixtures" / "engine"
META = json.loads((FIX / "smollm2.json").read_text())
DATA = np.load(FIX / "smollm2.npz")

pytestmark = [pytest.mark.real_model]


@pytest.fixture(scope="module")
def ctx(smollm2_path: Path) -> Context:
    return Context(smollm2_path, ContextParams(n_ctx=4096, n_threads=2))


@pytest.mark.slow
def test_greedy_continuations_are_identical_to_llama_cpp(ctx: Context) -> None:
    for i, g in enumerate(META["greedy"]):
        assert g["completion_matches"], "fixture: llama-completion disagreed with the binding"
        ctx.clear()
        first = ctx.decode(Batch.from_tokens(g["ids"]))[0]
        np.testing.assert_array_equal(first[:4096], DATA["logits_head"][i])
        ctx.clear()
        assert generate(ctx, g["ids"], len(g["out"])) == g["out"], g["prompt"]


@pytest.mark.slow
def test_perplexity_and_top1_match_llama_perplexity(smollm2_path: Path) -> None:
    n_ctx = META["n_ctx"]
    p = ContextParams(n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_threads=2)
    ctx = Context(smollm2_path, p)
    tokens, top1 = DATA["tokens"], DATA["top1"]
    agree, nll, count = 0, 0.0, 0
    for c in range(META["n_chunk"]):
        chunk = tokens[c * n_ctx : (c + 1) * n_ctx]
        ctx.clear()
        logits = ctx.decode(Batch.from_tokens(chunk.tolist(), logits="all")).astype(np.float64)
        agree += int((logits.argmax(-1) == top1[c]).sum())
        # llama-perplexity scores the second half of each chunk
        x = logits[n_ctx // 2 : n_ctx - 1]
        mx = x.max(-1, keepdims=True)
        lse = np.log(np.exp(x - mx).sum(-1)) + mx[:, 0]
        lp = x[np.arange(len(x)), chunk[n_ctx // 2 + 1 :]] - lse
        np.testing.assert_allclose(lp, DATA["logp"][c], atol=1e-4)
        nll -= lp.sum()
        count += len(lp)
    assert agree / top1.size >= 0.99
    ppl = float(np.exp(nll / count))
    assert ppl == pytest.approx(META["ppl_llama_perplexity"], rel=5e-3)


def test_model_attributes_are_gguf_names(ctx: Context) -> None:
    m = ctx.model
    assert m.blk[0].attn_q.name == "blk.0.attn_q.weight"
    assert m.blk[29].ffn_down.name == "blk.29.ffn_down.weight"
    assert m.output is m.token_embd  # tied head
    assert len(m.blk) == m.hparams.n_layer == 30
    assert {"llama", "gemma3"} <= set(supported_architectures())
    assert model_class("llama") is type(m)


def test_unknown_architecture_lists_supported(tmp_path: Path) -> None:
    path = tmp_path / "nonesuch.gguf"
    w = GGUFWriter(path)
    w.add("general.architecture", "nonesuch")
    w.add_tensor("token_embd.weight", GGMLType.F32, (4, 4), np.zeros((4, 4), np.float32))
    w.write()
    listed = ", ".join(supported_architectures())
    with pytest.raises(ModelError, match=f"'nonesuch' is not supported.*supported: {listed}$"):
        load_model(path)
