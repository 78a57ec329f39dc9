"""The ASGI application: configuration, shared state, middleware (API keys, CORS, body
size), the lifespan that loads the model in the background and stops the engine."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from . import accesslog
from .errors import APIError
from .streaming import ClientGone

# as llama-server: health and the model list need no key (the list names the model only)
PUBLIC_PATHS = frozenset({"/health", "/v1/health", "/models", "/v1/models", "/"})


@dataclass(frozen=True)
class ServerConfig:
    """HTTP-side settings (the model's come with the loaded model).

    ``timeout``: seconds a request may run (then it ends with ``length``);
    ``max_body``: bytes a request body may have (413 beyond); ``shutdown_timeout``: seconds
    in-flight work may go on after SIGTERM before it is cancelled; ``timeout_headers`` and
    ``timeout_body``: seconds a request head and body may take to arrive (408 beyond);
    ``max_connections``: open connections (503 beyond), see :mod:`.transport`;
    ``drain_seconds``: after SIGTERM, seconds during which ``/health`` and new requests
    answer 503 (so a load balancer takes the replica out) before the graceful shutdown.
    """

    host: str = "127.0.0.1"
    port: int = 8080
    api_keys: tuple[str, ...] = ()
    cors_origins: tuple[str, ...] = ()
    timeout: float = 600.0
    alias: str | None = None
    n_predict: int = -1
    max_body: int = 4 << 20
    shutdown_timeout: float = 10.0
    drain_seconds: float = 0.0
    timeout_headers: float = 10.0
    timeout_body: float = 30.0
    max_connections: int = 100
    metrics: bool = False
    spm_infill: bool = False  # /infill puts the suffix first (--spm-infill)
    cache_reuse: int = 0  # default n_cache_reuse of requests (--cache-reuse; 0: off)
    slot_save_path: str = ""  # directory of slot files ("": save/restore answer 501)
    allowed_hosts: tuple[str, ...] = ()  # () = the loopback names when bound to loopback
    reasoning_format: str = "deepseek"  # default of chat requests' reasoning_format
    reasoning_budget: int = -1  # tokens a <think> block may take (-1: no limit)
    reasoning_budget_message: str = ""  # written before the forced end of a long one

    def __repr__(self) -> str:  # never show the keys (logs, tracebacks)
        keys = f"<{len(self.api_keys)} key(s)>"
        return f"ServerConfig(host={self.host!r}, port={self.port}, api_keys={keys}, ...)"


class ServerState:
    """What the routes share: config, the serving model (None while loading, or in
    ``--embedding`` mode), the embedding model, and the load status."""

    def __init__(
        self,
        config: ServerConfig,
        model: Any = None,
        embedder: Any = None,
        *,
        loader: Callable[[], tuple[Any, Any]] | None = None,
        model_name: str = "",
    ) -> None:
        self.config = config
        self.model = model
        self.embedder = embedder
        self.responses_store: Any = None  # /v1/responses kept for previous_response_id
        self.loader = loader
        self.loading = loader is not None
        self.load_error: str | None = None
        self.draining = False  # SIGTERM with --drain-seconds: 503 to new work, then stop
        self.model_name = config.alias or model_name
        self.t_start = int(time.time())
        self.embed_lock = threading.Lock()

    def _load(self) -> None:
        assert self.loader is not None
        try:
            self.model, self.embedder = self.loader()
            if self.model is not None:
                self.model.start()
        except Exception as e:
            self.load_error = str(e)
        finally:
            self.loading = False

    def ready(self) -> None:
        """Raise 503 while loading (or if loading failed) and while draining."""
        if self.draining:
            raise APIError(503, "the server is shutting down", headers={"Retry-After": "1"})
        if self.loading:
            raise APIError(503, "Loading model")
        if self.load_error is not None:
            raise APIError(503, f"the model failed to load: {self.load_error}")

    def generator(self) -> Any:
        self.ready()
        if self.model is None:
            raise APIError(501, "This server does not support completions. Start it without "
                           "`--embedding`")  # fmt: skip
        return self.model

    def tokenizer(self) -> Any:
        self.ready()
        if self.model is not None:
            return self.model.tokenizer
        return self.embedder.tokenizer()


def _digest(s: str | bytes) -> bytes:
    return hashlib.sha256(s.encode() if isinstance(s, str) else s).digest()


class AuthMiddleware:
    """``Authorization: Bearer KEY`` or ``X-Api-Key: KEY`` on every path but the public
    ones. Keys are compared as SHA-256 digests with ``hmac.compare_digest``, against every
    configured key (no early exit), so timing reveals neither a key nor its length."""

    def __init__(self, app: ASGIApp, keys: tuple[str, ...]) -> None:
        self.app = app
        self.keys = [_digest(k) for k in keys]

    def check(self, headers: dict[bytes, bytes]) -> bool:
        auth = headers.get(b"authorization", b"")
        token = auth[7:].strip() if auth[:7].lower() == b"bearer " else headers.get(b"x-api-key")
        if not token:
            return False
        d = _digest(token)
        ok = False
        for k in self.keys:
            ok |= hmac.compare_digest(d, k)
        return ok

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.keys or scope["path"] in PUBLIC_PATHS:
            return await self.app(scope, receive, send)
        if not self.check(dict(scope["headers"])):
            err = APIError(401, "Invalid API Key", headers={"WWW-Authenticate": "Bearer"})
            return await err.response()(scope, receive, send)
        return await self.app(scope, receive, send)


LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def allowed_hosts(cfg: ServerConfig) -> frozenset[str]:
    """The ``Host`` names the server answers: ``cfg.allowed_hosts``, else the loopback names
    on a loopback address (DNS rebinding), else any (``*``)."""
    if cfg.allowed_hosts:
        return frozenset(h.lower() for h in cfg.allowed_hosts)
    if cfg.host in LOOPBACK_NAMES or cfg.host.startswith("127."):
        return frozenset((*LOOPBACK_NAMES, cfg.host))
    return frozenset({"*"})


def host_name(value: str) -> str:
    """``example.com:8080`` -> ``example.com``, ``[::1]:8080`` -> ``::1``."""
    if value.startswith("["):
        return value[1 : value.find("]")].lower() if "]" in value else value.lower()
    return value.rsplit(":", 1)[0].lower() if value.count(":") == 1 else value.lower()


class HostCheckMiddleware:
    """403 unless the ``Host`` header names an allowed host: a web page whose name was
    rebound to 127.0.0.1 cannot reach a loopback server."""

    def __init__(self, app: ASGIApp, hosts: frozenset[str]) -> None:
        self.app = app
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or "*" in self.hosts:
            return await self.app(scope, receive, send)
        host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
        if host and host_name(host) not in self.hosts:  # browsers always send one
            err = APIError(403, f"the Host header {host[:100]!r} is not allowed; allow it with "
                           "--allowed-hosts")  # fmt: skip
            return await err.response()(scope, receive, send)
        return await self.app(scope, receive, send)


class BodyLimitMiddleware:
    """413 at once when ``Content-Length`` announces more than ``limit`` bytes (bodies
    without a length are counted while they are read, see ``routes.read_body``)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            n = dict(scope["headers"]).get(b"content-length")
            try:
                too_big = n is not None and int(n) > self.limit
            except ValueError:
                return await APIError(400, "invalid Content-Length").response()(
                    scope, receive, send
                )
            if too_big:
                err = APIError(413, f"the request body is larger than {self.limit} bytes")
                return await err.response()(scope, receive, send)
        return await self.app(scope, receive, send)


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    return exc.response()


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    msg = {404: "File Not Found", 405: "Method Not Allowed"}.get(exc.status_code, str(exc.detail))
    return APIError(exc.status_code, msg).response()


async def _client_gone(request: Request, exc: Exception) -> Response:
    accesslog.note(request.scope, disconnected=True)
    return Response(status_code=499)  # nginx's "client closed request"; nobody reads it


async def _server_error(request: Request, exc: Exception) -> Response:
    return Response(json.dumps(APIError(500, f"internal error: {type(exc).__name__}").body()),
                    status_code=500, media_type="application/json")  # fmt: skip


EXCEPTION_HANDLERS = {
    APIError: _api_error,
    HTTPException: _http_error,
    ClientGone: _client_gone,
    Exception: _server_error,
}


def create_app(state: ServerState, *, bare: bool = False) -> Starlette:
    """The application for ``state`` (load in the background when it has a loader).
    ``bare``: routes only, no middleware and no lifespan (a router's model, whose router
    application has them)."""
    from . import ollama, openai_responses, routes

    all_routes = routes.ROUTES + ollama.ROUTES + openai_responses.ROUTES
    if bare:
        app = Starlette(routes=all_routes, exception_handlers=EXCEPTION_HANDLERS)
        app.state.server = state
        return app

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if state.loader is not None and state.model is None and state.embedder is None:
            threading.Thread(target=state._load, name="llamacpy-load", daemon=True).start()
        elif state.model is not None:
            state.model.start()
        yield
        if state.model is not None:
            state.model.stop(0.0)  # uvicorn has waited for in-flight requests already

    app = wrap_middleware(all_routes, state.config, lifespan)
    app.state.server = state
    return app


def wrap_middleware(routes: list, cfg: ServerConfig, lifespan: Any) -> Starlette:
    """An application of ``routes`` behind the server's middleware (access log, Host check,
    CORS, body limit, API keys) and its error handlers."""
    middleware = [Middleware(accesslog.AccessLogMiddleware),
                  Middleware(HostCheckMiddleware, hosts=allowed_hosts(cfg))]  # fmt: skip
    if cfg.cors_origins:
        middleware.append(Middleware(
            CORSMiddleware, allow_origins=list(cfg.cors_origins), allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type", "X-Api-Key"],
        ))  # fmt: skip
    middleware.append(Middleware(BodyLimitMiddleware, limit=cfg.max_body))
    middleware.append(Middleware(AuthMiddleware, keys=cfg.api_keys))
    return Starlette(routes=routes, middleware=middleware, exception_handlers=EXCEPTION_HANDLERS,
                     lifespan=lifespan)  # fmt: skip
