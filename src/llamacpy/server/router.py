"""Router mode: one server for several models (llama-server's ``--models-dir``).

The models are GGUF files of a directory (a split model by its first shard) and registry
names; each is served, once loaded, by a single-model application of its own
(:func:`.app.create_app`), so every route and API works unchanged. A request goes to the
model its ``model`` field names (the JSON body's, or the ``model`` query parameter of a
GET); without one, to the only loaded model or the only model there is. A model loads on
its first request (``autoload``, else ``POST /models/load``); at most ``max_loaded`` stay
loaded, the least recently used one without requests in flight is unloaded to make room
(503 when every loaded model is busy); ``sleep_idle`` seconds without a request unload a
model. An unknown model is a 404 listing the available ones; a model that fails to load is
an error on that request only.

Router routes: ``GET /health``, ``GET /models`` and ``/v1/models`` (every model with its
state: unloaded, loading, loaded, failed), ``POST /models/load`` and ``/models/unload``
(``{"model": name}``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route

from .app import ServerConfig, ServerState, create_app, wrap_middleware
from .errors import APIError, bad_request

_SHARD = re.compile(r"-(\d{5})-of-(\d{5})$")


def models_in(directory: str | Path) -> dict[str, Path]:
    """``name -> file`` of the GGUF models in a directory (name: the file name without
    ``.gguf``; a split model once, by its first shard, without the shard suffix)."""
    out: dict[str, Path] = {}
    for p in sorted(Path(directory).glob("*.gguf")):
        stem = p.name[: -len(".gguf")]
        m = _SHARD.search(stem)
        if m is not None:
            if int(m.group(1)) != 1:
                continue
            stem = stem[: m.start()]
        out[stem] = p
    return out


def _check_file(path: Path) -> None:
    """Read the model's GGUF header and metadata (raises what is wrong with the file)."""
    from ..gguf.split import GGUFModelFile

    with GGUFModelFile(path):
        pass


@dataclass
class Entry:
    """One model of the router."""

    name: str
    path: Path
    state: ServerState | None = None
    app: Any = None
    status: str = "unloaded"  # unloaded | loading | loaded | failed
    error: str = ""
    loading: asyncio.Future | None = None
    task: Any = None  # the loading task
    refusal: APIError | None = None  # why the last load did not start (no room)
    in_flight: int = 0
    last_used: float = field(default_factory=time.monotonic)


class Router:
    """The models of a router-mode server and their loading (see the module doc).
    ``make_state(name, path)`` returns a model's :class:`ServerState` with its loader."""

    def __init__(self, config: ServerConfig, models: dict[str, Path],
                 make_state: Callable[[str, Path], ServerState], *, max_loaded: int = 4,
                 autoload: bool = True, sleep_idle: float = 0.0) -> None:  # fmt: skip
        if not models:
            raise ValueError("router mode needs at least one model")
        self.config = config
        self.entries = {n: Entry(n, p) for n, p in models.items()}
        self.make_state = make_state
        self.max_loaded = max_loaded
        self.autoload = autoload
        self.sleep_idle = sleep_idle
        self.draining = False
        self.t_start = int(time.time())
        self._lock = asyncio.Lock()

    # ------------------------------------------------------------------ lookup
    def find(self, name: str | None) -> Entry:
        """The model a request names (404 listing the models if none is called that); no
        name: the only loaded model, else the only model (400 if there are several)."""
        if name is None:
            loaded = [e for e in self.entries.values() if e.status == "loaded"]
            if len(loaded) == 1:
                return loaded[0]
            if len(self.entries) == 1:
                return next(iter(self.entries.values()))
            raise bad_request("this server serves several models: name one with 'model' "
                              f"(available: {', '.join(self.entries)})")  # fmt: skip
        for key in (name, name.removesuffix(".gguf"), name.removesuffix(":latest")):
            if key in self.entries:
                return self.entries[key]
        raise APIError(404, f"model {name!r} not found; available: {', '.join(self.entries)}",
                       "not_found_error")  # fmt: skip

    # ------------------------------------------------------------------ loading
    async def ensure(self, e: Entry, explicit: bool = False) -> Entry:
        """``e`` loaded (loading it first when allowed); raises the load's error."""
        if e.status == "loaded":
            return e
        if not (self.autoload or explicit):
            raise APIError(400, f"model {e.name!r} is not loaded; load it with POST "
                           "/models/load", "invalid_request_error")  # fmt: skip
        if e.loading is None:
            e.loading = asyncio.get_running_loop().create_future()
            e.task = asyncio.ensure_future(self._load(e))
        await asyncio.shield(e.loading)
        if e.refusal is not None:
            raise e.refusal
        if e.status != "loaded":
            raise APIError(500, f"model {e.name!r} failed to load: {e.error}")
        return e

    async def _load(self, e: Entry) -> None:
        fut = e.loading
        assert fut is not None
        e.refusal = None
        try:
            async with self._lock:
                await asyncio.to_thread(_check_file, e.path)  # a bad file evicts nothing
                await self._make_room()
                e.status, e.error = "loading", ""
                state = self.make_state(e.name, e.path)
                await asyncio.to_thread(state._load)
                if state.load_error is not None:
                    e.status, e.error = "failed", state.load_error
                else:
                    e.state, e.app, e.status = state, create_app(state, bare=True), "loaded"
                    e.last_used = time.monotonic()
        except APIError as err:  # no room: this request is refused, the model stays unloaded
            e.refusal = err
        except Exception as err:
            e.status, e.error = "failed", str(err)
        finally:
            e.loading = None
            fut.set_result(None)

    async def _make_room(self) -> None:
        loaded = [e for e in self.entries.values() if e.status == "loaded"]
        if len(loaded) < self.max_loaded:
            return
        idle = sorted((e for e in loaded if e.in_flight == 0), key=lambda e: e.last_used)
        if not idle:
            raise APIError(
                503,
                f"all {len(loaded)} loaded models are busy (--models-max "
                f"{self.max_loaded}); retry later",
                headers={"Retry-After": "1"},
            )
        await self.unload(idle[0])  # fmt: skip

    async def unload(self, e: Entry) -> None:
        if e.status != "loaded" or e.state is None:
            return
        state, e.state, e.app, e.status = e.state, None, None, "unloaded"
        if state.model is not None:
            await asyncio.to_thread(state.model.stop, 0.0)

    async def sleeper(self) -> None:
        """Unload the models idle for ``sleep_idle`` seconds (runs while the server does)."""
        while True:
            await asyncio.sleep(min(1.0, self.sleep_idle / 4))
            now = time.monotonic()
            for e in list(self.entries.values()):
                if (
                    e.status == "loaded"
                    and e.in_flight == 0
                    and now - e.last_used > (self.sleep_idle)
                ):
                    await self.unload(e)

    def ready(self) -> None:
        if self.draining:
            raise APIError(503, "the server is shutting down", headers={"Retry-After": "1"})

    def card(self, e: Entry) -> dict[str, Any]:
        status: dict[str, Any] = {"value": e.status}
        if e.error:
            status["error"] = e.error
        return {"id": e.name, "object": "model", "owned_by": "llamacpp",
                "created": self.t_start, "path": str(e.path), "status": status}  # fmt: skip


class Dispatch:
    """The ASGI app behind the router routes: reads the body, finds (and loads) the model
    it names and hands the request to that model's application."""

    def __init__(self, router: Router) -> None:
        self.router = router

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        r = self.router
        try:
            r.ready()
            body, more = b"", True
            while more:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    return
                body += msg.get("body", b"")
                more = msg.get("more_body", False)
                if len(body) > r.config.max_body:
                    raise APIError(413, f"the request body is larger than {r.config.max_body} "
                                   "bytes")  # fmt: skip
            e = await r.ensure(r.find(_model_name(scope, body)))
        except APIError as err:
            return await err.response()(scope, receive, send)
        sent = False

        async def replay() -> dict:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        e.in_flight += 1
        e.last_used = time.monotonic()
        try:
            await e.app(scope, replay, send)
        finally:
            e.in_flight -= 1
            e.last_used = time.monotonic()


def _model_name(scope: Any, body: bytes) -> str | None:
    """The ``model`` of a JSON body, else of the query string; None when neither names one."""
    if body[:1] in (b"{", b" ", b"\n"):
        with contextlib.suppress(ValueError, UnicodeDecodeError):
            data = json.loads(body)
            if isinstance(data, dict) and isinstance(data.get("model"), str) and data["model"]:
                return data["model"]
    q = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    return q["model"][0] if q.get("model") else None


def create_router_app(router: Router) -> Starlette:
    """The router-mode application (its own routes, then :class:`Dispatch`)."""

    async def health(request: Request) -> Response:
        router.ready()
        return JSONResponse({"status": "ok"})

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list",
                             "data": [router.card(e) for e in router.entries.values()]})  # fmt: skip

    async def _named(request: Request) -> Entry:
        from .routes import read_json  # (bounded by --max-body, JSON checked)

        data = await read_json(request)
        name = data.get("model")
        if not isinstance(name, str):
            raise bad_request("'model' is required")
        return router.find(name)

    async def load(request: Request) -> Response:
        await router.ensure(await _named(request), explicit=True)
        return JSONResponse({"success": True})

    async def unload(request: Request) -> Response:
        e = await _named(request)
        if e.in_flight:
            raise APIError(409, f"model {e.name!r} has requests in flight")
        await router.unload(e)
        return JSONResponse({"success": True})

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        task = asyncio.ensure_future(router.sleeper()) if router.sleep_idle > 0 else None
        yield
        if task is not None:
            task.cancel()
        for e in router.entries.values():
            await router.unload(e)

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/v1/health", health, methods=["GET"]),
        Route("/models", models, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/models/load", load, methods=["POST"]),
        Route("/models/unload", unload, methods=["POST"]),
        Mount("/", app=Dispatch(router)),
    ]
    app = wrap_middleware(routes, router.config, lifespan)
    app.state.server = router  # (what read_json takes the body limit from)
    return app
