"""The ``granitehybrid`` architecture (IBM Granite 4.0 H, Bamba), as llama.cpp runs it: Mamba-2
layers and grouped-query attention layers, Granite's scalings, a dense SwiGLU FFN or a mixture
of experts with a shared expert.

A layer whose ``attention.head_count_kv`` entry is 0 is a Mamba-2 layer (a state per sequence:
the engine's hybrid memory; the mixer of :mod:`.mamba2`), the others attend over the KV cache
(rotated by position only when ``rope.scaling.finetuned`` is true, Bamba's files; Granite
4.0 H has no rope). Each block is

* ``h = rms_norm(x) * attn_norm``;
* the Mamba-2 mixer, or attention ``softmax(q . K^T * s) . V`` with ``s =
  attention.scale`` (when given, else ``1 / sqrt(head size)``), then ``. attn_output``;
* ``x += out * residual_scale``;
* ``h = rms_norm(x) * ffn_norm``; ``x += ffn_down(silu(ffn_gate(h)) * ffn_up(h)) *
  residual_scale`` -- or, with experts, ``x += (moe(h) + shared(h)) * residual_scale``
  (softmax router, the selected experts' weights divided by their sum; the shared
  expert, when ``expert_shared_feed_forward_length`` is given, a SwiGLU added ungated).

Token embeddings are multiplied by ``embedding_scale`` and the logits divided by
``logit_scale`` (each when given). The numpy specification is :mod:`.reference`'s stages.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np

from ..errors import ModelError
from ..hparams import HParams
from .decoder import LLAMA_TENSORS, Decoder
from .mamba2 import MAMBA2_STAGES, MAMBA2_TENSORS, SSM_PARAMS, ssm_sizes
from .moe import EXPERT_TENSORS, MOE_PARAMS
from .spec import Branch, Param, Tensor

_LLAMA = {t.field: t for t in LLAMA_TENSORS if isinstance(t, Tensor)}
SSM_TENSORS = tuple(replace(t, optional=True) for t in MAMBA2_TENSORS)
ATTENTION_TENSORS = tuple(
    replace(_LLAMA[f], optional=True) for f in ("attn_q", "attn_k", "attn_v", "attn_output")
)
COMMON_TENSORS = tuple(
    _LLAMA[f] for f in ("token_embd", "output_norm", "output", "attn_norm", "ffn_norm")
)
DENSE_TENSORS = tuple(_LLAMA[f] for f in ("ffn_gate", "ffn_up", "ffn_down"))
SHARED_EXPERT_TENSORS = (  # loaded into the dense FFN's fields (ffn_swiglu runs them)
    Tensor("blk.{i}.ffn_gate_shexp.weight", ("n_embd", "n_ff_shexp"), True, as_field="ffn_gate"),
    Tensor("blk.{i}.ffn_up_shexp.weight", ("n_embd", "n_ff_shexp"), True, as_field="ffn_up"),
    Tensor("blk.{i}.ffn_down_shexp.weight", ("n_ff_shexp", "n_embd"), True, as_field="ffn_down"),
)
SCALE_PARAMS = (
    Param("embedding_scale", "embedding_scale", 0.0),
    Param("residual_scale", "residual_scale", 0.0),
    Param("logit_scale", "logit_scale", 0.0),
    Param("attention_scale", "attention.scale", 0.0),
)
MIXER = Branch(
    "recurrent",
    MAMBA2_STAGES,  # the Mamba-2 mixer; x += out * residual_scale
    ("qkv", "rope", "kv_store", "attention", "out_proj"),  # x += att . wo * residual_scale
)
ATTN_SUFFIXES = ("attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias")
UNSUPPORTED = (*ATTN_SUFFIXES, "ffn_gate.bias", "ffn_up.bias", "ffn_down.bias", "attn_qkv.weight")


class GraniteHybridModel(Decoder):
    arch = "granitehybrid"
    tensors = COMMON_TENSORS + SSM_TENSORS + ATTENTION_TENSORS + DENSE_TENSORS
    params = SSM_PARAMS + SCALE_PARAMS
    unsupported = UNSUPPORTED
    per_layer_kv_heads = True
    block = ("attn_norm", MIXER, "out_rows", "ffn_norm", "ffn_swiglu", "ffn_down")
    expert_weights_norm: ClassVar[bool] = True  # llama.cpp's norm_w (granite's experts)

    @classmethod
    def variant(cls, md: Mapping[str, Any]) -> type[Decoder]:
        """Files with ``expert_count`` run :class:`GraniteHybridMoEModel` (with a shared
        expert when ``expert_shared_feed_forward_length`` is given)."""
        if md.get(f"{cls.arch}.expert_count"):
            if md.get(f"{cls.arch}.expert_shared_feed_forward_length"):
                return GraniteHybridSharedMoEModel
            return GraniteHybridMoEModel
        return GraniteHybridModel

    @classmethod
    def derived(cls, hp: HParams) -> HParams:
        hp = ssm_sizes(cls.arch, super().derived(hp))
        inner = hp.extra["ssm_d_inner"]
        if inner != 2 * hp.n_embd:  # llama.cpp: only an expansion factor of 2
            raise ModelError(
                f"{cls.arch}.ssm.inner_size ({inner}) must be 2 x embedding_length "
                f"({hp.n_embd}), as llama.cpp requires"
            )
        if hp.n_swa:
            raise ModelError(
                f"{cls.arch} with sliding-window attention (key {cls.arch}."
                "attention.sliding_window) is not supported yet"
            )
        return hp

    @classmethod
    def check(cls, md: Mapping, shapes: Mapping[str, tuple[int, ...]]) -> HParams:
        """The declarations' checks, then each layer's own tensors by its kind, and whether
        the attention layers rotate (``rope.scaling.finetuned``, default true)."""
        if cls.variant(md) is not cls:
            return cls.variant(md).check(md, shapes)
        hp = super().check(md, shapes)
        if hp.extra.get("kv_heads_per_layer") is None:
            raise ModelError(
                f"{cls.arch}.attention.head_count_kv must be given per layer (0: a Mamba-2 "
                "layer); a file without Mamba-2 layers is a granite or granitemoe model"
            )
        for il in range(hp.n_layer):
            ssm = hp.extra["kv_heads_per_layer"][il] == 0
            for t in SSM_TENSORS if ssm else ATTENTION_TENSORS:
                name = t.name.format(i=il)
                if name not in shapes and not name.endswith("ssm_conv1d.bias"):
                    what = "a Mamba-2" if ssm else "an attention"
                    raise ModelError(
                        f"tensor {name!r} is missing (layer {il} is {what} layer of {cls.arch})"
                    )
        key = f"{cls.arch}.rope.scaling.finetuned"
        rope = md.get(key, True)
        if not isinstance(rope, bool | np.bool_):
            raise ModelError(f"metadata key {key!r} must be a boolean, not {rope!r}")
        return hp.with_extra({"rope_on": int(bool(rope))})

    # ------------------------------------------------------------------ numeric choices
    def attention_scales(self) -> tuple[float, float]:
        s = self.hparams.extra["attention_scale"]
        return (float(np.float32(s)), 1.0) if s else super().attention_scales()

    def embd_scale(self) -> float:
        return self.hparams.extra["embedding_scale"] or 1.0

    def residual_scale(self) -> float:
        return self.hparams.extra["residual_scale"] or 1.0

    def logit_scale(self) -> float:
        """Logits are multiplied by this: ``1 / logit_scale`` in float32 (ggml_scale's)."""
        s = self.hparams.extra["logit_scale"]
        return float(np.float32(1.0) / np.float32(s)) if s else 1.0

    def layer_recurrent(self, il: int) -> bool:
        return self.hparams.extra["kv_heads_per_layer"][il] == 0

    def layer_rope(self, il: int) -> bool:
        return bool(self.hparams.extra["rope_on"])

    def state_sizes(self) -> tuple[int, int]:
        """Floats of a Mamba-2 layer's convolution row and of its scan row (per sequence)."""
        x = self.hparams.extra
        return (x["ssm_d_conv"] - 1) * x["ssm_channels"], x["ssm_d_inner"] * x["ssm_d_state"]


class GraniteHybridMoEModel(GraniteHybridModel):
    """Granite 4.0 H with routed experts in place of the dense FFN (softmax router)."""

    tensors = COMMON_TENSORS + SSM_TENSORS + ATTENTION_TENSORS + EXPERT_TENSORS
    params = GraniteHybridModel.params + MOE_PARAMS
    block = ("attn_norm", MIXER, "out_rows", "ffn_norm", "ffn_router", "ffn_moe")

    @classmethod
    def derived(cls, hp: HParams) -> HParams:
        hp = super().derived(hp)
        x = hp.extra
        n_ff_exp = x["n_ff_exp"] or hp.n_ff  # the experts' size is feed_forward_length
        if x["n_expert_used"] > x["n_expert"] or n_ff_exp % 16:
            raise ModelError(
                f"{cls.arch}: expert_used_count ({x['n_expert_used']}) must be at most "
                f"expert_count ({x['n_expert']}) and the experts' FFN size ({n_ff_exp}) a "
                "multiple of 16"
            )
        return hp.with_extra({"n_ff_exp": n_ff_exp})


class GraniteHybridSharedMoEModel(GraniteHybridMoEModel):
    """Routed experts and a shared expert added to their sum (ungated)."""

    tensors = GraniteHybridMoEModel.tensors + SHARED_EXPERT_TENSORS
    params = (
        *GraniteHybridMoEModel.params,
        Param("n_ff_shexp", "expert_shared_feed_forward_length", kind=int, minimum=16),
    )
    block = (
        "attn_norm", MIXER, "out_rows", "ffn_norm", "ffn_router", "ffn_moe_keep",
        "ffn_shexp_in", "ffn_swiglu", "ffn_shexp_add",
    )  # fmt: skip

    @classmethod
    def derived(cls, hp: HParams) -> HParams:
        hp = super().derived(hp)
        f = hp.extra["n_ff_shexp"]
        if f % 16:
            raise ModelError(
                f"unsupported shape: {cls.arch}.expert_shared_feed_forward_length ({f}) must "
                "be a multiple of 16"
            )
        return replace(hp, n_ff=f)  # (ffn_swiglu runs the shared expert)


MODEL = GraniteHybridModel
