"""The ``qwen2`` architecture (Qwen2, Qwen2.5), as llama.cpp runs it: a llama block with
optional biases on the q, k and v projections (``attn_{q,k,v}.bias``, added right after
their matmuls) and NeoX rope; the output head is ``output.weight`` or the token embedding.
"""

from __future__ import annotations

from .decoder import LLAMA_BLOCK, LLAMA_TENSORS, Decoder, after
from .spec import Tensor

QKV_BIASES = (
    Tensor("blk.{i}.attn_q.bias", ("n_embd_q",), optional=True),
    Tensor("blk.{i}.attn_k.bias", ("n_embd_k_gqa",), optional=True),
    Tensor("blk.{i}.attn_v.bias", ("n_embd_v_gqa",), optional=True),
)


class Qwen2Model(Decoder):
    arch = "qwen2"
    tensors = LLAMA_TENSORS + QKV_BIASES
    unsupported = ("attn_qkv.weight", "attn_output.bias", "ffn_gate_inp.weight", "output.bias")
    block = after(LLAMA_BLOCK, "qkv", "qkv_bias")  # q += attn_q.bias; k, v likewise
    rope_neox = True


MODEL = Qwen2Model
