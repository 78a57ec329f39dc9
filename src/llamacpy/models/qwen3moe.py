"""The ``qwen3moe`` architecture (Qwen3-30B-A3B, Qwen3-Coder-30B-A3B, Qwen3-235B-A22B), as
llama.cpp runs it: qwen3's attention (per-head Q/K RMSNorm before NeoX rope, head size
``attention.key_length``) and a mixture-of-experts FFN in every layer (:mod:`.moe`): a
softmax router over ``expert_count`` experts, the ``expert_used_count`` most probable ones,
their weights divided by their sum; SwiGLU experts of ``expert_feed_forward_length`` (default
``feed_forward_length / expert_used_count``).
"""

from __future__ import annotations

from ..hparams import HParams
from .decoder import BIASES, LLAMA_BLOCK, LLAMA_TENSORS, QK_NORM_TENSORS, after
from .moe import MoEDecoder, moe_block, with_experts


class Qwen3MoEModel(MoEDecoder):
    arch = "qwen3moe"
    tensors = with_experts(LLAMA_TENSORS + QK_NORM_TENSORS)
    unsupported = ("attn_qkv.weight", *BIASES, "ffn_gate_shexp.weight", "cls_out.weight")
    # ..., ffn_norm, ffn_router (softmax, top-k, weights), ffn_moe (the experts' SwiGLU)
    block = moe_block(after(LLAMA_BLOCK, "qkv", "qk_norm"))
    rope_neox = True

    @classmethod
    def default_n_ff_exp(cls, hp: HParams) -> int:
        return hp.n_ff // hp.extra["n_expert_used"]


MODEL = Qwen3MoEModel
