"""The ``gemma4`` architecture (Gemma 4 text models), as llama.cpp runs it.

A gemma3 block with, in this order: ``h = rms_norm(x) * attn_norm``; q/k/v; per-head RMSNorm
of q and k with their weights (``attn_q_norm``, ``attn_k_norm``) and of v without one
(``v_norm``); NeoX rope; attention with a K.Q scale of 1 and no query scale
(``f_attention_scale = 1``); ``x += rms_norm(attn_output(...)) * post_attention_norm``; ``x
+= rms_norm(ffn_down(gelu(ffn_gate(h)) * ffn_up(h))) * post_ffw_norm`` with ``h =
rms_norm(x) * ffn_norm``; then the layer's output times ``layer_output_scale`` (one float,
when the file has it). Token embeddings are scaled by ``sqrt(n_embd)``; logits are
soft-capped when the file sets ``final_logit_softcapping``. The last layer runs on every
token (llama.cpp keeps the rows until the output norm).

Mixture of experts (26B-A4B): a layer with a router ``ffn_gate_inp`` runs its dense GEGLU
FFN and ``expert_count`` GEGLU experts side by side on the attention's output ``x``: the
router reads ``rms_norm(x) / sqrt(n_embd) * ffn_gate_inp.scale`` (no norm weight), softmax,
the ``expert_used_count`` most probable experts, their weights divided by their sum; the
experts read ``rms_norm(x) * pre_ffw_norm_2``, each output times its ``ffn_down_exps.scale``
(when the file has it); then ``x += rms_norm(rms_norm(mlp) * post_ffw_norm_1 + rms_norm(moe)
* post_ffw_norm_2) * post_ffw_norm``.

Sliding-window attention: ``attention.sliding_window_pattern`` lists per layer whether it is
local (a boolean array, required, as ``attention.sliding_window``). Local layers use their
own rope base (``rope.freq_base_swa``, default 10000, frequency scale 1 whatever the context
says) and no frequency factors; global layers rope with ``rope_freqs`` (the "proportional"
rope of the converter: factors 1 for the rotated pairs, 1e30 for the others).

Not supported (refused by key or tensor): head sizes of the local layers other than the
global ones (``attention.key_length_swa``, ``rope.dimension_count_swa``), layers reading the
KV of earlier ones (``attention.shared_kv_layers``), per-layer embeddings
(``embedding_length_per_layer_input``), values read from the keys (no ``attn_v``) and
per-layer FFN sizes. The experts' gate and up may come fused (``ffn_gate_up_exps``, each
expert's rows gate | up: split at load time), as the converter writes them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from ..errors import ModelError
from ..hparams import HParams
from ..ops.rope import RopeParams
from . import stages
from .decoder import LLAMA_TENSORS, QK_NORM_TENSORS, Decoder
from .moe import EXPERT_TENSORS
from .spec import Branch, Fused, Param, Tensor

# a layer of experts: the tensors it needs beside the dense FFN's
MOE_TENSORS = (
    *(replace(t, optional=True) for t in EXPERT_TENSORS),
    Tensor("blk.{i}.ffn_gate_inp.scale", ("n_embd",), True, as_field="ffn_gate_inp_scale"),
    Tensor("blk.{i}.pre_ffw_norm_2.weight", ("n_embd",), True),
    Tensor("blk.{i}.post_ffw_norm_1.weight", ("n_embd",), True),
    Tensor("blk.{i}.post_ffw_norm_2.weight", ("n_embd",), True),
)
MOE_FFN = (
    "ffn_router_in",  # h = rms_norm(x) / sqrt(n_embd) * ffn_gate_inp.scale
    "ffn_router",  # softmax(h . ffn_gate_inp), top experts, weights / their sum
    "ffn_pre_norm_2",  # h = rms_norm(x) * pre_ffw_norm_2
    "ffn_moe_keep",  # moe = sum_j w_j * (gelu(h . gate_e) * (h . up_e)) . down_e * scale_e
    "ffn_norm",
    "ffn_geglu",
    "ffn_down_post_norms",  # x += rms_norm(rms_norm(mlp) * post_1 + rms_norm(moe) * post_2) * post
)


class Gemma4Model(Decoder):
    arch = "gemma4"
    tensors = (
        LLAMA_TENSORS
        + QK_NORM_TENSORS
        + (
            Fused("blk.{i}.attn_qkv.weight", ("attn_q", "attn_k", "attn_v")),
            Tensor("blk.{i}.post_attention_norm.weight", ("n_embd",)),
            Tensor("blk.{i}.post_ffw_norm.weight", ("n_embd",)),
            Tensor("blk.{i}.layer_output_scale.weight", (1,), optional=True),
            *MOE_TENSORS,
            Fused("blk.{i}.ffn_gate_up_exps.weight", ("ffn_gate_exps", "ffn_up_exps")),
            Tensor(
                "blk.{i}.ffn_down_exps.scale", ("n_expert",), True, as_field="ffn_down_exps_scale"
            ),
        )
    )
    params = (
        Param("n_swa", "attention.sliding_window", kind=int, minimum=1),
        Param("head_k_swa", "attention.key_length_swa", kind=int, minimum=1),
        Param("head_v_swa", "attention.value_length_swa", kind=int, minimum=1),
        Param("n_rot_swa", "rope.dimension_count_swa", 0, int, 0),
        Param("n_kv_shared", "attention.shared_kv_layers", 0, int, 0),
        Param("n_embd_per_layer", "embedding_length_per_layer_input", kind=int, minimum=0),
        Param("freq_base_swa", "rope.freq_base_swa", 10000.0, float, 0.0),
        Param("final_logit_softcapping", "final_logit_softcapping", 0.0, float, 0.0),
        Param("n_expert", "expert_count", 0, int, 0),
        Param("n_expert_used", "expert_used_count", 0, int, 0),
        Param("n_ff_exp", "expert_feed_forward_length", 0, int, 0),
    )
    unsupported = ("per_layer_token_embd.weight",)
    block = (
        "attn_norm",
        "qkv",
        "qk_norm",
        "v_norm",  # v_h = rms_norm(v_h), no weight
        "rope",
        "kv_store",
        "attention",  # K.Q scale 1
        "out_proj_post_norm",  # x += rms_norm(att . attn_output) * post_attention_norm
        Branch(
            "moe",  # a layer with a router: the dense FFN and the experts side by side
            MOE_FFN,
            (
                "ffn_norm",
                "ffn_geglu",  # g = gelu(h . ffn_gate) * (h . ffn_up)
                "ffn_down_post_norm",  # x += rms_norm(g . ffn_down) * post_ffw_norm
            ),
        ),
        "layer_scale",  # x *= layer_output_scale
    )
    rope_neox = True
    expert_weights_norm = True  # llama.cpp's norm_w
    expert_act = stages.ACT_GEGLU

    @classmethod
    def derived(cls, hp: HParams) -> HParams:
        """The window is the file's; the parts llama.cpp reads that this engine does not run
        are refused by key."""
        x, a = hp.extra, cls.arch
        if (x["head_k_swa"], x["head_v_swa"]) != (hp.n_embd_head_k, hp.n_embd_head_v):
            raise ModelError(
                f"'{a}.attention.key_length_swa' / value_length_swa ({x['head_k_swa']}, "
                f"{x['head_v_swa']}) differ from the global layers' head size "
                f"({hp.n_embd_head_k}, {hp.n_embd_head_v}): not supported yet"
            )
        if x["n_rot_swa"] not in (0, hp.n_rot):
            raise ModelError(
                f"'{a}.rope.dimension_count_swa' ({x['n_rot_swa']}) differs from "
                f"rope.dimension_count ({hp.n_rot}): not supported yet"
            )
        if x["n_kv_shared"]:
            raise ModelError(
                f"'{a}.attention.shared_kv_layers' is {x['n_kv_shared']}: layers reusing "
                "earlier layers' KV are not supported yet"
            )
        if x["n_embd_per_layer"]:
            raise ModelError(
                f"'{a}.embedding_length_per_layer_input' is {x['n_embd_per_layer']}: "
                "per-layer embeddings are not supported yet"
            )
        if x["n_expert"] and not 0 < x["n_expert_used"] <= x["n_expert"]:
            raise ModelError(
                f"'{a}.expert_used_count' ({x['n_expert_used']}) must be in 1..expert_count "
                f"({x['n_expert']})"
            )
        if x["n_expert"] and (x["n_ff_exp"] <= 0 or x["n_ff_exp"] % 16):
            raise ModelError(
                f"unsupported shape: the experts' FFN size ({x['n_ff_exp']}, key "
                f"'{a}.expert_feed_forward_length') must be a positive multiple of 16"
            )
        return replace(hp, n_swa=x["n_swa"])

    @classmethod
    def check(cls, md: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]]) -> HParams:
        """As every decoder, and: the pattern lists every layer; a file with global layers
        has their ``rope_freqs`` (llama.cpp requires it)."""
        hp = super().check(md, shapes)
        swa = swa_layers(md, cls.arch, hp.n_layer)
        if not all(swa) and "rope_freqs.weight" not in shapes:
            raise ModelError("tensor 'rope_freqs.weight' is missing (required by gemma4)")
        for i in range(hp.n_layer):
            if f"blk.{i}.ffn_gate_inp.weight" not in shapes:
                continue
            if not hp.extra["n_expert"]:
                raise ModelError(f"'blk.{i}.ffn_gate_inp.weight' needs '{cls.arch}.expert_count'")
            fused = f"blk.{i}.ffn_gate_up_exps.weight" in shapes
            for t in MOE_TENSORS:  # (ffn_down_exps.scale may be absent)
                if fused and t.field in ("ffn_gate_exps", "ffn_up_exps"):
                    continue
                if t.name.format(i=i) not in shapes:
                    raise ModelError(
                        f"tensor {t.name.format(i=i)!r} is missing (required by a gemma4 "
                        "layer with experts)"
                    )
        return hp

    def embd_scale(self) -> float:
        return float(np.sqrt(np.float32(self.hparams.n_embd)))

    def logit_softcap(self) -> float:
        return self.hparams.extra["final_logit_softcapping"]

    def attention_scales(self) -> tuple[float, float]:
        """Neither the scores nor the queries are scaled (llama.cpp's f_attention_scale 1)."""
        return 1.0, 1.0

    def swa_layers(self, md: Mapping[str, Any]) -> tuple[bool, ...]:
        return swa_layers(md, self.arch, self.hparams.n_layer)

    def rope_swa_params(self, md: Mapping[str, Any], rope: RopeParams) -> RopeParams:
        """Local layers: the file's SWA base, frequency scale 1, no frequency factors."""
        return replace(
            rope, freq_base=self.hparams.extra["freq_base_swa"], freq_scale=1.0, factors=False
        )


def swa_layers(md: Mapping[str, Any], arch: str, n_layer: int) -> tuple[bool, ...]:
    """The required per-layer list ``attention.sliding_window_pattern``."""
    key = f"{arch}.attention.sliding_window_pattern"
    pat = md.get(key)
    if not isinstance(pat, list | tuple | np.ndarray):
        raise ModelError(f"metadata key {key!r} must list every layer (booleans), not {pat!r}")
    if len(pat) != n_layer:
        raise ModelError(f"{key} lists {len(pat)} layers, the model has {n_layer}")
    return tuple(bool(x) for x in pat)


MODEL = Gemma4Model
