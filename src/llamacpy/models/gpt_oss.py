"""The ``gpt-oss`` architecture (gpt-oss-20b, gpt-oss-120b), as llama.cpp runs it
(``openai-moe``).

A block: ``h = rms_norm(x) * attn_norm``; q/k/v with their biases; NeoX rope (YaRN in the
released files); attention whose softmax has one more learned score per head with no value
(``attn_sinks``); ``x += att . attn_output + attn_output.bias``; then ``h = rms_norm(x) *
post_attention_norm`` (the FFN's input norm, so named) and a mixture of experts: router
logits ``h . ffn_gate_inp + bias``, the ``expert_used_count`` largest of them, the softmax of
those as the weights; each expert ``((swiglu_oai(h . gate + gate_b, h . up + up_b)) . down +
down_b)`` (:func:`~llamacpy.ops.activations.swiglu_oai`: gate clamped above at 7, up to
[-7, 7], ``x * sigmoid(1.702 x) * (up + 1)``), weighted and added to ``x``. The last layer's
FFN runs on every row (llama.cpp keeps the output rows only after the last layer).

Layers alternate sliding-window (even layers, window ``attention.sliding_window``) and full
attention (``attention.sliding_window_pattern``, default 2); the sliding-window layers rope
with ``rope.freq_base_swa`` (default ``rope.freq_base``) and the file's frequency scale.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ..ops.rope import RopeParams
from . import stages
from .common import rope_params
from .decoder import LLAMA_TENSORS
from .gemma3 import swa_layers
from .moe import MOE_PARAMS, MoEDecoder, with_experts
from .spec import Param, Tensor

EXPERT_BIASES = (
    Tensor("blk.{i}.ffn_gate_inp.bias", ("n_expert",)),
    Tensor("blk.{i}.ffn_gate_exps.bias", ("n_ff_exp", "n_expert")),
    Tensor("blk.{i}.ffn_up_exps.bias", ("n_ff_exp", "n_expert")),
    Tensor("blk.{i}.ffn_down_exps.bias", ("n_embd", "n_expert")),
)


class GptOssModel(MoEDecoder):
    arch = "gpt-oss"
    tensors = (
        *(t for t in with_experts(LLAMA_TENSORS) if t.field != "ffn_norm"),
        Tensor("blk.{i}.attn_q.bias", ("n_embd_q",), optional=True),
        Tensor("blk.{i}.attn_k.bias", ("n_embd_k_gqa",), optional=True),
        Tensor("blk.{i}.attn_v.bias", ("n_embd_v_gqa",), optional=True),
        Tensor("blk.{i}.attn_output.bias", ("n_embd",)),
        Tensor("blk.{i}.attn_sinks.weight", ("n_head",)),
        Tensor("blk.{i}.post_attention_norm.weight", ("n_embd",)),
        *EXPERT_BIASES,
    )
    params = (*MOE_PARAMS, Param("freq_base_swa", "rope.freq_base_swa", 0.0, float, 0.0))
    unsupported = ("attn_qkv.weight",)
    block = (
        "attn_norm",
        "qkv",
        "qkv_bias",
        "rope",
        "kv_store",
        "attention",  # with the layer's sinks
        "out_proj_bias",  # x += att . attn_output + attn_output.bias
        "ffn_post_attn_norm",  # h = rms_norm(x) * post_attention_norm
        "ffn_router",  # logits + bias, the largest k, softmax over them
        "ffn_moe",  # biased experts, clamped SwiGLU
    )
    rope_neox = True
    expert_weights_norm = False
    expert_gating = stages.GATING_SOFTMAX_WEIGHT
    expert_act = stages.ACT_SWIGLU_OAI

    def swa_layers(self, md: Mapping[str, Any]) -> tuple[bool, ...]:
        return swa_layers(md, self.arch, self.hparams.n_layer, default=2)

    def rope_swa_params(self, md: Mapping[str, Any], rope: RopeParams) -> RopeParams:
        """llama.cpp: sliding-window layers take their base and scale from the file, not
        from the context."""
        hp = self.hparams
        own = rope_params(md, self.arch, hp.n_rot, hp.n_ctx_train, self.rope_neox, None)
        base = hp.extra["freq_base_swa"] or own.freq_base
        return replace(rope, freq_base=base, freq_scale=own.freq_scale)


MODEL = GptOssModel
