"""Llama and Mistral (``LlamaForCausalLM``, ``MistralForCausalLM``) -> ``llama``.

Q and K projections are permuted from Hugging Face's rotate-half RoPE layout back to the
interleaved layout llama.cpp uses; Llama 3.1-style RoPE scaling becomes a ``rope_freqs``
tensor.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from ..common import ConvertError, read_json_if_exists
from ..kv import KV, T
from ..special import SpecialVocab
from .base import Lazy, TextArch

LLAMA_NAMES = {
    "model.embed_tokens": "token_embd",
    "model.norm": "output_norm",
    "lm_head": "output",
    "model.layers.{bid}.input_layernorm": "blk.{bid}.attn_norm",
    "model.layers.{bid}.self_attn.q_proj": "blk.{bid}.attn_q",
    "model.layers.{bid}.self_attn.k_proj": "blk.{bid}.attn_k",
    "model.layers.{bid}.self_attn.v_proj": "blk.{bid}.attn_v",
    "model.layers.{bid}.self_attn.o_proj": "blk.{bid}.attn_output",
    "model.layers.{bid}.post_attention_layernorm": "blk.{bid}.ffn_norm",
    "model.layers.{bid}.mlp.gate_proj": "blk.{bid}.ffn_gate",
    "model.layers.{bid}.mlp.up_proj": "blk.{bid}.ffn_up",
    "model.layers.{bid}.mlp.down_proj": "blk.{bid}.ffn_down",
}


def permute_qk(w: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """Hugging Face's q/k row order (two halves per head) -> llama.cpp's (interleaved)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    rows = w.shape[0]
    return np.ascontiguousarray(
        w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def llama3_rope_factors(rp: dict, dim: int) -> np.ndarray:
    """The ``rope_freqs`` tensor of Llama 3.1 RoPE scaling, in float32 arithmetic as the
    converter computes it with torch (``1/x`` is a reciprocal, ``a/b`` a division)."""
    f32 = np.float32
    base = float(rp.get("rope_theta", 10000.0))
    factor = rp.get("factor", 8.0)
    low, high = rp.get("low_freq_factor", 1.0), rp.get("high_freq_factor", 4.0)
    old_ctx = rp.get("original_max_position_embeddings", 8192)
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    exps = np.arange(0, dim, 2, dtype=np.float32) / f32(dim)
    # base ** exps, correctly rounded (torch's vectorized powf may differ by 1 ulp)
    powed = (np.float64(base) ** exps.astype(np.float64)).astype(np.float32)
    out = []
    for p in powed:
        freq = f32(1) / p
        wavelen = (f32(1) / freq) * f32(2 * math.pi)
        if wavelen < f32(high_wavelen):
            out.append(f32(1))
        elif wavelen > f32(low_wavelen):
            out.append(f32(factor))
        else:
            smooth = ((f32(1) / wavelen) * f32(old_ctx) - f32(low)) / f32(high - low)
            out.append(f32(1) / ((f32(1) - smooth) / f32(factor) + smooth))
    return np.array(out, dtype=np.float32)


class Llama(TextArch):
    arch = "llama"
    hf_architectures = ("LlamaForCausalLM", "LLaMAForCausalLM", "MistralForCausalLM", "LlamaModel")
    names = LLAMA_NAMES
    undo_permute = True

    def head_dim(self) -> int:
        hd = self.hp.get("head_dim")
        return (
            int(hd)
            if hd is not None
            else int(self.need("hidden_size")) // int(self.need("num_attention_heads"))
        )

    def set_params(self, kv: KV, ftype: int) -> None:
        super().set_params(kv, ftype)
        kv.add_arch("vocab_size", self.need("vocab_size"), T.UINT32)
        kv.add_arch("rope.dimension_count", self.head_dim(), T.UINT32)

    def rename(self, name: str) -> str | None:
        return super().rename(name.replace("text_model.", ""))

    def modify(self, name: str, bid: int | None, data: Lazy) -> Iterable[tuple[str, Lazy]]:
        if "block_sparse_moe" in name or ".experts." in name:
            raise ConvertError(f"mixture-of-experts models are not supported (tensor {name!r})")
        if self.hf_arch == "LlamaModel":
            name = "model." + name
        if self.undo_permute:
            n_head = int(self.need("n_heads", "num_attention_heads"))
            n_kv = int(self.need("n_kv_heads", "num_key_value_heads"))
            if name.endswith(("q_proj.weight", "q_proj.bias")):
                data = self._permuted(name, data, n_head, n_head)
            elif name.endswith(("k_proj.weight", "k_proj.bias")):
                data = self._permuted(name, data, n_head, n_kv)
        yield self.map_name(name), data

    @staticmethod
    def _permuted(name: str, data: Lazy, n_head: int, n_kv: int) -> Lazy:
        heads = n_kv if n_kv != n_head else n_head
        if not data.shape or data.shape[0] % (2 * heads):
            raise ConvertError(
                f"tensor {name!r} has shape {data.shape}: its rows are not a multiple of "
                f"2 x {heads} heads"
            )
        return data.then(lambda w: permute_qk(w, n_head, n_kv))

    def extra_tensors(self, kv: KV) -> Iterable[tuple[str, Lazy]]:
        rp = self.rope.get("full_attention", self.rope)
        if rp and str(rp.get("rope_type", "")).lower() == "llama3":
            yield "rope_freqs.weight", Lazy.const(llama3_rope_factors(rp, self.head_dim()))

    def set_vocab(self, kv: KV) -> None:
        from ..vocab import set_vocab_gpt2, set_vocab_llama_hf, set_vocab_sentencepiece

        tc = read_json_if_exists(self.dir / "tokenizer_config.json")
        if isinstance(tc, dict) and (prefix := tc.get("add_prefix_space")) is not None:
            kv.add("tokenizer.ggml.add_space_prefix", bool(prefix), T.BOOL)
        if (self.dir / "tekken.json").is_file() and not (self.dir / "tokenizer.json").is_file():
            raise ConvertError("Mistral tekken.json tokenizers are not supported")
        try:
            set_vocab_sentencepiece(kv, self.dir, self.hp)
        except FileNotFoundError:
            try:
                set_vocab_llama_hf(kv, self.dir, self.hp)
            except (FileNotFoundError, TypeError):
                set_vocab_gpt2(kv, self.dir, self.hp)
        vocab_size = self.hp.get("vocab_size", 32000)
        if vocab_size == 32016:  # CodeLlama's infill tokens (only eot has a GGUF key)
            sv = SpecialVocab(self.dir, types=["prefix", "suffix", "middle", "eot"])
            sv.set("eot", 32010)
            sv.write(kv)
        if vocab_size == 49152:  # small Granite models
            kv.add("tokenizer.ggml.add_bos_token", False, T.BOOL)

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        hp = self.hp
        try:
            n_embd, n_head = int(hp["hidden_size"]), int(hp["num_attention_heads"])
            n_kv, n_ff = int(hp["num_key_value_heads"]), int(hp["intermediate_size"])
        except (KeyError, TypeError, ValueError):
            return {}
        hd = self.head_dim()
        b = r"blk\.\d+\."
        return {
            b + r"attn_q\.weight": (n_head * hd, n_embd),
            b + r"attn_k\.weight": (n_kv * hd, n_embd),
            b + r"attn_v\.weight": (n_kv * hd, n_embd),
            b + r"attn_output\.weight": (n_embd, n_head * hd),
            b + r"ffn_(gate|up)\.weight": (n_ff, n_embd),
            b + r"ffn_down\.weight": (n_embd, n_ff),
            b + r"(attn|ffn)_norm\.weight": (n_embd,),
            r"output_norm\.weight": (n_embd,),
        }
