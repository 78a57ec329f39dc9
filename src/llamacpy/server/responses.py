"""Response bodies with llama-server's field names: native ``/completion`` results and
stream chunks, OpenAI completions and chat completions (whole and as chunks), SSE framing."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from ..api import openai
from ..api.serving import Chunk, Final
from ..api.tool_calls import ReplyStream, parse_reply

FINGERPRINT = "llamacpy"


def sse(data: Any) -> bytes:
    """One server-sent event: ``data: <json>`` and a blank line."""
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {text}\n\n".encode()


SSE_DONE = b"data: [DONE]\n\n"


def usage(final: Final) -> dict[str, int]:
    return {
        "completion_tokens": final.n_predicted,
        "prompt_tokens": final.n_prompt,
        "total_tokens": final.n_prompt + final.n_predicted,
    }


class Shaper:
    """Formats the events of one request for its route (``native``, ``completion``,
    ``chat``)."""

    def __init__(self, kind: str, model: str, *, prompt_text: str = "", echo: bool = False,
                 return_tokens: bool = False, include_usage: bool = False,
                 settings: dict[str, Any] | None = None, plan: Any = None) -> None:  # fmt: skip
        self.kind = kind
        self.model = model
        self.prompt_text = prompt_text
        self.echo = echo
        self.return_tokens = return_tokens
        self.include_usage = include_usage
        self.settings = settings or {}
        prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
        self.id = prefix + uuid.uuid4().hex
        self.created = int(time.time())
        self.n_tokens = 0
        self.plan = plan  # chat: a tool_calls.ChatPlan (reasoning and tool calls split off)
        self.stream = ReplyStream(plan) if plan is not None else None

    # ------------------------------------------------------------------ whole results
    def result(self, final: Final) -> dict[str, Any]:
        if self.kind == "native":
            return self._native_final(final, stream=False)
        if self.kind == "completion":
            text = (self.prompt_text + final.text) if self.echo else final.text
            return {
                "choices": [{"text": text, "index": 0, "logprobs": self._oai_logprobs(final),
                             "finish_reason": final.finish_reason}],
                "created": self.created, "model": self.model,
                "system_fingerprint": FINGERPRINT, "object": "text_completion",
                "usage": usage(final), "id": self.id, "timings": final.timings,
            }  # fmt: skip
        finish, message = final.finish_reason, {"role": "assistant", "content": final.text}
        if self.plan is not None:
            reply = parse_reply(final.text, self.plan)
            message = reply.message()
            finish = "tool_calls" if reply.tool_calls else finish
        choice: dict[str, Any] = {"finish_reason": finish, "index": 0, "message": message}
        if final.probs:
            choice["logprobs"] = openai.chat_logprobs(_merge(final.probs))
        return {
            "choices": [choice], "created": self.created, "model": self.model,
            "system_fingerprint": FINGERPRINT, "object": "chat.completion",
            "usage": usage(final), "id": self.id, "timings": final.timings,
        }  # fmt: skip

    def _oai_logprobs(self, final: Final) -> dict[str, Any] | None:
        if not final.probs and final.prompt_logprobs is None:
            return None
        blocks = ([final.prompt_logprobs] if final.prompt_logprobs else []) + list(final.probs)
        return _merge(blocks)

    def _native_final(self, final: Final, stream: bool) -> dict[str, Any]:
        out: dict[str, Any] = {
            "index": 0,
            "content": "" if stream else final.text,
            "tokens": [] if stream or not self.return_tokens else final.tokens,
            "id_slot": final.id_slot,
            "stop": True,
            "model": self.model,
            "tokens_predicted": final.n_predicted,
            "tokens_evaluated": final.n_prompt,
            "generation_settings": self.settings,
            "prompt": self.prompt_text,
            "has_new_line": "\n" in final.text,
            "truncated": False,
            "stop_type": final.stop_type,
            "stopping_word": final.stopping_word,
            "tokens_cached": final.n_cached + final.n_predicted,
            "timings": final.timings,
        }
        if final.probs and not stream:
            out["completion_probabilities"] = final.probs
        return out

    # ------------------------------------------------------------------ stream chunks
    def first(self) -> list[bytes]:
        """Events sent before any token (the chat role delta)."""
        if self.kind != "chat":
            return []
        return [sse(self._chat_chunk({"role": "assistant", "content": None}, None))]

    def chunk(self, ev: Chunk) -> list[bytes]:
        self.n_tokens += len(ev.tokens)
        if self.kind == "native":
            out: dict[str, Any] = {
                "index": 0, "content": ev.text,
                "tokens": ev.tokens if self.return_tokens else [],
                "stop": False, "id_slot": ev.id_slot, "tokens_predicted": self.n_tokens,
                "tokens_evaluated": ev.n_prompt,
            }  # fmt: skip
            if ev.probs:
                out["completion_probabilities"] = ev.probs
            return [sse(out)]
        if self.kind == "completion":
            lp = _merge(ev.probs) if ev.probs else None
            return [sse(self._cmpl_chunk(ev.text, None, lp))]
        lp = openai.chat_logprobs(_merge(ev.probs)) if ev.probs else None
        if self.stream is None:
            return [sse(self._chat_chunk({"content": ev.text}, None, lp))]
        deltas = self.stream.feed(ev.text)
        if not deltas and lp is not None:
            deltas = [{"content": ""}]
        return [sse(self._chat_chunk(d, None, lp if i == 0 else None))
                for i, d in enumerate(deltas)]  # fmt: skip

    def last(self, final: Final) -> list[bytes]:
        if self.kind == "native":
            return [sse(self._native_final(final, stream=True))]
        head: list[bytes] = []
        if self.kind == "completion":
            last = self._cmpl_chunk("", final.finish_reason, None)
        else:
            finish = final.finish_reason
            if self.stream is not None:
                deltas, reply = self.stream.finish()
                head = [sse(self._chat_chunk(d, None)) for d in deltas]
                finish = "tool_calls" if reply.tool_calls else finish
            last = self._chat_chunk({}, finish)
        last["timings"] = final.timings
        out = [*head, sse(last)]
        if self.include_usage:
            tail = {k: v for k, v in last.items() if k not in ("choices", "timings")}
            out.append(sse({**tail, "choices": [], "usage": usage(final)}))
        out.append(SSE_DONE)
        return out

    def _head(self, obj: str) -> dict[str, Any]:
        return {"created": self.created, "id": self.id, "model": self.model,
                "system_fingerprint": FINGERPRINT, "object": obj}  # fmt: skip

    def _cmpl_chunk(self, text: str, finish: str | None, lp: Any) -> dict[str, Any]:
        return {**self._head("text_completion"),
                "choices": [{"text": text, "index": 0, "logprobs": lp, "finish_reason": finish}]}  # fmt: skip

    def _chat_chunk(
        self, delta: dict[str, Any], finish: str | None, lp: Any = None
    ) -> dict[str, Any]:
        choice: dict[str, Any] = {"finish_reason": finish, "index": 0, "delta": delta}
        if lp is not None:
            choice["logprobs"] = lp
        return {**self._head("chat.completion.chunk"), "choices": [choice]}


def _merge(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    """Concatenate OpenAI ``logprobs`` blocks (one per token) into one."""
    out: dict[str, list[Any]] = {"tokens": [], "text_offset": [], "token_logprobs": [],
                                 "top_logprobs": []}  # fmt: skip
    for b in blocks:
        for k in out:
            out[k].extend(b[k])
    return out
