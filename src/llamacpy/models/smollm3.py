"""The ``smollm3`` architecture (SmolLM3), as llama.cpp runs it: the llama block, except that
every fourth layer (``(il + 1) % 4 == 0``) uses no positional encoding at all (NoPE: its
queries and keys are not rotated, and a K-shift leaves its keys as they are).
"""

from __future__ import annotations

from .decoder import LLAMA_BLOCK, LLAMA_TENSORS, Decoder

NO_ROPE_LAYER_STEP = 4  # llama.cpp's n_no_rope_layer_step for smollm3 (not a GGUF key)


class SmolLM3Model(Decoder):
    arch = "smollm3"
    tensors = LLAMA_TENSORS
    unsupported = ("attn_qkv.weight", "attn_q.bias", "attn_output.bias", "ffn_gate_inp.weight")
    block = LLAMA_BLOCK
    rope_neox = False

    def layer_rope(self, il: int) -> bool:
        return (il + 1) % NO_ROPE_LAYER_STEP != 0


MODEL = SmolLM3Model
