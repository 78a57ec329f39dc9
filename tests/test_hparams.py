"""Model-level consistency checks run before inference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llamacpy.errors import ModelError
from llamacpy.gguf import GGUFReader
from llamacpy.hparams import HParams
from llamacpy.models import check_model, model_class
from llamacpy.models.spec import read_hparams, shape_of


def _llama(**overrides):
    md = {
        "general.architecture": "llama",
        "llama.context_length": 128,
        "llama.embedding_length": 64,
        "llama.block_count": 2,
        "llama.feed_forward_length": 96,
        "llama.attention.head_count": 4,
        "llama.attention.head_count_kv": 2,
        "llama.attention.layer_norm_rms_epsilon": 1e-5,
        "tokenizer.ggml.tokens": [f"t{i}" for i in range(100)],
    }
    md.update(overrides)
    return {k: v for k, v in md.items() if v is not None}


def _shapes(hp: HParams) -> dict[str, tuple[int, ...]]:
    """The required tensors of the architecture's declarations, with their shapes."""
    out = {}
    for t in model_class(hp.arch).tensors:
        if getattr(t, "optional", True):
            continue
        for i in range(hp.n_layer) if t.per_layer else (None,):
            out[t.name.format(i=i)] = shape_of(hp, t)
    return out


def test_llama_hparams_and_shapes() -> None:
    md = _llama()
    hp = HParams.from_gguf(md)
    assert (hp.n_embd, hp.n_head, hp.n_head_kv, hp.n_embd_head_k, hp.n_vocab) == (64, 4, 2, 16, 100)
    shapes = _shapes(hp)
    assert shapes["blk.1.attn_k.weight"] == (64, 32)
    assert shapes["token_embd.weight"] == (64, 100)
    assert check_model(md, shapes) == hp


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"general.architecture": None}, "general.architecture"),
        ({"llama.embedding_length": None}, "'llama.embedding_length' is missing"),
        ({"llama.attention.head_count": 6}, "not divisible by attention.head_count"),
        ({"llama.attention.head_count_kv": 3}, "not a multiple of attention.head_count_kv"),
        ({"llama.block_count": 0}, "'llama.block_count' is 0"),
        ({"llama.block_count": "2"}, "'llama.block_count' must be an integer"),
        ({"llama.context_length": 2**40}, "implausibly large"),
        ({"llama.attention.layer_norm_rms_epsilon": float("nan")}, "invalid value nan"),
        ({"llama.rope.dimension_count": 17}, "rope.dimension_count"),
        ({"llama.attention.head_count": np.array([4, 8], dtype=np.int32)}, "per-layer values"),
    ],
)
def test_bad_hyperparameters(overrides, message) -> None:
    with pytest.raises(ModelError, match=message):
        HParams.from_gguf(_llama(**overrides))


def test_per_layer_kv_heads_and_ffn_sizes_are_read_and_left_to_the_model() -> None:
    """Per-layer ``head_count_kv`` and ``feed_forward_length`` arrays whose values differ are
    read (the largest as the model's size, the list in ``extra``); an architecture that
    does not declare them refuses the file naming the key (gemma4 declares both)."""
    kv = np.array([2, 1], dtype=np.int32)
    ff = np.array([96, 192], dtype=np.int32)
    md = _llama(**{"llama.attention.head_count_kv": kv, "llama.feed_forward_length": ff})
    hp = HParams.from_gguf(md)
    assert (hp.n_head_kv, hp.n_ff) == (2, 192)
    assert hp.extra["kv_heads_per_layer"] == (2, 1) and hp.extra["ff_per_layer"] == (96, 192)
    for key, value in (("attention.head_count_kv", kv), ("feed_forward_length", ff)):
        with pytest.raises(ModelError, match=f"'llama.{key}'"):
            check_model(_llama(**{f"llama.{key}": value}), {})
    with pytest.raises(ModelError, match="a layer of size 0"):
        HParams.from_gguf(_llama(**{"llama.feed_forward_length": np.array([96, 0])}))


def test_missing_and_misshaped_tensors() -> None:
    md = _llama()
    shapes = _shapes(HParams.from_gguf(md))
    del shapes["blk.1.ffn_down.weight"]
    with pytest.raises(ModelError, match="'blk.1.ffn_down.weight' is missing"):
        check_model(md, shapes)
    shapes = _shapes(HParams.from_gguf(md))
    shapes["blk.0.attn_q.weight"] = (64, 48)
    with pytest.raises(
        ModelError, match=r"'blk.0.attn_q.weight' has shape \(64, 48\), expected \(64, 64\)"
    ):
        check_model(md, shapes)
    shapes = _shapes(HParams.from_gguf(md))
    shapes["output.weight"] = (64, 99)
    with pytest.raises(ModelError, match="output.weight"):
        check_model(md, shapes)


def test_vocab_size_disagreeing_with_tokenizer() -> None:
    md = _llama(**{"llama.vocab_size": 90})
    with pytest.raises(ModelError, match="vocab_size is 90 but tokenizer.ggml.tokens has 100"):
        check_model(md, _shapes(HParams.from_gguf(md)))


def test_unknown_architecture_is_named_with_the_supported_ones() -> None:
    with pytest.raises(ModelError, match="architecture 'mamba9' is not supported.*supported: "):
        check_model(_llama(**{"general.architecture": "mamba9"}), {})


def test_vocab_from_embedding_when_no_tokenizer() -> None:
    md = _llama(**{"tokenizer.ggml.tokens": None})
    hp = HParams.from_gguf(md, n_vocab=100)
    assert check_model(md, _shapes(hp)).n_vocab == 100


def _moe(arch: str = "qwen3moe", **overrides):
    md = {k.replace("llama.", f"{arch}."): v for k, v in _llama().items()}
    md |= {"general.architecture": arch, f"{arch}.expert_count": 4}
    md[f"{arch}.expert_used_count"] = 2
    md.update(overrides)
    return {k: v for k, v in md.items() if v is not None}


def _moe_shapes(md) -> tuple[type, HParams, dict[str, tuple[int, ...]]]:
    """The class a file runs as, its hyper-parameters and its required tensors' shapes."""
    cls = model_class(md["general.architecture"]).variant(md)
    hp = cls.derived(read_hparams(cls.arch, md, {}, cls.params))
    out = {}
    for t in cls.tensors:
        if not t.optional:
            for i in range(hp.n_layer) if t.per_layer else (None,):
                out[t.name.format(i=i)] = shape_of(hp, t)
    return cls, hp, out


def test_experts_hparams_and_shapes() -> None:
    md = _moe()  # qwen3moe: experts of feed_forward_length / expert_used_count by default
    _, hp, shapes = _moe_shapes(md)
    assert (hp.extra["n_expert"], hp.extra["n_expert_used"], hp.extra["n_ff_exp"]) == (4, 2, 48)
    assert shapes["blk.1.ffn_gate_inp.weight"] == (64, 4)
    assert shapes["blk.1.ffn_up_exps.weight"] == (64, 48, 4)
    assert shapes["blk.1.ffn_down_exps.weight"] == (48, 64, 4)
    assert "blk.1.ffn_up.weight" not in shapes
    assert check_model(md, shapes).extra == hp.extra
    md = _moe(**{"qwen3moe.expert_feed_forward_length": 32})
    assert _moe_shapes(md)[2]["blk.0.ffn_gate_exps.weight"] == (64, 32, 4)
    shapes = _moe_shapes(md)[2]
    shapes["blk.0.ffn_down_exps.weight"] = (32, 64, 3)
    with pytest.raises(ModelError, match=r"ffn_down_exps.weight' has shape \(32, 64, 3\)"):
        check_model(md, shapes)
    # a llama file with experts runs as Mixtral: experts of feed_forward_length
    md = _moe("llama")
    cls, hp, shapes = _moe_shapes(md)
    assert cls.block[-2:] == ("ffn_router", "ffn_moe") and hp.extra["n_ff_exp"] == 96
    assert check_model(md, shapes).extra == hp.extra
    shapes = _shapes(HParams.from_gguf(_llama()))
    shapes["blk.0.ffn_gate_inp.weight"] = (64, 4)  # experts without llama.expert_count
    with pytest.raises(ModelError, match="ffn_gate_inp.weight.*not supported"):
        check_model(_llama(), shapes)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"qwen3moe.expert_count": None}, "'qwen3moe.expert_count' is missing"),
        ({"qwen3moe.expert_used_count": 5}, r"expert_used_count \(5\) is larger"),
        ({"qwen3moe.expert_feed_forward_length": 24}, "multiple of 16"),
        ({"qwen3moe.expert_count": 2.5}, "must be an integer"),
    ],
)
def test_bad_expert_hyperparameters(overrides, message) -> None:
    with pytest.raises(ModelError, match=message):
        _moe_shapes(_moe(**overrides))


@pytest.mark.real_model
def test_real_models_pass(smollm2_path: Path, gemma3_path: Path) -> None:
    with GGUFReader(smollm2_path) as r:
        hp = check_model(r.metadata, {t.name: t.shape for t in r.tensors})
        assert (hp.arch, hp.n_layer, hp.n_embd, hp.n_head, hp.n_head_kv) == ("llama", 30, 576, 9, 3)
    with GGUFReader(gemma3_path) as r:
        hp = check_model(r.metadata, {t.name: t.shape for t in r.tensors})
        assert (hp.arch, hp.n_layer, hp.n_embd_head_k, hp.n_swa) == ("gemma3", 18, 256, 512)
