"""OpenAI-style response dicts, shaped exactly as llama-cpp-python 0.3 returns them
(``llama_cpp.llama_types``): completions, completion chunks, chat completions and chunks,
and the ``logprobs`` blocks."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np


def logits_to_logprobs(logits: np.ndarray, axis: int = -1) -> np.ndarray:
    """Log-softmax in float32, as ``Llama.logits_to_logprobs``."""
    logits = np.asarray(logits, np.float32)
    maxs = np.amax(logits, axis=axis, keepdims=True)
    maxs[~np.isfinite(maxs)] = 0
    shifted = np.subtract(logits, maxs, dtype=np.float32)
    with np.errstate(divide="ignore"):
        out = np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))
    return shifted - out


def _top(logprobs: np.ndarray, n: int) -> list[int]:
    """Ids of the ``n`` best entries, ordered as ``sorted(zip(lp, ids), reverse=True)``."""
    if n <= 0:
        return []
    n = min(n, len(logprobs))
    cand = np.argpartition(-logprobs, n - 1)[:n] if n < len(logprobs) else np.arange(n)
    # ties at the boundary: take every id with the n-th value, then sort (lp desc, id desc)
    cut = logprobs[cand].min()
    cand = np.nonzero(logprobs >= cut)[0]
    order = np.lexsort((-cand, -logprobs[cand]))
    return [int(i) for i in cand[order][:n]]


def completion_logprobs(
    tokens: Sequence[int],
    rows: np.ndarray,
    n_top: int,
    piece: Callable[[int], bytes],
    *,
    text_offset: int = 0,
    skip_token: int | None = None,
    first_is_none: bool = False,
) -> dict[str, Any]:
    """The ``logprobs`` block of a completion choice.

    ``rows[i]`` are the logits that ``tokens[i]`` was predicted from. Offsets count the
    characters of the text before each token; ``skip_token`` (BOS) gets no entry; with
    ``first_is_none`` the first entry's logprob and top are None (the echoed first token).
    """
    out_tokens: list[str] = []
    offsets: list[int] = []
    token_lp: list[float | None] = []
    top_lp: list[dict[str, float] | None] = []
    prefix = b""
    for tid, row in zip(tokens, rows):
        p = piece(tid)
        if tid == skip_token:
            prefix += p
            continue
        text = p.decode("utf-8", "ignore")
        lp = logits_to_logprobs(row)
        offsets.append(text_offset + len(prefix.decode("utf-8", "ignore")))
        out_tokens.append(text)
        token_lp.append(float(lp[tid]))
        top = {piece(i).decode("utf-8", "ignore"): float(lp[i]) for i in _top(lp, n_top)}
        top[text] = float(lp[tid])
        top_lp.append(top)
        prefix += p
    if first_is_none and token_lp:
        token_lp[0] = None
        top_lp[0] = None
    return {
        "tokens": out_tokens,
        "text_offset": offsets,
        "token_logprobs": token_lp,
        "top_logprobs": top_lp,
    }


def new_completion_id() -> tuple[str, int]:
    return f"cmpl-{uuid.uuid4()}", int(time.time())


def completion(
    cid: str,
    created: int,
    model: str,
    text: str,
    finish_reason: str | None,
    logprobs: dict[str, Any] | None,
    n_prompt: int,
    n_completion: int,
) -> dict[str, Any]:
    """``CreateCompletionResponse``."""
    out = completion_chunk(cid, created, model, text, finish_reason, logprobs)
    out["usage"] = {
        "prompt_tokens": n_prompt,
        "completion_tokens": n_completion,
        "total_tokens": n_prompt + n_completion,
    }
    return out


def completion_chunk(
    cid: str,
    created: int,
    model: str,
    text: str,
    finish_reason: str | None = None,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One ``CreateCompletionStreamResponse`` (no ``usage``)."""
    return {
        "id": cid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {"text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish_reason}
        ],
    }


def chat_logprobs(logprobs: dict[str, Any] | None) -> dict[str, Any] | None:
    """Completion logprobs as ``ChatCompletionLogprobs``."""
    if logprobs is None:
        return None
    content = []
    for tok, lp, top in zip(
        logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"]
    ):
        content.append(
            {
                "token": tok,
                "bytes": None,
                "logprob": lp,
                "top_logprobs": [
                    {"token": t, "logprob": v, "bytes": None} for t, v in (top or {}).items()
                ],
            }
        )
    return {"content": content, "refusal": None}


def chat_completion(comp: dict[str, Any]) -> dict[str, Any]:
    """``CreateChatCompletionResponse`` from a text completion."""
    choice = comp["choices"][0]
    return {
        "id": "chat" + comp["id"],
        "object": "chat.completion",
        "created": comp["created"],
        "model": comp["model"],
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": choice["text"]},
                "logprobs": chat_logprobs(choice["logprobs"]),
                "finish_reason": choice["finish_reason"],
            }
        ],
        "usage": comp["usage"],
    }


def chat_chunks(chunks: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """``ChatCompletionChunk``s from completion chunks: a role delta first, then content
    deltas, then an empty delta with the finish reason."""
    for i, chunk in enumerate(chunks):
        choice = chunk["choices"][0]
        head = {
            "id": "chat" + chunk["id"],
            "model": chunk["model"],
            "created": chunk["created"],
            "object": "chat.completion.chunk",
        }
        if i == 0:
            yield {
                **head,
                "choices": [
                    {
                        "index": 0,
                        "delta": {"role": "assistant"},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ],
            }
        done = choice["finish_reason"] is not None
        yield {
            **head,
            "choices": [
                {
                    "index": 0,
                    "delta": {} if done else {"content": choice["text"]},
                    "logprobs": chat_logprobs(choice["logprobs"]),
                    "finish_reason": choice["finish_reason"],
                }
            ],
        }


def embedding_response(embeds: Sequence[Any], model: str, n_tokens: int) -> dict[str, Any]:
    """``create_embedding``'s ``CreateEmbeddingResponse``."""
    return {
        "object": "list",
        "data": [{"object": "embedding", "embedding": e, "index": i} for i, e in enumerate(embeds)],
        "model": model,
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
    }
