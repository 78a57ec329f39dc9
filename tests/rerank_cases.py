"""The reranking cases shared by ``scripts/make_rerank_fixtures.py`` (llama-server's and
transformers' answers) and ``tests/test_rerank.py`` (ours), and the rerankers they run on.

The rerankers are all-MiniLM-L6-v2 (converted by ``llamacpy convert``, which is
byte-identical to ``convert_hf_to_gguf.py``) with a seeded random classifier head added:
``single`` has the one projection of ``BertForSequenceClassification`` (``cls.output``,
one label), ``dense`` the RoBERTa-style head (``cls`` + tanh, then ``cls.output``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

HEADS = ("single", "dense")
N_EMBD = 384

QUERY = "What is the capital of France?"
DOCUMENTS = [
    "Paris is the capital and most populous city of France.",
    "The Eiffel Tower was completed in 1889.",
    "Berlin is the capital of Germany.",
    "Bananas are rich in potassium.",
    "France's capital city hosts the Louvre museum, the world's most visited art museum.",
    "",
    "capital " * 40,
]
# llama-embedding --pooling rank: query<TAB>document per line (the last one without a tab)
CLI_PROMPT = (
    "What is the capital of France?\\tParis is the capital of France.\\n"
    "What is the capital of France?\\tBananas are yellow.\\nno separator here"
)
REQUESTS = [
    {"name": "jina", "body": {"query": QUERY, "documents": DOCUMENTS}},
    {"name": "top-n", "body": {"query": QUERY, "documents": DOCUMENTS, "top_n": 3}},
    {"name": "tei", "body": {"query": "bananas", "texts": DOCUMENTS[:4], "return_text": True}},
    {"name": "unicode", "body": {"query": "Quelle est la capitale de la France ? 🇫🇷",
                                 "documents": ["La capitale de la France est Paris.",
                                               "東京は日本の首都です。"]}},
    {"name": "no-query", "body": {"documents": DOCUMENTS}},
    {"name": "empty-documents", "body": {"query": QUERY, "documents": []}},
    {"name": "query-not-string", "body": {"query": 3, "documents": DOCUMENTS}},
]  # fmt: skip


def head_weights(kind: str) -> dict[str, np.ndarray]:
    """The seeded head: GGUF tensor name -> float32 array in numpy (row-major) order."""
    rng = np.random.default_rng(20261203 + HEADS.index(kind))
    w: dict[str, np.ndarray] = {}
    if kind == "dense":
        w["cls.weight"] = (rng.standard_normal((N_EMBD, N_EMBD)) * 0.05).astype(np.float32)
        w["cls.bias"] = (rng.standard_normal(N_EMBD) * 0.02).astype(np.float32)
    w["cls.output.weight"] = (rng.standard_normal((1, N_EMBD)) * 0.5).astype(np.float32)
    w["cls.output.bias"] = np.array([0.125], np.float32)
    return w


def write_reranker(minilm_gguf: Path, kind: str, out: Path) -> Path:
    """``minilm_gguf`` with the ``kind`` head added (and ``bert.pooling_type`` = rank)."""
    from llamacpy.gguf import GGUFReader, GGUFValueType, GGUFWriter
    from llamacpy.gguf.writer import copy_to_writer

    w = copy_to_writer(GGUFReader(minilm_gguf), GGUFWriter(out))
    w.add("bert.pooling_type", 4, GGUFValueType.UINT32)
    w.add("general.name", f"minilm-reranker-{kind}")
    for name, arr in head_weights(kind).items():
        w.add_tensor(name, 0, arr.shape[::-1], np.ascontiguousarray(arr))
    w.write()
    return out
