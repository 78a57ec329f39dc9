"""Reranking as llama-server does it: the (query, document) prompt and the response.

A pair's tokens (``format_prompt_rerank``): with a ``tokenizer.chat_template.rerank``
template in the file, the template with ``{query}`` and ``{document}`` replaced, tokenized
with special tokens parsed and none added (Qwen3-reranker style); otherwise
``[BOS] query [EOS] [SEP] document [EOS]``, each special token only when the vocabulary
adds it (``add_bos``/``add_eos``/``add_sep``; EOS falls back to SEP), the texts tokenized
as plain text. The score of a pair is the first output of the model's classifier head
(rank pooling).

Responses: Jina/Cohere style (``results`` of ``index`` and ``relevance_score``, sorted by
score, cut to ``top_n``; ``return_documents`` adds each ``document: {"text"}``), or the
TEI style when the request names ``texts`` (a bare list of ``index``/``score``, with
``text`` when ``return_text``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import UsageError

RERANK_TEMPLATE_KEY = "tokenizer.chat_template.rerank"


def fill_rerank_template(template: str, query: str, document: str) -> str:
    """A file's rerank template with ``{query}`` and ``{document}`` replaced."""
    return template.replace("{query}", query).replace("{document}", document)


def rerank_tokens(tokenizer: Any, template: str | None, query: str, document: str) -> list[int]:
    """The token ids of one (query, document) pair (see the module notes)."""
    if template is not None:
        prompt = fill_rerank_template(template, query, document)
        return tokenizer.encode(prompt, add_special=False, parse_special=True)
    v = tokenizer.vocab
    q = tokenizer.encode(query, add_special=False, parse_special=False)
    d = tokenizer.encode(document, add_special=False, parse_special=False)
    eos = v.id("eos")
    if eos < 0:
        eos = v.id("sep")
    out: list[int] = []
    if v.add_bos:
        out.append(v.id("bos"))
    out += q
    if v.add_eos:
        out.append(eos)
    if v.add_sep:
        out.append(v.id("sep"))
    out += d
    if v.add_eos:
        out.append(eos)
    if any(t < 0 for t in out):
        raise UsageError("the vocabulary lacks a special token a rerank prompt needs")
    return out


def parse_rerank_request(body: dict[str, Any]) -> tuple[str, list[str], int, bool, bool]:
    """(query, documents, top_n, TEI format, return the texts) of a request body, checked
    as llama-server checks it (messages are its own)."""
    if "query" not in body:
        raise UsageError('"query" must be provided')
    query = body["query"]
    if not isinstance(query, str):
        raise UsageError('"query" must be a string')
    tei = "texts" in body
    docs = body.get("documents", body.get("texts"))
    if not isinstance(docs, list) or not docs or not all(isinstance(d, str) for d in docs):
        raise UsageError('"documents" must be a non-empty string array')
    top_n = body.get("top_n", len(docs))
    if isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 0:
        raise UsageError('"top_n" must be a non-negative integer')
    flag = "return_text" if tei else "return_documents"
    ret = body.get(flag, False)
    if not isinstance(ret, bool):
        raise UsageError(f'"{flag}" must be a boolean')
    return query, docs, top_n, tei, ret


def rerank_response(
    model: str,
    scores: Sequence[float],
    n_tokens: Sequence[int],
    documents: Sequence[str],
    top_n: int,
    tei: bool,
    return_text: bool,
) -> Any:
    """The response body (``format_response_rerank``): results sorted by score (ties keep
    document order), the first ``top_n``."""
    label = "score" if tei else "relevance_score"
    order = sorted(range(len(scores)), key=lambda i: -float(scores[i]))[:top_n]
    results = []
    for i in order:
        elem: dict[str, Any] = {"index": i, label: float(scores[i])}
        if return_text:
            elem["text" if tei else "document"] = documents[i] if tei else {"text": documents[i]}
        results.append(elem)
    if tei:
        return results
    total = int(sum(n_tokens))
    return {
        "model": model,
        "object": "list",
        "usage": {"prompt_tokens": total, "total_tokens": total},
        "results": results,
    }
