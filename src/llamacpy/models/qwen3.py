"""The ``qwen3`` architecture (Qwen3 dense models), as llama.cpp runs it: a llama block whose
queries and keys go through a per-head RMSNorm (``attn_q_norm``, ``attn_k_norm``, as gemma3)
before NeoX rope; no projection biases. The head size (``attention.key_length``) may differ
from ``n_embd / n_head``.
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

_UNSUPPORTED = (
    "attn_qkv.weight",
    "attn_q.bias",
    "attn_k.bias",
    "attn_v.bias",
    "attn_output.bias",
    "ffn_gate_inp.weight",
    "cls_out.weight",
)


@dataclass(frozen=True)
class Qwen3Block(LlamaBlock):
    attn_q_norm: Vector
    attn_k_norm: Vector


def _block(ld: Loader, p: str, hp: HParams) -> Qwen3Block:
    d = hp.n_embd_head_k
    norms = {
        "attn_q_norm": ld.vec(p + "attn_q_norm.weight", d),
        "attn_k_norm": ld.vec(p + "attn_k_norm.weight", d),
    }
    return Qwen3Block(**plain_block(ld, p, hp, **norms))


class Qwen3Model(LlamaModel):
    """A loaded qwen3 model; see the module docstring."""

    arch = "qwen3"
    rope_neox = True

    @classmethod
    def load_extra(cls, ld: Loader, source: TensorSource, hp: HParams) -> dict[str, Any]:
        return {}

    @classmethod
    def load(
        cls, mf: GGUFModelFile, source: TensorSource, rope: RopeOverrides | None = None
    ) -> Qwen3Model:
        """Check, read and repack a model's tensors (see :mod:`.variants`)."""
        return load_decoder(cls, mf, source, rope, _block, _UNSUPPORTED)
