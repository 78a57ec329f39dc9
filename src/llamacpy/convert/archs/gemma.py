"""Gemma 3 text models (``Gemma3ForCausalLM``, the text part of
``Gemma3ForConditionalGeneration``) -> ``gemma3``.

Gemma's RMSNorm multiplies by ``1 + weight``, so every norm weight is stored plus one;
token embedding rows beyond the tokenizer's vocabulary are dropped.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import numpy as np

from ..common import ConvertError
from ..kv import KV, T
from .base import Lazy, TextArch
from .llama import LLAMA_NAMES

GEMMA3_NAMES = {
    **LLAMA_NAMES,
    "model.layers.{bid}.self_attn.q_norm": "blk.{bid}.attn_q_norm",
    "model.layers.{bid}.self_attn.k_norm": "blk.{bid}.attn_k_norm",
    "model.layers.{bid}.post_attention_layernorm": "blk.{bid}.post_attention_norm",
    "model.layers.{bid}.pre_feedforward_layernorm": "blk.{bid}.ffn_norm",
    "model.layers.{bid}.post_feedforward_layernorm": "blk.{bid}.post_ffw_norm",
}


def _plus_one(w: np.ndarray) -> np.ndarray:
    # in the tensor's own precision (float16 stays float16), as the converter does
    return w + w.dtype.type(1)


class Gemma3(TextArch):
    arch = "gemma3"
    hf_architectures = ("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration")
    names = GEMMA3_NAMES

    def set_vocab(self, kv: KV) -> None:
        from ..vocab import set_vocab_gpt2, set_vocab_sentencepiece

        if (self.dir / "tokenizer.model").is_file():
            set_vocab_sentencepiece(kv, self.dir, self.hp)
            kv.add("tokenizer.ggml.add_space_prefix", False, T.BOOL)
        else:
            set_vocab_gpt2(kv, self.dir, self.hp)

    def set_params(self, kv: KV, ftype: int) -> None:
        super().set_params(kv, ftype)
        hp, a = self.hp, kv.add_arch
        a("context_length", hp.get("max_position_embeddings", 131072), T.UINT32)
        a("attention.head_count", hp.get("num_attention_heads", 8), T.UINT32)
        a("attention.layer_norm_rms_epsilon", hp.get("rms_norm_eps", 1e-6), T.FLOAT32)
        a("attention.key_length", hp.get("head_dim", 256), T.UINT32)
        a("attention.value_length", hp.get("head_dim", 256), T.UINT32)
        rp = self.rope.get("full_attention", self.rope)
        a("rope.freq_base", rp.get("rope_theta", 1_000_000.0), T.FLOAT32)
        if hp.get("attn_logit_softcapping") is not None:
            raise ConvertError("Gemma 3 models have no attn_logit_softcapping")
        if final := hp.get("final_logit_softcapping"):
            a("final_logit_softcapping", final, T.FLOAT32)
        if hp.get("sliding_window_pattern") != 1:
            if "sliding_window" not in hp or hp["sliding_window"] is None:
                raise ConvertError("config.json has no sliding_window")
            a("attention.sliding_window", hp["sliding_window"], T.UINT32)
        a("attention.head_count_kv", hp.get("num_key_value_heads", 4), T.UINT32)

    def _n_vocab_real(self) -> int:
        if (self.dir / "tokenizer.model").is_file():
            from ..vocab import spm_vocab

            return len(spm_vocab(self.dir, self.hp)[0])
        with open(self.dir / "tokenizer.json", encoding="utf-8") as f:
            tj = json.load(f)
        return len(tj["model"]["vocab"]) + len(tj["added_tokens"])

    def modify(self, name: str, bid: int | None, data: Lazy) -> Iterable[tuple[str, Lazy]]:
        if "embed_tokens.weight" in name:
            n = self._n_vocab_real()
            if n < data.shape[0]:
                data = data.then(lambda w: w[:n], shape=(n, *data.shape[1:]))
        if name.endswith("norm.weight"):
            data = data.then(_plus_one)
        yield self.map_name(name), data
