"""The ``phi3`` architecture (Phi-3, Phi-3.5, Phi-4 mini), as llama.cpp runs it.

A llama block whose q/k/v come fused as ``attn_qkv`` (rows q | k | v) and whose gate and up
projections come fused as ``ffn_up`` (rows gate | up, SwiGLU): both are split by row ranges
at load time into separate repacked matrices, so the forward runs them as is (no cost at
run time). NeoX rope; queries are scaled by ``1/sqrt(head size)`` after rope.

Rope scaling (LongRoPE): ``rope_factors_short`` / ``rope_factors_long`` hold per-dimension
frequency factors; as llama.cpp, a context larger than the original training context
(``rope.scaling.original_context_length``, default ``context_length``) uses the long ones,
else the short ones (``rope_freqs``, when present, wins); llama.cpp compares its context
rounded up to a multiple of 256, this the context as allocated (the same for such sizes).
``rope.scaling.attn_factor`` scales the rotated values (see :func:`.common.rope_params`; a
K-shift applies it again, as llama.cpp's). ``attention.sliding_window`` is ignored, as
llama.cpp does for this architecture.
"""

from __future__ import annotations

import numpy as np

from .decoder import LLAMA_BLOCK, LLAMA_TENSORS, Decoder, after
from .qwen2 import QKV_BIASES
from .spec import Fused, Param, Tensor


class Phi3Model(Decoder):
    arch = "phi3"
    tensors = (
        LLAMA_TENSORS
        + QKV_BIASES
        + (
            Fused("blk.{i}.attn_qkv.weight", ("attn_q", "attn_k", "attn_v")),
            Fused("blk.{i}.ffn_up.weight", ("ffn_gate", "ffn_up"), required=True),
            Tensor("rope_factors_long.weight", ("n_rot/2",), optional=True, raw=True),
            Tensor("rope_factors_short.weight", ("n_rot/2",), optional=True, raw=True),
        )
    )
    params = (Param("n_ctx_orig", "rope.scaling.original_context_length", 0, int, 0),)
    unsupported = (
        "attn_qkv.bias",
        "attn_output.bias",
        "attn_norm.bias",
        "ffn_norm.bias",
        "ffn_up.bias",
        "ffn_down.bias",
        "ffn_gate_inp.weight",
        "output_norm.bias",
        "output.bias",
    )
    # q += biases (when present); q *= 1/sqrt(head size) after rope
    block = after(after(LLAMA_BLOCK, "qkv", "qkv_bias"), "rope", "scale_q")
    rope_neox = True

    def attention_scales(self) -> tuple[float, float]:
        """Queries are scaled after rope, the scores are not (as llama.cpp's graph)."""
        return 1.0, float(np.float32(1.0) / np.sqrt(np.float32(self.hparams.n_embd_head_k)))

    def rope_factors(self, n_ctx: int) -> np.ndarray:
        """The frequency factors of a context of ``n_ctx`` cells (long above the original
        training context, else short; empty: none)."""
        if self.rope_freqs is not None:
            return self.freqs_arr
        n_ctx_orig = self.hparams.extra["n_ctx_orig"] or self.hparams.n_ctx_train
        f = self.glob["rope_factors_long" if n_ctx > n_ctx_orig else "rope_factors_short"]
        return np.zeros(0, np.float32) if f is None else np.ascontiguousarray(f, np.float32)


MODEL = Phi3Model
