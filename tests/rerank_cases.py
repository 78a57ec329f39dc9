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


# llama.cpp's convert_hf_to_gguf.py gives Qwen3-Reranker files this rerank template
QWEN3_RERANK_TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
    'and the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
    "<|im_start|>user\n<Instruct>: Given a web search query, retrieve relevant passages that "
    "answer the query\n<Query>: {query}\n<Document>: {document}<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n"
)


QWEN3_N_CTX = 2048  # byte tokens: a pair's prompt is ~550-900 tokens


def write_qwen3_reranker(out: Path) -> Path:
    """A tiny random qwen3 (Q8_0, as ``llamacpy.models.tiny``) made a Qwen3-Reranker as the
    converter makes one: rank pooling, labels ``yes``/``no``, a ``cls.output`` of two rows
    (the LM head's "yes" and "no" rows in a real file; seeded random here) and the rerank
    template."""
    from llamacpy.gguf import GGMLType, GGUFReader, GGUFValueType, GGUFWriter
    from llamacpy.gguf.writer import copy_to_writer
    from llamacpy.models.tiny import TINY_SHAPE, write_tiny_llama

    base = out.with_name(out.stem + "-base.gguf")
    write_tiny_llama(base, GGMLType.Q8_0, seed=3, arch="qwen3", n_ctx=QWEN3_N_CTX)
    w = copy_to_writer(GGUFReader(base), GGUFWriter(out))
    w.add("qwen3.pooling_type", 4, GGUFValueType.UINT32)
    w.add("qwen3.classifier.output_labels", ["yes", "no"], GGUFValueType.ARRAY,
          GGUFValueType.STRING)  # fmt: skip
    w.add("tokenizer.chat_template.rerank", QWEN3_RERANK_TEMPLATE)
    rng = np.random.default_rng(20261203)
    head = (rng.standard_normal((2, TINY_SHAPE["n_embd"])) * 0.05).astype(np.float32)
    w.add_tensor("cls.output.weight", 0, head.shape[::-1], head)
    w.write()
    return out
