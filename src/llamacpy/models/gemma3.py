"""The ``gemma3`` architecture (Gemma 3 text models), as llama.cpp runs it.

A llama block with, in this order: ``h = rms_norm(x) * attn_norm``; q/k/v; per-head RMSNorm
of q and k (``attn_q_norm``, ``attn_k_norm``); NeoX rope; queries scaled by
``1/sqrt(attention.key_length)`` (``1/sqrt(n_embd/n_head)`` for the 27B model); attention;
``x += rms_norm(attn_output(...)) * post_attention_norm``; then ``x += rms_norm(ffn_down(
gelu(ffn_gate(h)) * ffn_up(h))) * post_ffw_norm`` with ``h = rms_norm(x) * ffn_norm``. Token
embeddings are scaled by ``sqrt(n_embd)``; logits are soft-capped when the file sets
``final_logit_softcapping``.

Sliding-window attention: when ``gemma3.attention.sliding_window`` (``n_swa``) is set, layer
``il`` is local unless ``il % pattern == pattern - 1`` (``attention.sliding_window_pattern``,
default 6: five local layers, then one global), or as listed by a boolean array under that
key. Local layers see only the ``n_swa`` latest positions (the engine builds a second,
windowed mask over the same KV cache) and use their own rope base
(``rope.freq_base_swa``, default 10000, not changed by context rope overrides).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from ..errors import ModelError
from ..ops.rope import RopeParams
from .decoder import LLAMA_TENSORS, QK_NORM_TENSORS, Decoder
from .spec import Param, Tensor

DEFAULT_SWA_PATTERN = 6


class Gemma3Model(Decoder):
    arch = "gemma3"
    tensors = (
        LLAMA_TENSORS
        + QK_NORM_TENSORS
        + (
            Tensor("blk.{i}.post_attention_norm.weight", ("n_embd",)),
            Tensor("blk.{i}.post_ffw_norm.weight", ("n_embd",)),
        )
    )
    params = (
        Param("freq_base_swa", "rope.freq_base_swa", 10000.0, float, 0.0),
        Param("final_logit_softcapping", "final_logit_softcapping", 0.0, float, 0.0),
    )
    unsupported = ("dense_2.weight", "dense_3.weight")  # embeddinggemma heads
    block = (
        "attn_norm",
        "qkv",
        "qk_norm",
        "rope",
        "scale_q",  # q *= 1/sqrt(attention.key_length)
        "kv_store",
        "attention",
        "out_proj_post_norm",  # x += rms_norm(att . attn_output) * post_attention_norm
        "out_rows",
        "ffn_norm",
        "ffn_geglu",  # g = gelu(h . ffn_gate) * (h . ffn_up)
        "ffn_down_post_norm",  # x += rms_norm(g . ffn_down) * post_ffw_norm
    )
    rope_neox = True

    def embd_scale(self) -> float:
        return float(np.sqrt(np.float32(self.hparams.n_embd)))

    def logit_softcap(self) -> float:
        return self.hparams.extra["final_logit_softcapping"]

    def attention_scales(self) -> tuple[float, float]:
        """Queries are scaled after rope (``f_attention_scale``), the scores are not."""
        hp = self.hparams
        d = hp.n_embd // hp.n_head if hp.n_layer == 62 else hp.n_embd_head_k  # 27B: gemma_pytorch
        return 1.0, float(np.float32(1.0) / np.sqrt(np.float32(d)))

    def swa_layers(self, md: Mapping[str, Any]) -> tuple[bool, ...]:
        return swa_layers(md, self.arch, self.hparams.n_layer)

    def rope_swa_params(self, md: Mapping[str, Any], rope: RopeParams) -> RopeParams:
        """llama.cpp: local layers keep the file's base and scale whatever the context says."""
        return replace(rope, freq_base=self.hparams.extra["freq_base_swa"], freq_scale=1.0)


def swa_layers(
    md: Mapping[str, Any],
    arch: str,
    n_layer: int,
    default: int = DEFAULT_SWA_PATTERN,
    always: bool = False,
) -> tuple[bool, ...]:
    """Which layers use the sliding window (llama.cpp's ``load_swa_pattern``; ``default``: the
    architecture's pattern when the file has none). Without ``always`` there are none unless
    the file gives a window (``attention.sliding_window`` > 0)."""
    if not always and int(md.get(f"{arch}.attention.sliding_window", 0) or 0) <= 0:
        return (False,) * n_layer
    key = f"{arch}.attention.sliding_window_pattern"
    pat = md.get(key, default)
    if isinstance(pat, list | tuple | np.ndarray):
        if len(pat) != n_layer:
            raise ModelError(f"{key} lists {len(pat)} layers, the model has {n_layer}")
        return tuple(bool(x) for x in pat)
    n = int(pat)
    if n < 0:
        raise ModelError(f"{key} must be >= 0, not {n}")
    return tuple(n == 0 or il % n < n - 1 for il in range(n_layer))


MODEL = Gemma3Model
