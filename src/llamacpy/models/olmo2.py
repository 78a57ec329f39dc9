"""The ``olmo2`` architecture (OLMo 2, and OLMo 3's files), as llama.cpp runs it.

No pre-norms: the layer's input goes to q/k/v as it is; q and k are RMS-normed over the whole
projection (``attn_q_norm`` of ``n_head * head_dim`` weights, ``attn_k_norm`` of ``n_head_kv *
head_dim``, not per head) before a NeoX rope; then ``x += rms_norm(attn_output(...)) *
post_attention_norm`` and ``x += rms_norm(ffn_down(silu(ffn_gate(x)) * ffn_up(x))) *
post_ffw_norm``. Attention scores are scaled by ``1/sqrt(head_dim)``.

Sliding-window attention (OLMo 3): when ``olmo2.attention.sliding_window`` is set, layer
``il`` is local unless ``il % pattern == pattern - 1`` (``attention.sliding_window_pattern``,
default 4), or as listed by a boolean array under that key. Local layers rope with the
context's base, no frequency scaling and no YaRN (``freq_scale`` 1, ``ext_factor`` 0,
``attn_factor`` 1), as llama.cpp's olmo2 graph does (its ``rope.freq_base_swa`` is not read
there).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ..ops.rope import RopeParams
from .decoder import LLAMA_TENSORS, Decoder
from .gemma3 import swa_layers
from .spec import Tensor

DEFAULT_SWA_PATTERN = 4
_NO_PRE_NORMS = ("blk.{i}.attn_norm.weight", "blk.{i}.ffn_norm.weight")


class Olmo2Model(Decoder):
    arch = "olmo2"
    tensors = (
        *(t for t in LLAMA_TENSORS if t.name not in _NO_PRE_NORMS),
        Tensor("blk.{i}.attn_q_norm.weight", ("n_embd_q",)),
        Tensor("blk.{i}.attn_k_norm.weight", ("n_embd_k_gqa",)),
        Tensor("blk.{i}.post_attention_norm.weight", ("n_embd",)),
        Tensor("blk.{i}.post_ffw_norm.weight", ("n_embd",)),
    )
    unsupported = ("attn_qkv.weight", "attn_q.bias", "attn_output.bias", "ffn_gate_inp.weight")
    block = (
        "attn_in",  # h = x (no pre-norm)
        "qkv",
        "qk_norm_full",  # q = rms_norm(q) * attn_q_norm, k likewise, over all heads
        "rope",
        "kv_store",
        "attention",
        "out_proj_post_norm",  # x += rms_norm(att . attn_output) * post_attention_norm
        "out_rows",
        "ffn_in",  # h = x (no pre-norm)
        "ffn_swiglu",
        "ffn_down_post_norm",  # x += rms_norm(g . ffn_down) * post_ffw_norm
    )
    rope_neox = True

    def swa_layers(self, md: Mapping[str, Any]) -> tuple[bool, ...]:
        return swa_layers(md, self.arch, self.hparams.n_layer, DEFAULT_SWA_PATTERN)

    def rope_swa_params(self, md: Mapping[str, Any], rope: RopeParams) -> RopeParams:
        """llama.cpp: local layers rope with the context's base, unscaled, without YaRN."""
        return replace(rope, freq_scale=1.0, ext_factor=0.0, attn_factor=1.0)


MODEL = Olmo2Model
