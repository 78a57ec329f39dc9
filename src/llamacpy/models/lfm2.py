"""The ``lfm2`` architecture (Liquid AI's LFM2 / LFM2.5 dense models), as llama.cpp runs it:
a hybrid of short gated convolutions and grouped-query attention.

A layer whose ``attention.head_count_kv`` entry is 0 is a convolution layer, with a state
per sequence (the engine's hybrid memory: a row of ``shortconv.l_cache - 1`` past inputs
per channel); the others attend over the KV cache. Each block is

* ``h = rms_norm(x) * attn_norm``;
* a convolution layer: ``b | c | x = h . shortconv.in_proj``; ``y = c * conv(b * x)``, the
  causal convolution of ``shortconv.l_cache`` taps over each channel's past inputs;
  ``x += y . shortconv.out_proj``;
* or attention: q, k, v; Q/K RMS norms per head; neox rope; ``x += att . attn_output``;
* ``x += ffn_down(silu(ffn_gate(h)) * ffn_up(h))`` with ``h = rms_norm(x) * ffn_norm``.

The output norm is stored as ``token_embd_norm`` (the name llama.cpp reads it from). The
numpy specification is :mod:`.reference`'s stages.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from ..errors import ModelError
from ..hparams import HParams
from .decoder import LLAMA_TENSORS, QK_NORM_TENSORS, Decoder
from .spec import Branch, Param, Tensor

_CONV = "blk.{i}.shortconv."
CONV_TENSORS = (
    Tensor(_CONV + "conv.weight", ("ssm_d_conv", "n_embd"), True, flat=True, as_field="ssm_conv1d"),
    Tensor(_CONV + "in_proj.weight", ("n_embd", "n_embd*3"), True, as_field="attn_qkv"),
    Tensor(_CONV + "out_proj.weight", ("n_embd", "n_embd"), True, as_field="ssm_out"),
)
_LLAMA = {t.field: t for t in LLAMA_TENSORS if isinstance(t, Tensor)}
ATTENTION_TENSORS = tuple(
    replace(t, optional=True)
    for t in (*(_LLAMA[f] for f in ("attn_q", "attn_k", "attn_v", "attn_output")),
              *QK_NORM_TENSORS)
)  # fmt: skip
COMMON_TENSORS = (
    _LLAMA["token_embd"],
    Tensor("token_embd_norm.weight", ("n_embd",), as_field="output_norm"),
    *(_LLAMA[f] for f in ("output", "attn_norm", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")),
)


class Lfm2Model(Decoder):
    arch = "lfm2"
    tensors = COMMON_TENSORS + CONV_TENSORS + ATTENTION_TENSORS
    params = (Param("ssm_d_conv", "shortconv.l_cache", kind=int, minimum=2),)
    unsupported = ("ffn_gate_inp.weight", "attn_qkv.weight", "dense_2_out.weight")
    per_layer_kv_heads = True
    block = (
        "attn_norm",  # h = rms_norm(x) * attn_norm
        Branch(
            "recurrent",
            (
                "shortconv_in",  # b | c | x = h . shortconv.in_proj
                "shortconv_conv",  # y = c * conv(b * x) over the state row
                "shortconv_out",  # x += y . shortconv.out_proj
            ),
            (
                "qkv",
                "qk_norm",
                "rope",
                "kv_store",
                "attention",
                "out_proj",  # x += att . attn_output
            ),
        ),
        "out_rows",
        "ffn_norm",
        "ffn_swiglu",
        "ffn_down",
    )
    rope_neox = True

    @classmethod
    def derived(cls, hp: HParams) -> HParams:
        hp = super().derived(hp)
        if hp.n_swa:
            raise ModelError(
                f"{cls.arch} with sliding-window attention (key {cls.arch}."
                "attention.sliding_window) is not supported yet"
            )
        return hp.with_extra({"q_width": 3 * hp.n_embd})

    @classmethod
    def check(cls, md: Mapping, shapes: Mapping[str, tuple[int, ...]]) -> HParams:
        """The declarations' checks, then each layer's own tensors by its kind."""
        hp = super().check(md, shapes)
        if md.get(f"{cls.arch}.attention.causal", True) is False:
            raise ModelError(f"non-causal {cls.arch} (embedding) models are not supported yet")
        for il in range(hp.n_layer):
            conv = cls._is_conv(hp, il)
            for t in CONV_TENSORS if conv else ATTENTION_TENSORS:
                name = t.name.format(i=il)
                if name not in shapes:
                    what = "a convolution" if conv else "an attention"
                    raise ModelError(
                        f"tensor {name!r} is missing (layer {il} is {what} layer of {cls.arch})"
                    )
        return hp

    @staticmethod
    def _is_conv(hp: HParams, il: int) -> bool:
        per_layer = hp.extra.get("kv_heads_per_layer")
        return per_layer is not None and per_layer[il] == 0

    def layer_recurrent(self, il: int) -> bool:
        return self._is_conv(self.hparams, il)

    def state_sizes(self) -> tuple[int, int]:
        """Floats of a layer's convolution row (per sequence), and of its other row: none."""
        return (self.hparams.extra["ssm_d_conv"] - 1) * self.hparams.n_embd, 0


MODEL = Lfm2Model
