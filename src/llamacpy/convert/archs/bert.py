"""BERT (``BertModel``, ``BertForMaskedLM``, ``BertForSequenceClassification``) -> ``bert``:
an embedding model (non-causal, pooling from sentence-transformers' config)."""

from __future__ import annotations

from collections.abc import Iterable

from ..kv import KV, T
from .base import Lazy, TextArch

BERT_NAMES = {
    "embeddings.word_embeddings": "token_embd",
    "embeddings.position_embeddings": "position_embd",
    "embeddings.token_type_embeddings": "token_types",
    "embeddings.LayerNorm": "token_embd_norm",
    "encoder.layer.{bid}.attention.self.query": "blk.{bid}.attn_q",
    "encoder.layer.{bid}.attention.self.key": "blk.{bid}.attn_k",
    "encoder.layer.{bid}.attention.self.value": "blk.{bid}.attn_v",
    "encoder.layer.{bid}.attention.output.dense": "blk.{bid}.attn_output",
    "encoder.layer.{bid}.attention.output.LayerNorm": "blk.{bid}.attn_output_norm",
    "encoder.layer.{bid}.intermediate.dense": "blk.{bid}.ffn_up",
    "encoder.layer.{bid}.output.dense": "blk.{bid}.ffn_down",
    "encoder.layer.{bid}.output.LayerNorm": "blk.{bid}.layer_output_norm",
    "classifier": "cls",
    "classifier.out_proj": "cls.output",
}
_SKIP = ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias")


class Bert(TextArch):
    arch = "bert"
    hf_architectures = ("BertModel", "BertForMaskedLM", "BertForSequenceClassification")
    names = BERT_NAMES
    f32_names = ("position_embd", "token_types")

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        labels = self.hp.get("id2label")
        if isinstance(labels, dict) and len(labels) == 2:
            first = labels.get(0, labels.get("0"))
            if first == "LABEL_0":
                labels = None  # transformers' dummy labels
        self.labels = labels or None

    def set_params(self, kv: KV, ftype: int) -> None:
        super().set_params(kv, ftype)
        kv.add_arch("attention.causal", False, T.BOOL)
        self.set_pooling(kv)
        if self.labels:
            ordered = [v for _, v in sorted(self.labels.items(), key=lambda kv_: int(kv_[0]))]
            kv.add_arch("classifier.output_labels", ordered, T.ARRAY, T.STRING)

    def set_vocab(self, kv: KV) -> None:
        from ..vocab import set_vocab_bert

        set_vocab_bert(kv, self.dir, self.hp)

    def rename(self, name: str) -> str | None:
        name = name.removeprefix("bert.")
        if name.endswith(".gamma"):
            name = name[: -len(".gamma")] + ".weight"
        if name.endswith(".beta"):
            name = name[: -len(".beta")] + ".bias"
        if name in _SKIP or name.startswith(("cls.predictions", "cls.seq_relationship")):
            return None
        return super().rename(name)

    def modify(self, name: str, bid: int | None, data: Lazy) -> Iterable[tuple[str, Lazy]]:
        if self.labels and name in ("classifier.weight", "classifier.bias"):
            name = "classifier.out_proj." + name.rsplit(".", 1)[1]
        yield self.map_name(name), data
