"""Ollama's API (``/api/*``) on this server's engine, for Ollama's clients: ``chat`` and
``generate`` (streamed as one JSON object per line unless ``"stream": false``), ``embed``
and ``embeddings``, ``tags``, ``ps``, ``show``, ``version``. The server serves the model it
was started with under any name a request gives; operations on a model store (pull, push,
create, copy, delete) answer a clear error. Errors are Ollama's ``{"error": message}``."""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..api import ollama
from ..api.serving import Chunk, Final
from ..errors import LlamacpyError
from .errors import APIError, bad_request
from .responses import Shaper
from .routes import _completion, _embed_input, _embed_items, _state, read_json
from .streaming import EventStream


class NDJSONStream(EventStream):
    """A stream of JSON objects, one per line (Ollama's streaming)."""

    media_type = "application/x-ndjson"


def line(obj: dict[str, Any]) -> bytes:
    return (json.dumps(obj, ensure_ascii=False) + "\n").encode()


class OllamaShaper(Shaper):
    """One completion as Ollama's ``/api/chat`` (``message``) or ``/api/generate``
    (``response``, ``thinking``, ``context``) objects."""

    def __init__(self, kind: str, model: str, api: str, **kw: Any) -> None:
        super().__init__(kind, model, **kw)
        self.api = api  # "chat" | "generate"
        self.t_start = time.perf_counter()
        self.calls: list[dict[str, Any]] = []

    def _obj(self, done: bool, content: str = "", thinking: str = "", calls=None) -> dict:
        out: dict[str, Any] = {"model": self.model, "created_at": ollama.now_iso()}
        if self.api == "chat":
            msg: dict[str, Any] = {"role": "assistant", "content": content}
            if thinking:
                msg["thinking"] = thinking
            if calls:
                msg["tool_calls"] = ollama.tool_calls(calls)
            out["message"] = msg
        else:
            out["response"] = content
            if thinking:
                out["thinking"] = thinking
        out["done"] = done
        return out

    def _final(self, final: Final, message: dict[str, Any] | None, whole: bool) -> dict:
        m = message or {}
        content = (m.get("content") or "") if whole else ""
        thinking = (m.get("reasoning_content") or "") if whole else ""
        out = self._obj(True, content, thinking, m.get("tool_calls") if whole else None)
        out["done_reason"] = final.finish_reason
        if self.api == "generate":
            out["context"] = list(self.prompt_tokens) + list(final.tokens)
        return {**out, **ollama.durations(final.timings, self.t_start)}

    def result(self, finals: Final | list[Final]) -> Any:
        final = finals if isinstance(finals, Final) else finals[0]
        if self.plan is None:
            return self._final(final, {"content": final.text}, True)
        return self._final(final, self._chat_choice(final)["message"], True)

    def first(self) -> list[bytes]:
        return []

    def chunk(self, ev: Chunk) -> list[bytes]:
        stream = self._stream(ev.index)
        if stream is None:
            return [line(self._obj(False, ev.text))] if ev.text else []
        return self._lines(stream.feed(ev.text))

    def _lines(self, deltas: list[dict[str, Any]]) -> list[bytes]:
        out = []
        for d in deltas:
            if d.get("tool_calls"):
                continue  # whole calls go out at the end (Ollama's clients want them whole)
            text, thinking = d.get("content") or "", d.get("reasoning_content") or ""
            if text or thinking:
                out.append(line(self._obj(False, text, thinking)))
        return out

    def done(self, final: Final) -> list[bytes]:
        stream = self._stream(final.index)
        out: list[bytes] = []
        if stream is not None:
            deltas, reply = stream.finish()
            out = self._lines(deltas)
            calls = reply.message().get("tool_calls")
            if calls:
                out.append(line(self._obj(False, calls=calls)))
        return [*out, line(self._final(final, None, False))]

    def end(self, finals: list[Final]) -> list[bytes]:
        return []

    def error(self, err: Any) -> bytes:
        return line({"error": err.message})


def _shaper(api: str):
    def make(kind: str, model: str, plan: Any) -> Shaper:
        return OllamaShaper(kind, model, api, plan=plan)

    return make


def _error(e: APIError) -> Response:
    return JSONResponse({"error": e.message}, status_code=e.status, headers=e.headers)


def _ollama(handler):
    """Ollama's error shape for a route's errors."""

    async def route(request: Request) -> Response:
        try:
            return await handler(request)
        except APIError as e:
            return _error(e)
        except LlamacpyError as e:
            return _error(bad_request(str(e)))

    route.__name__ = route.__qualname__ = handler.__name__
    route.__doc__ = handler.__doc__
    return route


async def chat(request: Request) -> Response:
    """``POST /api/chat``."""
    data = await read_json(request)
    body = ollama.chat_request(data)
    return await _completion(request, "chat", body, _shaper("chat"), NDJSONStream)


async def generate(request: Request) -> Response:
    """``POST /api/generate`` (an empty prompt only loads the model, as Ollama's)."""
    data = await read_json(request)
    st = _state(request)
    m = st.generator()
    if not data.get("prompt") and not data.get("context"):
        return JSONResponse({"model": _name(data, st), "created_at": ollama.now_iso(),
                             "response": "", "done": True, "done_reason": "load"})  # fmt: skip
    body, kind = ollama.generate_request(data)
    context = body.pop("context", None)
    if context is not None:
        text = body.pop("prompt")
        if "messages" in body:
            text = m.apply_template(body.pop("messages"))
        body["prompt"] = [*context, text]
    return await _completion(request, kind, body, _shaper("generate"), NDJSONStream)


def _name(data: dict[str, Any], st: Any) -> str:
    name = data.get("model")
    return name if isinstance(name, str) and name else st.model_name


async def embed(request: Request) -> Response:
    """``POST /api/embed`` (``input``: a string or strings; L2-normalized vectors)."""
    return await _embed_route(request, "input", legacy=False)


async def embeddings(request: Request) -> Response:
    """``POST /api/embeddings`` (``prompt``: one string; the vector as pooled)."""
    return await _embed_route(request, "prompt", legacy=True)


async def _embed_route(request: Request, key: str, legacy: bool) -> Response:
    data = await read_json(request)
    st = _state(request)
    t0 = time.perf_counter()
    if legacy and not isinstance(data.get(key), str):
        raise bad_request("'prompt' must be a string")
    items = _embed_input(data, key)
    embeds, n_tokens = await _embed_items(st, items, normalize=-1 if legacy else 2)
    if embeds and embeds[0] and isinstance(embeds[0][0], list):
        raise bad_request("the server's pooling is 'none' (one vector per token): start it "
                          "with --pooling mean, cls or last for one vector per input")  # fmt: skip
    if legacy:
        return JSONResponse({"embedding": embeds[0]})
    return JSONResponse({"model": _name(data, st), "embeddings": embeds,
                         "total_duration": int((time.perf_counter() - t0) * 1e9),
                         "load_duration": 0, "prompt_eval_count": n_tokens})  # fmt: skip


def _card(st: Any) -> dict[str, Any]:
    info = st.model.info if st.model is not None else None
    name = st.model_name if ":" in st.model_name else f"{st.model_name}:latest"
    card: dict[str, Any] = {"name": name, "model": name}
    if info is not None:
        path = info.path
        stat = path.stat()
        digest = hashlib.sha256(f"{path}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()
        card.update({
            "modified_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(stat.st_mtime)),
            "size": stat.st_size, "digest": digest,
            "details": ollama.model_details(info.metadata, info.arch, info.desc),
        })  # fmt: skip
    return card


async def tags(request: Request) -> Response:
    """``GET /api/tags``: the model this server serves."""
    st = _state(request)
    st.ready()
    return JSONResponse({"models": [_card(st)]})


async def ps(request: Request) -> Response:
    """``GET /api/ps``: the loaded model (always loaded while the server runs)."""
    st = _state(request)
    st.ready()
    card = _card(st)
    if st.model is not None:
        card.update({"expires_at": "2318-01-01T00:00:00Z", "size_vram": 0,
                     "context_length": st.model.n_ctx_slot})  # fmt: skip
    return JSONResponse({"models": [card]})


async def show(request: Request) -> Response:
    """``POST /api/show``: template, details, metadata and capabilities."""
    st = _state(request)
    m = st.generator()
    data = await read_json(request)
    if not isinstance(data.get("model", data.get("name")), str):
        raise bad_request("'model' is required")
    info = m.info
    caps = ["completion", "tools"]  # (tools: every template, in its format or the generic one)
    if any(w in m.template.source for w in ("<think>", "enable_thinking", "reasoning")):
        caps.append("thinking")
    return JSONResponse({
        "modelfile": f"FROM {info.path}\n", "parameters": "", "template": m.template.source,
        "details": ollama.model_details(info.metadata, info.arch, info.desc),
        "model_info": {k: v for k, v in info.metadata.items()
                       if not k.startswith("tokenizer.chat_template")},
        "capabilities": caps,
        "modified_at": _card(st).get("modified_at"),
    })  # fmt: skip


async def version(request: Request) -> Response:
    """``GET /api/version``."""
    return JSONResponse({"version": ollama.VERSION})


async def unsupported(request: Request) -> Response:
    """Model-store operations: this server serves the model it was started with."""
    op = request.url.path.rsplit("/", 1)[-1]
    raise APIError(501, f"'{op}' is not supported: this server serves the model it was "
                   "started with (llamacpy serve -m MODEL; llamacpy models pull NAME to "
                   "download one)")  # fmt: skip


ROUTES = [
    Route("/api/chat", _ollama(chat), methods=["POST"]),
    Route("/api/generate", _ollama(generate), methods=["POST"]),
    Route("/api/embed", _ollama(embed), methods=["POST"]),
    Route("/api/embeddings", _ollama(embeddings), methods=["POST"]),
    Route("/api/tags", _ollama(tags), methods=["GET"]),
    Route("/api/ps", _ollama(ps), methods=["GET"]),
    Route("/api/show", _ollama(show), methods=["POST"]),
    Route("/api/version", _ollama(version), methods=["GET"]),
    *[Route(f"/api/{op}", _ollama(unsupported), methods=["POST", "DELETE"])
      for op in ("pull", "push", "create", "copy", "delete")],
]  # fmt: skip
