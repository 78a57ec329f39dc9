"""Qwen2 and Qwen3 (``Qwen2ForCausalLM``, ``Qwen3ForCausalLM``) -> ``qwen2`` / ``qwen3``.

No permutation (llama.cpp runs Qwen with NEOX-style RoPE); Qwen2 has q/k/v biases, Qwen3
per-head q/k RMS norms.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..common import ConvertError
from ..kv import KV
from .base import Lazy, TextArch
from .llama import LLAMA_NAMES

_QK_NORM = {
    "model.layers.{bid}.self_attn.q_norm": "blk.{bid}.attn_q_norm",
    "model.layers.{bid}.self_attn.k_norm": "blk.{bid}.attn_k_norm",
}
QWEN3_NAMES = {**LLAMA_NAMES, **_QK_NORM}


class Qwen2(TextArch):
    arch = "qwen2"
    hf_architectures = ("Qwen2ForCausalLM", "Qwen2Model")
    names = LLAMA_NAMES

    def set_params(self, kv: KV, ftype: int) -> None:
        super().set_params(kv, ftype)
        self.set_pooling(kv)

    def set_vocab(self, kv: KV) -> None:
        from ..vocab import set_vocab_gpt2, set_vocab_sentencepiece

        try:
            set_vocab_sentencepiece(kv, self.dir, self.hp)
        except FileNotFoundError:
            set_vocab_gpt2(kv, self.dir, self.hp)

    def modify(self, name: str, bid: int | None, data: Lazy) -> Iterable[tuple[str, Lazy]]:
        if self.hf_arch in ("Qwen2Model", "Qwen3Model"):
            name = f"model.{name}"
        yield self.map_name(name), data


class Qwen3(Qwen2):
    arch = "qwen3"
    hf_architectures = ("Qwen3ForCausalLM", "Qwen3Model")
    names = QWEN3_NAMES

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        readme = self.dir / "README.md"
        text = readme.read_text(encoding="utf-8").lower() if readme.is_file() else ""
        hints = [self.dir.name, str(self.hp.get("_name_or_path", "")),
                 str(self.hp.get("model_type", "")), self.hf_arch]  # fmt: skip
        if (
            "# qwen3-reranker" in text
            or "# qwen3-vl-reranker" in text
            or any("qwen3-reranker" in h.lower() or "qwen3-vl-reranker" in h.lower() for h in hints)
            or "sequenceclassification" in self.hf_arch.lower()
        ):
            raise ConvertError("Qwen3 reranker models are not supported")
