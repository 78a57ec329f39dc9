"""The ``qwen3`` architecture (Qwen3 dense models), as llama.cpp runs it: a llama block whose
queries and keys go through a per-head RMSNorm (``attn_q_norm``, ``attn_k_norm``, as gemma3)
before NeoX rope; no projection biases. The head size (``attention.key_length``) may differ
from ``n_embd / n_head``.
"""

from __future__ import annotations

from .decoder import BIASES, LLAMA_BLOCK, LLAMA_TENSORS, QK_NORM_TENSORS, Decoder, after


class Qwen3Model(Decoder):
    arch = "qwen3"
    tensors = LLAMA_TENSORS + QK_NORM_TENSORS
    unsupported = ("attn_qkv.weight", *BIASES, "ffn_gate_inp.weight")
    # per-head rms_norm(q) * attn_q_norm, rms_norm(k) * attn_k_norm, before rope
    block = after(LLAMA_BLOCK, "qkv", "qk_norm")
    rope_neox = True
    rank_softmax = True  # Qwen3-Reranker: softmax over the "yes" and "no" scores


MODEL = Qwen3Model
