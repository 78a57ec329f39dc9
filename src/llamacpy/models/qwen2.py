"""The ``qwen2`` architecture (Qwen2, Qwen2.5), as llama.cpp runs it: a llama block with
optional biases on the q, k and v projections (``attn_{q,k,v}.bias``, added right after
their matmuls) and NeoX rope; the output head is ``output.weight`` or the token embedding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..gguf import GGUFModelFile
from ..hparams import HParams
from .common import RopeOverrides
from .llama import LlamaBlock, LlamaModel
from .variants import Loader, load_decoder, plain_block
from .weights import TensorSource, Vector

_UNSUPPORTED = ("attn_qkv.weight", "attn_output.bias", "ffn_gate_inp.weight", "output.bias")


@dataclass(frozen=True)
class Qwen2Block(LlamaBlock):
    attn_q_bias: Vector | None = None
    attn_k_bias: Vector | None = None
    attn_v_bias: Vector | None = None


def qkv_biases(ld: Loader, p: str, hp: HParams) -> dict[str, Vector | None]:
    """The optional q/k/v bias vectors of block ``p``."""
    q, kv = hp.n_head * hp.n_embd_head_k, hp.n_head_kv * hp.n_embd_head_k
    return {
        "attn_q_bias": ld.opt_vec(p + "attn_q.bias", q),
        "attn_k_bias": ld.opt_vec(p + "attn_k.bias", kv),
        "attn_v_bias": ld.opt_vec(p + "attn_v.bias", hp.n_head_kv * hp.n_embd_head_v),
    }


def _block(ld: Loader, p: str, hp: HParams) -> Qwen2Block:
    return Qwen2Block(**plain_block(ld, p, hp, **qkv_biases(ld, p, hp)))


class Qwen2Model(LlamaModel):
    """A loaded qwen2 model; see the module docstring."""

    arch = "qwen2"
    rope_neox = True

    @classmethod
    def load_extra(cls, ld: Loader, source: TensorSource, hp: HParams) -> dict[str, Any]:
        return {}

    @classmethod
    def load(
        cls, mf: GGUFModelFile, source: TensorSource, rope: RopeOverrides | None = None
    ) -> Qwen2Model:
        """Check, read and repack a model's tensors (see :mod:`.variants`)."""
        return load_decoder(cls, mf, source, rope, _block, _UNSUPPORTED)
