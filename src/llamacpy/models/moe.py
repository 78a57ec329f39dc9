"""Mixture-of-experts feed-forward, what the architectures with experts share (``qwen3moe``,
``llama`` files with ``llama.expert_count``: Mixtral).

A layer's FFN is a router ``ffn_gate_inp`` ``[n_embd, n_expert]`` and ``n_expert`` SwiGLU
experts held as 3-D tensors (``ffn_gate_exps`` / ``ffn_up_exps`` ``[n_embd, n_ff_exp,
n_expert]``, ``ffn_down_exps`` ``[n_ff_exp, n_embd, n_expert]``; the store keeps one matrix
per expert, :meth:`.weights.WeightStore.experts`). The block's ``ffn_swiglu``, ``ffn_down``
become ``ffn_router`` (softmax of the router logits, the ``n_expert_used`` most probable
experts and their weights) and ``ffn_moe`` (each selected expert's FFN, the outputs times
their weights added in the order of the selection, then to the residual), as llama.cpp's
``build_moe_ffn`` with softmax gating.
"""

from __future__ import annotations

from typing import ClassVar

from ..errors import ModelError
from ..hparams import HParams
from .decoder import Decoder
from .spec import Fused, Param, Tensor

MOE_PARAMS = (
    Param("n_expert", "expert_count", kind=int, minimum=1),
    Param("n_expert_used", "expert_used_count", kind=int, minimum=1),
    Param("n_ff_exp", "expert_feed_forward_length", default=0, kind=int, minimum=0),
)
EXPERT_TENSORS = (
    Tensor("blk.{i}.ffn_gate_inp.weight", ("n_embd", "n_expert")),
    Tensor("blk.{i}.ffn_gate_exps.weight", ("n_embd", "n_ff_exp", "n_expert")),
    Tensor("blk.{i}.ffn_up_exps.weight", ("n_embd", "n_ff_exp", "n_expert")),
    Tensor("blk.{i}.ffn_down_exps.weight", ("n_ff_exp", "n_embd", "n_expert")),
)
DENSE_FFN = ("ffn_gate", "ffn_up", "ffn_down")


def with_experts(tensors: tuple[Tensor | Fused, ...]) -> tuple[Tensor | Fused, ...]:
    """``tensors`` with the dense FFN's matrices replaced by the router and the experts."""
    kept = tuple(t for t in tensors if not (isinstance(t, Tensor) and t.field in DENSE_FFN))
    return kept + EXPERT_TENSORS


def moe_block(block: tuple, ffn: tuple[str, ...] = ("ffn_router", "ffn_moe")) -> tuple:
    """``block`` with its SwiGLU FFN (``ffn_swiglu``, ``ffn_down``) replaced by ``ffn``: the
    router and the experts (qwen35moe: and a shared expert)."""
    i = block.index("ffn_swiglu")
    if block[i : i + 2] != ("ffn_swiglu", "ffn_down"):
        raise ValueError("a mixture of experts replaces ffn_swiglu, ffn_down")
    return (*block[:i], *ffn, *block[i + 2 :])


class MoEDecoder(Decoder):
    """A decoder whose FFN is a mixture of experts (softmax router, SwiGLU experts)."""

    params = MOE_PARAMS
    expert_weights_norm: ClassVar[bool] = True  # llama.cpp's norm_w

    @classmethod
    def default_n_ff_exp(cls, hp: HParams) -> int:
        """An expert's FFN size when the file has no ``expert_feed_forward_length``."""
        return hp.n_ff

    @classmethod
    def derived(cls, hp: HParams) -> HParams:
        hp = super().derived(hp)
        n_expert, n_used = hp.extra["n_expert"], hp.extra["n_expert_used"]
        if n_used > n_expert:
            raise ModelError(
                f"{cls.arch}.expert_used_count ({n_used}) is larger than "
                f"{cls.arch}.expert_count ({n_expert})"
            )
        n_ff_exp = hp.extra["n_ff_exp"] or cls.default_n_ff_exp(hp)
        if n_ff_exp <= 0 or n_ff_exp % 16:
            raise ModelError(
                f"unsupported shape: the experts' FFN size ({n_ff_exp}, key "
                f"{cls.arch}.expert_feed_forward_length) must be a positive multiple of 16"
            )
        return hp.with_extra({"n_ff_exp": n_ff_exp})
