"""The ``gemma2`` architecture (Gemma 2), as llama.cpp runs it.

A llama block with, in this order: ``h = rms_norm(x) * attn_norm``; q/k/v; NeoX rope; queries
scaled by ``1/sqrt(attention.key_length)`` (``1/sqrt(n_embd/n_head)`` for the 27B model, 46
layers); attention whose scores are soft-capped, ``c * tanh(q.k / c)`` with ``c =
attn_logit_softcapping`` (default 50), the K.Q scale itself 1; ``x += rms_norm(attn_output(
...)) * post_attention_norm``; then ``x += rms_norm(ffn_down(gelu(ffn_gate(h)) * ffn_up(h)))
* post_ffw_norm`` with ``h = rms_norm(x) * ffn_norm``. Token embeddings are scaled by
``sqrt(n_embd)``; the output matrix is ``token_embd``; logits are soft-capped by
``final_logit_softcapping`` (default 30).

Sliding-window attention: every layer ``il`` with ``il % pattern < pattern - 1`` is local
(``attention.sliding_window_pattern``, default 2: even layers local, odd global; or a
boolean array), with a window of ``attention.sliding_window`` (default 4096). Local layers
rope with ``rope.freq_base_swa`` (default the file's ``rope.freq_base``) and the file's
frequency scale, whatever the context overrides.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from ..hparams import HParams
from ..ops.rope import RopeParams
from .decoder import LLAMA_TENSORS, Decoder
from .gemma3 import swa_layers
from .spec import Param, Tensor

DEFAULT_SWA = 4096  # llama.cpp's window when the file gives none
DEFAULT_SWA_PATTERN = 2
LAYERS_27B = 46  # gemma_pytorch scales the 27B model's queries by 1/sqrt(n_embd / n_head)


class Gemma2Model(Decoder):
    arch = "gemma2"
    tensors = (
        *(t for t in LLAMA_TENSORS if t.name != "output.weight"),  # the output: token_embd
        Tensor("blk.{i}.post_attention_norm.weight", ("n_embd",)),
        Tensor("blk.{i}.post_ffw_norm.weight", ("n_embd",)),
    )
    params = (
        Param("n_swa", "attention.sliding_window", DEFAULT_SWA, int, 1),
        Param("freq_base_swa", "rope.freq_base_swa", 0.0, float, 0.0),
        Param("attn_logit_softcapping", "attn_logit_softcapping", 50.0, float, 0.0),
        Param("final_logit_softcapping", "final_logit_softcapping", 30.0, float, 0.0),
    )
    unsupported = ("attn_q_norm.weight", "attn_k_norm.weight", "attn_qkv.weight")
    block = (
        "attn_norm",
        "qkv",
        "rope",
        "scale_q",  # q *= 1/sqrt(attention.key_length)
        "kv_store",
        "attention",  # scores soft-capped (attn_softcap)
        "out_proj_post_norm",  # x += rms_norm(att . attn_output) * post_attention_norm
        "out_rows",
        "ffn_norm",
        "ffn_geglu",  # g = gelu(h . ffn_gate) * (h . ffn_up)
        "ffn_down_post_norm",  # x += rms_norm(g . ffn_down) * post_ffw_norm
    )
    rope_neox = True

    @classmethod
    def derived(cls, hp: HParams) -> HParams:
        """The window is 4096 when the file does not give one."""
        return replace(hp, n_swa=hp.extra["n_swa"])

    def embd_scale(self) -> float:
        return float(np.sqrt(np.float32(self.hparams.n_embd)))

    def logit_softcap(self) -> float:
        return self.hparams.extra["final_logit_softcapping"]

    def attn_logit_softcap(self) -> float:
        return self.hparams.extra["attn_logit_softcapping"]

    def attention_scales(self) -> tuple[float, float]:
        """Queries are scaled after rope (``f_attention_scale``), the scores are not."""
        hp = self.hparams
        d = hp.n_embd // hp.n_head if hp.n_layer == LAYERS_27B else hp.n_embd_head_k
        return 1.0, float(np.float32(1.0) / np.sqrt(np.float32(d)))

    def swa_layers(self, md: Mapping[str, Any]) -> tuple[bool, ...]:
        return swa_layers(md, self.arch, self.hparams.n_layer, DEFAULT_SWA_PATTERN, always=True)

    def rope_swa_params(self, md: Mapping[str, Any], rope: RopeParams) -> RopeParams:
        """llama.cpp: local layers keep the file's base (or the SWA one) and frequency scale,
        whatever the context says."""
        hp = self.hparams
        base = hp.extra["freq_base_swa"] or hp.rope_freq_base
        return replace(rope, freq_base=base, freq_scale=hp.rope_freq_scale)


MODEL = Gemma2Model
