"""The ``deepseek2`` architecture (DeepSeek-V2, -V2.5, -V3, -R1, Kimi-K2 and other files
converted as DeepseekV2/V3), as llama.cpp runs the files converted today: multi-head latent
attention in its absorbed form and a mixture of experts with shared experts.

Attention (per layer, ``h = rms_norm(x) * attn_norm``):

* queries ``q = rms_norm(h . attn_q_a) * attn_q_a_norm . attn_q_b`` (``attention.q_lora_rank``;
  or ``h . attn_q`` when the file has no low-rank query), ``n_head`` heads of
  ``attention.key_length_mla`` = nope | rope (``rope.dimension_count``);
* ``kv_a = h . attn_kv_a_mqa``: the latent (``attention.kv_lora_rank``) then one rope key
  shared by the heads; the latent is RMS-normed (``attn_kv_a_norm``), the rope parts of the
  queries and key rotated (normal rope, YaRN with DeepSeek's magnitude scale);
* the cache holds one row per token: latent | rope key (``attention.key_length`` =
  kv_lora_rank + rope dims, one KV head: ``(kv_lora_rank + n_rot) * 2`` bytes per token and
  layer in f16, 1152 for V3); each query head's nope part is absorbed into the latent
  (``attn_k_b``, one ``[kv_lora_rank, nope]`` matrix per head), attends over the rows as MQA,
  each row the key and its latent the value, and its output goes through ``attn_v_b`` (one
  ``[v_head, kv_lora_rank]`` per head) to ``attn_output``;
* K.Q scale ``mscale^2 / sqrt(key_length_mla)``, ``mscale = attn_factor * (1 + 0.1 ln(1 /
  freq_scale)) * (1 + 0.1 yarn_log_mul ln(1 / freq_scale))`` (the file's log multiplier is
  stored times 0.1), as llama.cpp's graph.

FFN: the first ``leading_dense_block_count`` layers a SwiGLU FFN of ``feed_forward_length``;
the others ``expert_count`` SwiGLU experts of ``expert_feed_forward_length`` behind a router
(``expert_gating_func``: softmax, V2, or sigmoid, V3; a selection bias ``exp_probs_b`` only
chooses; ``expert_group_count`` groups of which the ``expert_group_used_count`` best, a group
scored by its two best experts; the weights normalized with ``expert_weights_norm`` and
multiplied by ``expert_weights_scale``), plus ``expert_shared_count`` shared experts run as
one SwiGLU FFN of ``n_ff_exp * expert_shared_count`` added to the routed sum.

Files with the older ``attn_kv_b`` (not split into ``attn_k_b`` / ``attn_v_b``), attention
temperature scaling (Mistral-Large-3) or multi-token prediction layers are refused by name.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from ..errors import ModelError
from ..hparams import HParams
from ..ops.rope import RopeParams
from . import stages
from .common import RopeOverrides, rope_params
from .moe import MOE_PARAMS, MoEDecoder
from .spec import Branch, Param, Tensor

_F32 = np.float32
SOFTMAX, SIGMOID = 1, 2  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_*

COMMON_TENSORS = (
    Tensor("token_embd.weight", ("n_embd", "n_vocab")),
    Tensor("output_norm.weight", ("n_embd",)),
    Tensor("output.weight", ("n_embd", "n_vocab"), optional=True),  # absent: token_embd
    Tensor("blk.{i}.attn_norm.weight", ("n_embd",)),
    Tensor("blk.{i}.attn_q_a.weight", ("n_embd", "n_lora_q"), optional=True),
    Tensor("blk.{i}.attn_q_a_norm.weight", ("n_lora_q",), optional=True),
    Tensor("blk.{i}.attn_q_b.weight", ("n_lora_q", "n_q_mla"), optional=True),
    Tensor("blk.{i}.attn_q.weight", ("n_embd", "n_q_mla"), optional=True),  # lite files
    Tensor("blk.{i}.attn_kv_a_mqa.weight", ("n_embd", "n_kv_a")),
    Tensor("blk.{i}.attn_kv_a_norm.weight", ("n_lora_kv",)),
    Tensor("blk.{i}.attn_k_b.weight", ("qk_nope", "n_lora_kv", "n_head")),
    Tensor("blk.{i}.attn_v_b.weight", ("n_lora_kv", "head_v_mla", "n_head")),
    Tensor("blk.{i}.attn_output.weight", ("n_o_mla", "n_embd")),
    Tensor("blk.{i}.ffn_norm.weight", ("n_embd",)),
)
# the leading dense layers' FFN
DENSE_TENSORS = (
    Tensor("blk.{i}.ffn_gate.weight", ("n_embd", "n_ff"), optional=True),
    Tensor("blk.{i}.ffn_up.weight", ("n_embd", "n_ff"), optional=True),
    Tensor("blk.{i}.ffn_down.weight", ("n_ff", "n_embd"), optional=True),
)
# the other layers' experts and shared experts (run as the dense FFN stages' fields)
EXPERT_TENSORS = (
    Tensor("blk.{i}.ffn_gate_inp.weight", ("n_embd", "n_expert"), optional=True),
    Tensor("blk.{i}.exp_probs_b.bias", ("n_expert",), optional=True, as_field="ffn_exp_probs_b"),
    Tensor("blk.{i}.ffn_gate_exps.weight", ("n_embd", "n_ff_exp", "n_expert"), optional=True),
    Tensor("blk.{i}.ffn_up_exps.weight", ("n_embd", "n_ff_exp", "n_expert"), optional=True),
    Tensor("blk.{i}.ffn_down_exps.weight", ("n_ff_exp", "n_embd", "n_expert"), optional=True),
    Tensor("blk.{i}.ffn_gate_shexp.weight", ("n_embd", "n_ff_shexp"), True, as_field="ffn_gate"),
    Tensor("blk.{i}.ffn_up_shexp.weight", ("n_embd", "n_ff_shexp"), True, as_field="ffn_up"),
    Tensor("blk.{i}.ffn_down_shexp.weight", ("n_ff_shexp", "n_embd"), True, as_field="ffn_down"),
)
MOE_REQUIRED = ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
SHEXP_NAMES = ("ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp")

# h = rms_norm(x) * attn_norm; the latent attention; x += att . attn_output; then the FFN:
# routed experts kept apart, the shared experts (no gate), both added to x; or a dense FFN
BLOCK = (
    "attn_norm",
    "mla_q",  # kv_a = h . attn_kv_a_mqa; q = rms_norm(h . attn_q_a) * norm . attn_q_b
    "mla_kv",  # rope, the latent's norm, the cache row; q_nope quantized per head
    "mla_absorb",  # q_nope_h . attn_k_b_h: the query heads in the latent
    "mla_attention",  # MQA over the cache rows (V: their latent part)
    "mla_out",  # att_h . attn_v_b_h, then x += att . attn_output
    "out_rows",
    "ffn_norm",
    Branch(
        "moe",
        ("ffn_router", "ffn_moe_keep", "ffn_shexp_gate", "ffn_swiglu", "ffn_shexp_down"),
        ("ffn_swiglu", "ffn_down"),
    ),
)


class Deepseek2Model(MoEDecoder):
    arch = "deepseek2"
    tensors = COMMON_TENSORS + EXPERT_TENSORS + DENSE_TENSORS
    params = (
        *MOE_PARAMS,
        Param("n_lora_q", "attention.q_lora_rank", 0, int, 0),
        Param("n_lora_kv", "attention.kv_lora_rank", kind=int, minimum=1),
        Param("head_k_mla", "attention.key_length_mla", 0, int, 0),
        Param("head_v_mla", "attention.value_length_mla", 0, int, 0),
        Param("n_expert_shared", "expert_shared_count", kind=int, minimum=1),
        Param("n_dense_lead", "leading_dense_block_count", 0, int, 0),
        Param("expert_gating_func", "expert_gating_func", 0, int, 0),
        Param("expert_weights_scale", "expert_weights_scale", 0.0, float),
        Param("n_expert_groups", "expert_group_count", 0, int, 0),
        Param("n_group_used", "expert_group_used_count", 0, int, 0),
        Param("yarn_log_mul", "rope.scaling.yarn_log_multiplier", 0.0, float),
        Param("attn_temp_scale", "attention.temperature_scale", 0.0, float),
    )
    unsupported = ("attn_kv_b.weight", "nextn.eh_proj.weight", "ffn_gate_up_exps.weight")
    block = BLOCK
    rope_neox = False

    @classmethod
    def derived(cls, hp: HParams) -> HParams:
        hp = super().derived(hp)
        x, a = hp.extra, cls.arch
        if not x["head_k_mla"] or not x["head_v_mla"]:
            raise ModelError(
                f"{a}.attention.key_length_mla / value_length_mla are missing: a file without "
                f"the split attn_k_b / attn_v_b (older attn_kv_b form) is not supported"
            )
        if x["attn_temp_scale"] != 0.0:
            raise ModelError(f"{a}.attention.temperature_scale: attention temperature scaling "
                             "is not supported")  # fmt: skip
        gating = x["expert_gating_func"]
        if gating == 0:  # no key: V2/V2.5 files (softmax), GLM-4.7 Lite's (sigmoid), as llama.cpp
            glm_lite = hp.n_layer in (47, 48) and hp.n_vocab == 154880
            gating = SIGMOID if glm_lite else SOFTMAX
        if gating not in (SOFTMAX, SIGMOID):
            raise ModelError(f"{a}.expert_gating_func is {gating}; supported: softmax "
                             f"({SOFTMAX}), sigmoid ({SIGMOID})")  # fmt: skip
        _check_sizes(hp, a)
        extra = {
            "expert_gating_func": gating,
            "qk_nope": x["head_k_mla"] - hp.n_rot,
            "n_q_mla": hp.n_head * x["head_k_mla"],
            "n_o_mla": hp.n_head * x["head_v_mla"],
            "n_kv_a": x["n_lora_kv"] + hp.n_rot,
            "n_ff_shexp": x["n_ff_exp"] * x["n_expert_shared"],
        }
        return hp.with_extra(extra)

    @classmethod
    def check_heads(cls, hp: HParams) -> None:
        """(The latent attention's sizes are checked with the hyper-parameters.)"""
        if hp.n_embd % 16 or hp.n_ff % 16 or hp.n_rot % 2:
            raise ModelError(
                f"unsupported shape: n_embd ({hp.n_embd}) and n_ff ({hp.n_ff}) must be "
                f"multiples of 16, the rope dims ({hp.n_rot}) even"
            )

    @classmethod
    def check(cls, md: Mapping, shapes: Mapping[str, tuple[int, ...]]) -> HParams:
        """The declared tensors, then each layer's: q low-rank (q_a, its norm, q_b) or
        direct as ``q_lora_rank`` says; a dense FFN in the leading layers, experts and
        shared experts after them."""
        hp = super().check(md, shapes)
        wn = md.get(f"{cls.arch}.expert_weights_norm", False)
        if not isinstance(wn, bool | np.bool_):
            raise ModelError(f"metadata key '{cls.arch}.expert_weights_norm' must be a bool")
        x = hp.extra
        lead = x["n_dense_lead"]
        q = ("attn_q_a", "attn_q_a_norm", "attn_q_b") if x["n_lora_q"] else ("attn_q",)
        for il in range(hp.n_layer):
            ffn = ("ffn_gate", "ffn_up", "ffn_down") if il < lead else MOE_REQUIRED + SHEXP_NAMES
            for t in (*q, *ffn):
                name = f"blk.{il}.{t}.weight"
                if name not in shapes:
                    raise ModelError(
                        f"tensor {name!r} is missing (required by {cls.arch}: q_lora_rank = "
                        f"{x['n_lora_q']}, leading_dense_block_count = {lead})"
                    )
        return hp.with_extra({"expert_weights_norm": bool(wn)})

    @classmethod
    def rope_params(
        cls, md: Mapping[str, Any], hp: HParams, ov: RopeOverrides | None
    ) -> RopeParams:
        """llama.cpp's rope, but the YaRN attention factor of deepseek2: with a log
        multiplier, ``mscale == mscale_all_dim`` cancels to 1 before the YaRN correction."""
        rp = rope_params(md, cls.arch, hp.n_rot, hp.n_ctx_train, cls.rope_neox, ov)
        if rp.ext_factor == 0 or hp.extra["yarn_log_mul"] == 0 or (ov and ov.yarn_attn_factor):
            return rp
        f = _F32(1.0) / _F32(rp.freq_scale)
        attn = _F32(1.0) * (_F32(1.0) / (_F32(1.0) + _F32(0.1) * _F32(math.log(f))))
        attn = attn * _F32(md.get(f"{cls.arch}.rope.scaling.attn_factor", 1.0))
        return replace(rp, attn_factor=float(attn))

    def attention_scales(self) -> tuple[float, float]:
        """llama.cpp's ``kq_scale``: the rope's attention factor undone to the file's, times
        DeepSeek's magnitude scale, squared, over the root of the query head size."""
        rp, x = self.rope, self.hparams.extra
        lf = _F32(math.log(_F32(1.0) / _F32(rp.freq_scale)))
        log_mul = _F32(x["yarn_log_mul"]) / _F32(0.1)  # [TAG_DEEPSEEK2_YARN_LOG_MUL_FIX]
        org = _F32(rp.attn_factor) * (_F32(1.0) + _F32(0.1) * lf)
        mscale = org * (_F32(1.0) + _F32(0.1) * log_mul * lf)
        kq = _F32(1.0) * mscale * mscale / _F32(np.sqrt(_F32(x["head_k_mla"])))
        return float(kq), 1.0

    @property  # type: ignore[override]
    def expert_weights_norm(self) -> bool:  # the file's (default false)
        return bool(self.hparams.extra["expert_weights_norm"])

    @property  # type: ignore[override]
    def expert_weights_scale(self) -> float:  # the file's (0: none)
        return float(self.hparams.extra["expert_weights_scale"])

    @property  # type: ignore[override]
    def expert_gating(self) -> int:
        if self.hparams.extra["expert_gating_func"] == SIGMOID:
            return stages.GATING_SIGMOID
        return stages.GATING_SOFTMAX

    # the cache row's V is its K (the engine stores no V rows); K-shift ropes the rope key
    kv_v_is_k = True

    @property
    def kv_rope_offset(self) -> int:
        return int(self.hparams.extra["n_lora_kv"])

    def _pack(self) -> None:
        super()._pack()
        lt = self.layer_table
        for il in range(self.hparams.n_layer):
            if lt[il]["moe"]:
                lt[il]["n_ff"] = self.hparams.extra["n_ff_shexp"]


def _check_sizes(hp: HParams, a: str) -> None:
    """The sizes the absorbed attention and the router need, named by their keys."""
    x = hp.extra
    r, hk, hv, d = x["n_lora_kv"], x["head_k_mla"], x["head_v_mla"], hp.n_embd_head_k
    if hp.n_head_kv != 1:
        raise ModelError(f"{a}.attention.head_count_kv is {hp.n_head_kv}; the absorbed latent "
                         "attention has one KV head (1)")  # fmt: skip
    if d != r + hp.n_rot or hp.n_embd_head_v != r:
        raise ModelError(
            f"{a}.attention.key_length ({d}) / value_length ({hp.n_embd_head_v}) must be "
            f"kv_lora_rank + rope dims ({r} + {hp.n_rot}) / kv_lora_rank"
        )
    if not hp.n_rot < hk <= d or hv > d or hv % 16 or (hk - hp.n_rot) % 16 or r % 16:
        raise ModelError(
            f"unsupported shape: {a}.attention.key_length_mla ({hk}) must exceed the rope "
            f"dims ({hp.n_rot}), it and value_length_mla ({hv}) be at most key_length ({d}); "
            "nope dims, value_length_mla and kv_lora_rank multiples of 16"
        )
    if x["n_lora_q"] % 16:
        raise ModelError(f"unsupported shape: {a}.attention.q_lora_rank ({x['n_lora_q']}) must "
                         "be a multiple of 16")  # fmt: skip
    ng, nu, ne = x["n_expert_groups"], x["n_group_used"], x["n_expert"]
    if ng > 1 and (ne % ng or not 0 < nu < ng or ne // ng < 2):
        raise ModelError(
            f"{a}.expert_group_count ({ng}) must divide expert_count ({ne}) into groups of 2 "
            f"or more, and expert_group_used_count ({nu}) be in 1..{ng - 1}"
        )
    if x["n_dense_lead"] > hp.n_layer:
        raise ModelError(f"{a}.leading_dense_block_count ({x['n_dense_lead']}) is more than "
                         f"the {hp.n_layer} layers")  # fmt: skip


MODEL = Deepseek2Model
