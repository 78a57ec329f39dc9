"""The ``lfm2moe`` architecture (LFM2-8B-A1B, LFM2-24B-A2B), as llama.cpp runs it:
:mod:`.lfm2`'s layers, whose FFN after the first ``leading_dense_block_count`` layers is a
mixture of experts with sigmoid gating.

The router's logits go through a sigmoid; the ``expert_used_count`` experts with the
largest ``sigmoid + exp_probs_b`` are chosen and weighted by their sigmoid alone, divided by
the weights' sum (and times ``expert_weights_scale`` when the file has one); each expert is
a SwiGLU FFN (llama.cpp's ``build_moe_ffn`` with ``expert_gating_func`` 2).
"""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import ModelError
from ..hparams import HParams
from . import stages
from .lfm2 import ATTENTION_TENSORS, CONV_TENSORS, Lfm2Model
from .lfm2 import COMMON_TENSORS as LFM2_COMMON
from .moe import DENSE_FFN, MOE_PARAMS, MoEDecoder
from .spec import Branch, Param, Tensor

DENSE_TENSORS = tuple(
    Tensor(t.name, t.shape, optional=True) for t in LFM2_COMMON if t.field in DENSE_FFN
)
EXPERT_TENSORS = (
    Tensor("blk.{i}.ffn_gate_inp.weight", ("n_embd", "n_expert"), optional=True),
    Tensor("blk.{i}.ffn_gate_exps.weight", ("n_embd", "n_ff_exp", "n_expert"), optional=True),
    Tensor("blk.{i}.ffn_up_exps.weight", ("n_embd", "n_ff_exp", "n_expert"), optional=True),
    Tensor("blk.{i}.ffn_down_exps.weight", ("n_ff_exp", "n_embd", "n_expert"), optional=True),
    Tensor("blk.{i}.exp_probs_b.bias", ("n_expert",), optional=True, as_field="ffn_exp_probs_b"),
)
COMMON_TENSORS = tuple(t for t in LFM2_COMMON if t.field not in DENSE_FFN)
SIGMOID = 2  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID


class Lfm2MoeModel(Lfm2Model, MoEDecoder):
    arch = "lfm2moe"
    tensors = COMMON_TENSORS + DENSE_TENSORS + EXPERT_TENSORS + CONV_TENSORS + ATTENTION_TENSORS
    params = (
        *Lfm2Model.params,
        *MOE_PARAMS,
        Param("n_dense_lead", "leading_dense_block_count", 0, int, 0),
        Param("expert_gating_func", "expert_gating_func", kind=int, minimum=0),
        Param("expert_weights_scale", "expert_weights_scale", 0.0, float),
    )
    unsupported = ("attn_qkv.weight", "dense_2_out.weight", "ffn_gate_up_exps.weight")
    block = (
        *Lfm2Model.block[: Lfm2Model.block.index("ffn_swiglu")],
        Branch("moe", ("ffn_router", "ffn_moe"), ("ffn_swiglu", "ffn_down")),
    )
    expert_gating = stages.GATING_SIGMOID
    expert_weights_norm = True

    @classmethod
    def derived(cls, hp: HParams) -> HParams:
        hp = super().derived(hp)
        x = hp.extra
        if x["expert_gating_func"] != SIGMOID:
            raise ModelError(
                f"{cls.arch}.expert_gating_func is {x['expert_gating_func']}; only the sigmoid "
                f"router ({SIGMOID}) of {cls.arch} is supported"
            )
        if x["n_dense_lead"] > hp.n_layer:
            raise ModelError(
                f"{cls.arch}.leading_dense_block_count ({x['n_dense_lead']}) is more than the "
                f"{hp.n_layer} layers"
            )
        return hp

    @classmethod
    def check(cls, md: Mapping, shapes: Mapping[str, tuple[int, ...]]) -> HParams:
        """:class:`.lfm2.Lfm2Model`'s checks, then each layer's FFN: dense in the leading
        layers, experts (with the selection bias) after them."""
        hp = super().check(md, shapes)
        lead = hp.extra["n_dense_lead"]
        for il in range(hp.n_layer):
            need = DENSE_TENSORS if il < lead else EXPERT_TENSORS
            for t in need:
                name = t.name.format(i=il)
                if name not in shapes:
                    what = "a dense" if il < lead else "a mixture-of-experts"
                    raise ModelError(
                        f"tensor {name!r} is missing (layer {il} has {what} FFN in {cls.arch}, "
                        f"leading_dense_block_count = {lead})"
                    )
        return hp

    @property  # type: ignore[override]
    def expert_weights_scale(self) -> float:  # the file's (0: none)
        return float(self.hparams.extra["expert_weights_scale"])


MODEL = Lfm2MoeModel
