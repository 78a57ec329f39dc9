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

Local and global layers have head sizes of their own (``attention.key_length_swa`` /
``value_length_swa`` against ``key_length`` / ``value_length``, each pair equal as llama.cpp
requires), rope dimensions (``rope.dimension_count_swa``, default the global layers'), and
``attention.head_count_kv`` may be given per layer (one count per kind): each layer runs with
its own row of the model table, and the cache's global and sliding-window parts have their
own heads and rows. A layer without ``attn_v`` reads its values from its keys (``v = h .
attn_k`` before the key norm and rope, then the value norm), as the 31B's global layers.

Shared KV (``attention.shared_kv_layers`` = n): the last n layers have no keys or values of
their own and attend the cache of the last local (local layers) or global (global layers)
layer before them (llama.cpp's reuse); they have no cache rows.

Per-layer embeddings (``embedding_length_per_layer_input`` = p > 0, E2B / E4B): in the first
layer each token gets inputs for every layer, ``(rms_norm(x . per_layer_model_proj /
sqrt(n_embd)) * per_layer_proj_norm + per_layer_token_embd[token] * sqrt(p)) / sqrt(2)``
(``x`` the scaled token embedding, the norm over each layer's p values); after its FFN each
layer adds ``rms_norm((gelu(x . inp_gate) * its inputs) . proj) * post_norm``, before the
layer output scale. ``per_layer_token_embd`` is repacked in memory like every matrix
(llama.cpp reads its rows from the file as needed). ``feed_forward_length`` may be given per
layer (E2B's shared layers' FFNs twice as wide).

The experts' gate and up may come fused (``ffn_gate_up_exps``, each expert's rows gate | up:
split at load time), as the converter writes them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from ..errors import ModelError
from ..hparams import HParams
from ..ops.matmul import act_need
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


# tensors a layer reading an earlier layer's KV may lack (values may be read from the keys)
KV_TENSORS = ("attn_k", "attn_v", "attn_k_norm")
# per-layer embeddings: the global tensors, then each layer's
PLE_TENSORS = (
    Tensor("per_layer_token_embd.weight", ("n_ple", "n_vocab"), True),
    Tensor("per_layer_model_proj.weight", ("n_embd", "n_ple"), True),
    Tensor("per_layer_proj_norm.weight", ("n_embd_per_layer",), True),
    Tensor("blk.{i}.inp_gate.weight", ("n_embd", "n_embd_per_layer"), True),
    Tensor("blk.{i}.proj.weight", ("n_embd_per_layer", "n_embd"), True),
    Tensor("blk.{i}.post_norm.weight", ("n_embd",), True),
)


class Gemma4Model(Decoder):
    arch = "gemma4"
    tensors = (
        *(
            replace(t, optional=True) if t.field in KV_TENSORS else t
            for t in LLAMA_TENSORS + QK_NORM_TENSORS
        ),
        *(
            Fused("blk.{i}.attn_qkv.weight", ("attn_q", "attn_k", "attn_v")),
            Tensor("blk.{i}.post_attention_norm.weight", ("n_embd",)),
            Tensor("blk.{i}.post_ffw_norm.weight", ("n_embd",)),
            Tensor("blk.{i}.layer_output_scale.weight", (1,), optional=True),
            *MOE_TENSORS,
            Fused("blk.{i}.ffn_gate_up_exps.weight", ("ffn_gate_exps", "ffn_up_exps")),
            Tensor(
                "blk.{i}.ffn_down_exps.scale", ("n_expert",), True, as_field="ffn_down_exps_scale"
            ),
            *PLE_TENSORS,
        ),
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
    block = (
        "ple_inputs",  # first layer: every layer's per-layer inputs (with per-layer embeddings)
        "attn_norm",
        "qkv",  # (a layer reading an earlier layer's KV: q only)
        "v_norm",  # v_h = rms_norm(v_h), no weight (no attn_v: v = k before its norm, rope)
        "qk_norm",
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
        "ple_residual",  # x += rms_norm((gelu(x . inp_gate) * inputs) . proj) * post_norm
        "layer_scale",  # x *= layer_output_scale
    )
    rope_neox = True
    partial_rope = True  # (the local layers may rotate part of their heads)
    per_layer_kv_heads = varying_kv_heads = per_layer_ff = True
    expert_weights_norm = True  # llama.cpp's norm_w
    expert_act = stages.ACT_GEGLU

    @classmethod
    def derived(cls, hp: HParams) -> HParams:
        """The window is the file's; sizes this engine's kernels do not run are refused by
        key."""
        x, a = hp.extra, cls.arch
        if hp.n_embd_head_k != hp.n_embd_head_v or x["head_k_swa"] != x["head_v_swa"]:
            raise ModelError(
                f"'{a}.attention.key_length' / value_length ({hp.n_embd_head_k}, "
                f"{hp.n_embd_head_v}) and key_length_swa / value_length_swa ({x['head_k_swa']}, "
                f"{x['head_v_swa']}) must be pairwise equal (as llama.cpp requires)"
            )
        n_rot_swa = x["n_rot_swa"] or hp.n_rot  # (llama.cpp: the global layers' by default)
        if n_rot_swa > x["head_k_swa"] or n_rot_swa % 2:
            raise ModelError(
                f"'{a}.rope.dimension_count_swa' ({n_rot_swa}) must be even and at most the "
                f"local layers' head size ({x['head_k_swa']}, key '{a}.attention.key_length_swa')"
            )
        npl = x["n_embd_per_layer"]
        if npl % 16:
            raise ModelError(
                f"unsupported shape: '{a}.embedding_length_per_layer_input' ({npl}) must be a "
                "multiple of 16"
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
        extra = {"n_rot_swa": n_rot_swa, "n_ple": npl * hp.n_layer}
        return replace(hp, n_swa=x["n_swa"]).with_extra(extra)

    @classmethod
    def with_layers(cls, md: Mapping[str, Any], hp: HParams) -> HParams:
        """Which layers are local (the required pattern); their KV heads (per kind), and the
        layers that read an earlier layer's KV (``attention.shared_kv_layers``: the last ones,
        each reading the last local or global layer before them, as llama.cpp)."""
        a, n = cls.arch, hp.n_layer
        swa = swa_layers(md, a, n)
        kv = hp.extra.get("kv_heads_per_layer")
        for local in (False, True):
            heads = {kv[il] for il in range(n) if swa[il] == local} if kv else set()
            if 0 in heads or len(heads) > 1 or any(hp.n_head % h for h in heads if h):
                raise ModelError(
                    f"'{a}.attention.head_count_kv' gives the {'local' if local else 'global'} "
                    f"layers {sorted(heads)} KV heads: one count per kind, dividing "
                    f"attention.head_count ({hp.n_head}), is supported"
                )
        shared = hp.extra["n_kv_shared"]
        first = n - shared  # the first layer reading an earlier one's KV
        if shared and first < 2:
            raise ModelError(
                f"'{a}.attention.shared_kv_layers' ({shared}) leaves {first} of {n} layers with "
                "KV of their own; llama.cpp needs at least 2"
            )
        for il in range(first, n) if shared else ():
            src = first - (2 if swa[il] else 1)
            if swa[src] != swa[il]:
                raise ModelError(
                    f"'{a}.attention.shared_kv_layers' ({shared}): layer {il} would read the KV "
                    f"of layer {src}, which is not of its kind (key "
                    f"'{a}.attention.sliding_window_pattern')"
                )
        return hp.with_extra({"swa_layers": swa})

    @classmethod
    def layer_hparams(cls, hp: HParams, il: int) -> HParams:
        """A local layer's head size and rope dimensions are the ``_swa`` keys'; KV heads and
        FFN size the per-layer arrays' when the file gives them."""
        x = hp.extra
        kv, ff = x.get("kv_heads_per_layer"), x.get("ff_per_layer")
        local = x["swa_layers"][il]
        return replace(
            hp,
            n_head_kv=kv[il] if kv else hp.n_head_kv,
            n_embd_head_k=x["head_k_swa"] if local else hp.n_embd_head_k,
            n_embd_head_v=x["head_v_swa"] if local else hp.n_embd_head_v,
            n_rot=x["n_rot_swa"] if local else hp.n_rot,
            n_ff=ff[il] if ff else hp.n_ff,
        )

    @classmethod
    def check(cls, md: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]]) -> HParams:
        """As every decoder, and: a file with global layers has their ``rope_freqs``
        (llama.cpp requires it); a layer with KV of its own has its keys; a file with
        per-layer embeddings has their tensors; a layer with experts has theirs."""
        hp = super().check(md, shapes)
        if not all(hp.extra["swa_layers"]) and "rope_freqs.weight" not in shapes:
            raise ModelError("tensor 'rope_freqs.weight' is missing (required by gemma4)")
        first_shared = hp.n_layer - hp.extra["n_kv_shared"]
        ple = hp.extra["n_embd_per_layer"] > 0
        need = [t.name for t in PLE_TENSORS if not t.per_layer] if ple else []
        for i in range(hp.n_layer):
            if i < first_shared and f"blk.{i}.attn_qkv.weight" not in shapes:
                need += [f"blk.{i}.attn_k.weight"]
            need += [f"blk.{i}.attn_k_norm.weight"] if i < first_shared else []
            need += [t.name.format(i=i) for t in PLE_TENSORS if t.per_layer] if ple else []
        for name in need:
            if name not in shapes:
                raise ModelError(f"tensor {name!r} is missing (required by this gemma4 file)")
        for i in range(hp.n_layer):
            _check_experts(cls.arch, hp, shapes, i)
        return hp

    def kv_source(self, il: int) -> int:
        """The last ``attention.shared_kv_layers`` layers attend the KV of the last local
        (local ones) or global (global ones) layer before them."""
        n, shared = self.hparams.n_layer, self.hparams.extra["n_kv_shared"]
        first = n - shared
        if il < first:
            return il
        return first - (2 if self.hparams.extra["swa_layers"][il] else 1)

    def model_extra(self) -> tuple:
        g = self.glob
        if not self.hparams.extra["n_embd_per_layer"]:
            return super().model_extra()
        proj = g["per_layer_model_proj"]
        return (
            self.hparams.extra["n_embd_per_layer"], g["per_layer_token_embd"].index,
            proj.index, g["per_layer_proj_norm"].offset, act_need([proj.type]),
        )  # fmt: skip

    def embd_scale(self) -> float:
        return float(np.sqrt(np.float32(self.hparams.n_embd)))

    def logit_softcap(self) -> float:
        return self.hparams.extra["final_logit_softcapping"]

    def attention_scales(self) -> tuple[float, float]:
        """Neither the scores nor the queries are scaled (llama.cpp's f_attention_scale 1)."""
        return 1.0, 1.0

    def swa_layers(self, md: Mapping[str, Any]) -> tuple[bool, ...]:
        return self.hparams.extra["swa_layers"]

    def rope_swa_params(self, md: Mapping[str, Any], rope: RopeParams) -> RopeParams:
        """Local layers: their rope dimensions, the file's SWA base, frequency scale 1, no
        frequency factors."""
        x = self.hparams.extra
        return replace(
            rope, n_rot=x["n_rot_swa"], freq_base=x["freq_base_swa"], freq_scale=1.0,
            factors=False,
        )  # fmt: skip


def _check_experts(arch: str, hp: HParams, shapes: Mapping[str, tuple[int, ...]], i: int) -> None:
    """A layer with a router has the tensors of its experts (``ffn_down_exps.scale`` may be
    absent; gate and up may come fused)."""
    if f"blk.{i}.ffn_gate_inp.weight" not in shapes:
        return
    if not hp.extra["n_expert"]:
        raise ModelError(f"'blk.{i}.ffn_gate_inp.weight' needs '{arch}.expert_count'")
    fused = f"blk.{i}.ffn_gate_up_exps.weight" in shapes
    for t in MOE_TENSORS:
        if fused and t.field in ("ffn_gate_exps", "ffn_up_exps"):
            continue
        if t.name.format(i=i) not in shapes:
            raise ModelError(
                f"tensor {t.name.format(i=i)!r} is missing (required by a gemma4 layer with "
                "experts)"
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
