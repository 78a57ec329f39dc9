"""Response bodies with llama-server's field names: native ``/completion`` results and
stream chunks, OpenAI completions and chat completions (whole and as chunks), Anthropic
Messages (whole and as its stream events), SSE framing."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from ..api import anthropic, openai
from ..api.serving import Chunk, Final
from ..api.tool_calls import ReplyStream, parse_reply

FINGERPRINT = "llamacpy"


def sse(data: Any) -> bytes:
    """One server-sent event: ``data: <json>`` and a blank line."""
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {text}\n\n".encode()


SSE_DONE = b"data: [DONE]\n\n"


def usage(finals: list[Final], n: int = 1) -> dict[str, int]:
    """Token counts of a request's completions (each prompt counted once, not ``n`` times)."""
    prompt = sum(f.n_prompt for f in finals if f.index % n == 0)
    done = sum(f.n_predicted for f in finals)
    return {"completion_tokens": done, "prompt_tokens": prompt, "total_tokens": prompt + done}


class Shaper:
    """Formats the events of one request for its route (``native``, ``completion``,
    ``chat``). A request has ``len(prompt_texts) * n`` completions; completion ``i``
    answers prompt ``i // n`` and is choice ``i`` of an OpenAI response (llama-server's
    ``index``; a native request with several returns a list)."""

    def __init__(self, kind: str, model: str, *, prompt_texts: list[str] | None = None,
                 n: int = 1, echo: bool = False, return_tokens: bool = False,
                 include_usage: bool = False, settings: dict[str, Any] | None = None,
                 plan: Any = None) -> None:  # fmt: skip
        self.kind = kind
        self.model = model
        self.prompt_texts = prompt_texts or [""]
        self.n = n
        self.echo = echo
        self.return_tokens = return_tokens
        self.include_usage = include_usage
        self.settings = settings or {}
        prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
        self.id = prefix + uuid.uuid4().hex
        self.created = int(time.time())
        self.n_tokens: dict[int, int] = {}
        self.plan = plan  # chat: a tool_calls.ChatPlan (reasoning and tool calls split off)
        self.streams: dict[int, ReplyStream] = {}
        self.prompt_tokens: list[int] = []  # the first prompt's tokens (set by the route)

    @property
    def count(self) -> int:
        return len(self.prompt_texts) * self.n

    def _prompt_text(self, index: int) -> str:
        return self.prompt_texts[index // self.n]

    def _stream(self, index: int) -> ReplyStream | None:
        if self.plan is None:
            return None
        if index not in self.streams:
            self.streams[index] = ReplyStream(self.plan)
        return self.streams[index]

    # ------------------------------------------------------------------ whole results
    def result(self, finals: Final | list[Final]) -> Any:
        finals = sorted([finals] if isinstance(finals, Final) else finals, key=lambda f: f.index)
        if self.kind == "native":
            out = [self._native_final(f, stream=False) for f in finals]
            return out[0] if len(out) == 1 else out
        if self.kind == "completion":
            choices = []
            for f in finals:
                text = (self._prompt_text(f.index) + f.text) if self.echo else f.text
                choices.append({"text": text, "index": f.index,
                                "logprobs": self._oai_logprobs(f),
                                "finish_reason": f.finish_reason})  # fmt: skip
            obj = "text_completion"
        else:
            choices = [self._chat_choice(f) for f in finals]
            obj = "chat.completion"
        return {
            "choices": choices, "created": self.created, "model": self.model,
            "system_fingerprint": FINGERPRINT, "object": obj,
            "usage": usage(finals, self.n), "id": self.id, "timings": finals[0].timings,
        }  # fmt: skip

    def _chat_choice(self, final: Final) -> dict[str, Any]:
        finish, message = final.finish_reason, {"role": "assistant", "content": final.text}
        if self.plan is not None:
            reply = parse_reply(final.text, self.plan)
            message = reply.message()
            finish = "tool_calls" if reply.tool_calls else finish
        choice: dict[str, Any] = {"finish_reason": finish, "index": final.index,
                                  "message": message}  # fmt: skip
        if final.probs:
            choice["logprobs"] = openai.chat_logprobs(_merge(final.probs))
        return choice

    def _oai_logprobs(self, final: Final) -> dict[str, Any] | None:
        if not final.probs and final.prompt_logprobs is None:
            return None
        blocks = ([final.prompt_logprobs] if final.prompt_logprobs else []) + list(final.probs)
        return _merge(blocks)

    def _native_final(self, final: Final, stream: bool) -> dict[str, Any]:
        out: dict[str, Any] = {
            "index": final.index,
            "content": "" if stream else final.text,
            "tokens": [] if stream or not self.return_tokens else final.tokens,
            "id_slot": final.id_slot,
            "stop": True,
            "model": self.model,
            "tokens_predicted": final.n_predicted,
            "tokens_evaluated": final.n_prompt,
            "generation_settings": self.settings,
            "prompt": self._prompt_text(final.index),
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
        """Events sent before any token (the chat role delta of each choice)."""
        if self.kind != "chat":
            return []
        return [sse(self._chat_chunk({"role": "assistant", "content": None}, None, index=i))
                for i in range(self.count)]  # fmt: skip

    def chunk(self, ev: Chunk) -> list[bytes]:
        i = ev.index
        self.n_tokens[i] = self.n_tokens.get(i, 0) + len(ev.tokens)
        if self.kind == "native":
            out: dict[str, Any] = {
                "index": i, "content": ev.text,
                "tokens": ev.tokens if self.return_tokens else [],
                "stop": False, "id_slot": ev.id_slot, "tokens_predicted": self.n_tokens[i],
                "tokens_evaluated": ev.n_prompt,
            }  # fmt: skip
            if ev.probs:
                out["completion_probabilities"] = ev.probs
            return [sse(out)]
        if self.kind == "completion":
            lp = _merge(ev.probs) if ev.probs else None
            return [sse(self._cmpl_chunk(ev.text, None, lp, index=i))]
        lp = openai.chat_logprobs(_merge(ev.probs)) if ev.probs else None
        stream = self._stream(i)
        if stream is None:
            return [sse(self._chat_chunk({"content": ev.text}, None, lp, index=i))]
        deltas = stream.feed(ev.text)
        if not deltas and lp is not None:
            deltas = [{"content": ""}]
        return [sse(self._chat_chunk(d, None, lp if k == 0 else None, index=i))
                for k, d in enumerate(deltas)]  # fmt: skip

    def done(self, final: Final) -> list[bytes]:
        """The events that close one completion (its finish reason)."""
        i = final.index
        if self.kind == "native":
            return [sse(self._native_final(final, stream=True))]
        head: list[bytes] = []
        if self.kind == "completion":
            last = self._cmpl_chunk("", final.finish_reason, None, index=i)
        else:
            finish = final.finish_reason
            stream = self._stream(i)
            if stream is not None:
                deltas, reply = stream.finish()
                head = [sse(self._chat_chunk(d, None, index=i)) for d in deltas]
                finish = "tool_calls" if reply.tool_calls else finish
            last = self._chat_chunk({}, finish, index=i)
        last["timings"] = final.timings
        return [*head, sse(last)]

    def end(self, finals: list[Final]) -> list[bytes]:
        """The events after every completion is done (usage, ``[DONE]``)."""
        if self.kind == "native":
            return []
        out = []
        if self.include_usage:
            obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
            out.append(sse({**self._head(obj), "choices": [],
                            "usage": usage(finals, self.n)}))  # fmt: skip
        out.append(SSE_DONE)
        return out

    def error(self, err: Any) -> bytes:
        """A failure in the middle of a stream (an ``APIError``)."""
        return sse(err.body())

    def last(self, final: Final) -> list[bytes]:
        """:meth:`done` and :meth:`end` of a request with one completion."""
        return self.done(final) + self.end([final])

    def _head(self, obj: str) -> dict[str, Any]:
        return {"created": self.created, "id": self.id, "model": self.model,
                "system_fingerprint": FINGERPRINT, "object": obj}  # fmt: skip

    def _cmpl_chunk(self, text: str, finish: str | None, lp: Any,
                    index: int = 0) -> dict[str, Any]:  # fmt: skip
        return {**self._head("text_completion"),
                "choices": [{"text": text, "index": index, "logprobs": lp,
                             "finish_reason": finish}]}  # fmt: skip

    def _chat_chunk(self, delta: dict[str, Any], finish: str | None, lp: Any = None,
                    index: int = 0) -> dict[str, Any]:  # fmt: skip
        choice: dict[str, Any] = {"finish_reason": finish, "index": index, "delta": delta}
        if lp is not None:
            choice["logprobs"] = lp
        return {**self._head("chat.completion.chunk"), "choices": [choice]}


def event(name: str, data: dict[str, Any]) -> bytes:
    """One named server-sent event (Anthropic's stream framing)."""
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


class EventShaper(Shaper):
    """A chat reply as another API's named stream events: ``self.events.deltas`` turns
    :class:`~llamacpy.api.tool_calls.ReplyStream` deltas into ``(name, data)`` events."""

    events: Any

    def chunk(self, ev: Chunk) -> list[bytes]:
        stream = self._stream(ev.index)
        assert stream is not None
        return [event(*e) for e in self.events.deltas(stream.feed(ev.text))]

    def finish(self, final: Final) -> tuple[list[tuple[str, Any]], Any]:
        """The events of the reply's last deltas, and the whole parsed reply."""
        stream = self._stream(final.index)
        assert stream is not None
        deltas, reply = stream.finish()
        return self.events.deltas(deltas), reply

    def end(self, finals: list[Final]) -> list[bytes]:
        return []


class MessagesShaper(EventShaper):
    """Anthropic Messages: the chat reply as a Message, or as its stream events (one
    completion: the API has no ``n``)."""

    def __init__(self, model: str, **kw: Any) -> None:
        super().__init__("chat", model, **kw)
        self.id = anthropic.new_message_id()
        self.events = anthropic.MessageEvents(self.id, model)

    def _reason(self, final: Final, calls: bool) -> tuple[str, Any]:
        return anthropic.stop_reason("tool_calls" if calls else final.finish_reason,
                                     final.stopping_word)  # fmt: skip

    def result(self, finals: Final | list[Final]) -> Any:
        final = finals if isinstance(finals, Final) else finals[0]
        msg = self._chat_choice(final)["message"]
        blocks = anthropic.content_blocks(msg)
        reason = self._reason(final, bool(msg.get("tool_calls")))
        return anthropic.message(self.id, self.model, blocks, reason, final.n_prompt,
                                 final.n_predicted)  # fmt: skip

    def first(self) -> list[bytes]:
        return [event(*e) for e in self.events.start(len(self.prompt_tokens))]

    def done(self, final: Final) -> list[bytes]:
        out, reply = self.finish(final)
        out += self.events.end(self._reason(final, bool(reply.tool_calls)), final.n_predicted)
        return [event(*e) for e in out]

    def error(self, err: Any) -> bytes:
        return event("error", messages_error(err.type, err.message))


def messages_error(kind: str, message: str) -> dict[str, Any]:
    """Anthropic's error body."""
    return {"type": "error", "error": {"type": kind, "message": message}}


def _merge(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    """Concatenate OpenAI ``logprobs`` blocks (one per token) into one."""
    out: dict[str, list[Any]] = {"tokens": [], "text_offset": [], "token_logprobs": [],
                                 "top_logprobs": []}  # fmt: skip
    for b in blocks:
        for k in out:
            out[k].extend(b[k])
    return out
