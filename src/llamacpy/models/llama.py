"""The ``llama`` architecture (Llama 1/2/3, Mistral, SmolLM, ...), as llama.cpp runs it.

A block is ``x += attn(rms_norm(x) * attn_norm)``; ``x += ffn_down(silu(ffn_gate(h)) *
ffn_up(h))`` with ``h = rms_norm(x) * ffn_norm``; normal (adjacent-pair) rope, with the
frequency factors of ``rope_freqs.weight`` when the file has them (Llama 3.1+); grouped-query
attention scaled by ``1/sqrt(head size)``; the output head is ``output.weight`` or, when
absent, the token embedding (tied). ``llama.attention.sliding_window`` is ignored, as
llama.cpp does for this architecture.

The tensors and the block are :mod:`.decoder`'s ``LLAMA_TENSORS`` and ``LLAMA_BLOCK``; the
stages are in :mod:`.stages`.
"""

from __future__ import annotations

from .decoder import BIASES, LLAMA_BLOCK, LLAMA_TENSORS, Decoder


class LlamaModel(Decoder):
    arch = "llama"
    tensors = LLAMA_TENSORS
    unsupported = (
        "attn_qkv.weight",
        *BIASES,
        "ffn_gate.bias",
        "ffn_up.bias",
        "ffn_down.bias",
        "ffn_gate_inp.weight",  # experts (Mixtral)
    )
    block = LLAMA_BLOCK
    rope_neox = False


MODEL = LlamaModel
