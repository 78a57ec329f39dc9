"""The ``llama`` architecture (Llama 1/2/3, Mistral, SmolLM, Mixtral, ...), as llama.cpp runs
it.

A block is ``x += attn(rms_norm(x) * attn_norm)``; ``x += ffn_down(silu(ffn_gate(h)) *
ffn_up(h))`` with ``h = rms_norm(x) * ffn_norm``; normal (adjacent-pair) rope, with the
frequency factors of ``rope_freqs.weight`` when the file has them (Llama 3.1+); grouped-query
attention scaled by ``1/sqrt(head size)``; the output head is ``output.weight`` or, when
absent, the token embedding (tied). ``llama.attention.sliding_window`` is ignored, as
llama.cpp does for this architecture.

A file with ``llama.expert_count`` > 0 (Mixtral) runs as :class:`LlamaMoEModel`: the FFN is a
mixture of experts (:mod:`.moe`: softmax router, the ``expert_used_count`` most probable
experts, their weights divided by their sum as llama.cpp does for ``llama``; experts of
``feed_forward_length``).

The tensors and the block are :mod:`.decoder`'s ``LLAMA_TENSORS`` and ``LLAMA_BLOCK``; the
stages are in :mod:`.stages`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .decoder import BIASES, LLAMA_BLOCK, LLAMA_TENSORS, Decoder
from .moe import MoEDecoder, moe_block, with_experts

_UNSUPPORTED = ("attn_qkv.weight", *BIASES, "ffn_gate.bias", "ffn_up.bias", "ffn_down.bias")


class LlamaModel(Decoder):
    arch = "llama"
    tensors = LLAMA_TENSORS
    unsupported = (*_UNSUPPORTED, "ffn_gate_inp.weight")  # experts without expert_count
    block = LLAMA_BLOCK
    rope_neox = False

    @classmethod
    def variant(cls, md: Mapping[str, Any]) -> type[Decoder]:
        experts = md.get("llama.expert_count")
        return LlamaMoEModel if experts is not None and experts > 0 else cls


class LlamaMoEModel(MoEDecoder):
    """A ``llama`` file with experts (Mixtral)."""

    arch = "llama"
    tensors = with_experts(LLAMA_TENSORS)
    unsupported = (*_UNSUPPORTED, "ffn_gate_shexp.weight")  # Granite's shared expert
    block = moe_block(LLAMA_BLOCK)
    rope_neox = False


MODEL = LlamaModel
