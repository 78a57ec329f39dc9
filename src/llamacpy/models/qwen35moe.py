"""The ``qwen35moe`` architecture (Qwen3.5 / Qwen3.6 MoE: Qwen3.5-35B-A3B, -122B-A10B,
-397B-A17B), as llama.cpp runs it: :mod:`.qwen35`'s hybrid of Gated DeltaNet and gated full
attention layers, with a mixture of experts in place of the dense FFN.

After ``h = rms_norm(x) * post_attention_norm``, each block's FFN is

* the routed experts (:mod:`.moe`): a softmax router ``ffn_gate_inp`` over ``expert_count``
  experts, the ``expert_used_count`` most probable ones, their weights divided by their sum;
  SwiGLU experts of ``expert_feed_forward_length`` (default ``feed_forward_length /
  expert_used_count``);
* and a shared expert every token goes through: a SwiGLU FFN (``ffn_gate_shexp``,
  ``ffn_up_shexp``, ``ffn_down_shexp``) of ``expert_shared_feed_forward_length`` (default
  ``feed_forward_length``) whose output is multiplied by ``sigmoid(h . ffn_gate_inp_shexp)``
  (a gate vector of ``n_embd``);

``x += (routed + gated shared)``: the two added first, then to the residual. The shared
expert runs as the dense FFN stages over the ``ffn_gate`` / ``ffn_up`` / ``ffn_down`` fields
(so the model's ``n_ff`` is the shared expert's size).
"""

from __future__ import annotations

from dataclasses import replace

from ..hparams import HParams
from .moe import MOE_PARAMS, MoEDecoder, moe_block, with_experts
from .qwen35 import ATTENTION_TENSORS, COMMON_TENSORS, DELTA_NET_TENSORS, Qwen35Model
from .spec import Param, Tensor

SHARED_EXPERT_TENSORS = (
    Tensor("blk.{i}.ffn_gate_inp_shexp.weight", ("n_embd",)),
    Tensor("blk.{i}.ffn_gate_shexp.weight", ("n_embd", "n_ff"), as_field="ffn_gate"),
    Tensor("blk.{i}.ffn_up_shexp.weight", ("n_embd", "n_ff"), as_field="ffn_up"),
    Tensor("blk.{i}.ffn_down_shexp.weight", ("n_ff", "n_embd"), as_field="ffn_down"),
)


# after the FFN's norm: the routed experts kept apart, the shared expert's gate and SwiGLU,
# then both added to the residual
SHARED_EXPERT_FFN = ("ffn_router", "ffn_moe_keep", "ffn_shexp_gate", "ffn_swiglu", "ffn_shexp_down")


class Qwen35MoEModel(Qwen35Model, MoEDecoder):
    arch = "qwen35moe"
    tensors = (
        with_experts(COMMON_TENSORS) + SHARED_EXPERT_TENSORS + DELTA_NET_TENSORS + ATTENTION_TENSORS
    )
    params = (
        *Qwen35Model.params,
        *MOE_PARAMS,
        Param("n_ff_shexp", "expert_shared_feed_forward_length", 0, int, 0),
    )
    unsupported = ("ffn_gate_up_exps.weight", "attn_q.bias", "attn_k.bias", "attn_v.bias")
    block = moe_block(Qwen35Model.block, SHARED_EXPERT_FFN)

    @classmethod
    def default_n_ff_exp(cls, hp: HParams) -> int:
        return hp.n_ff // hp.extra["n_expert_used"]

    @classmethod
    def derived(cls, hp: HParams) -> HParams:
        """qwen35's and the experts' sizes, then ``n_ff`` = the shared expert's size."""
        hp = super().derived(hp)
        return replace(hp, n_ff=hp.extra["n_ff_shexp"] or hp.n_ff)


MODEL = Qwen35MoEModel
