"""One log line per request (logger ``llamacpy.access``): client, method, path (without the
query string), status, duration and, for completions, the prompt and predicted token counts.
Never a header (API keys), a query string or a body (prompts). A client that went away
before its answer is one line ending ``client disconnected``."""

from __future__ import annotations

import logging
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("llamacpy.access")

_KEY = "llamacpy.access"


def note(scope: Scope, **fields: Any) -> None:
    """Attach ``fields`` (``prompt_tokens``, ``predicted_tokens``, ``disconnected``) to the
    request's log line."""
    scope.setdefault("state", {}).setdefault(_KEY, {}).update(fields)


def line(scope: Scope, status: int, seconds: float) -> str:
    client = scope.get("client")
    who = client[0] if client else "-"
    info = scope.get("state", {}).get(_KEY, {})
    out = f'{who} "{scope["method"]} {scope["path"]}" {status} {seconds:.3f}s'
    if "prompt_tokens" in info:
        out += f" prompt={info['prompt_tokens']} predicted={info.get('predicted_tokens', 0)}"
    if info.get("disconnected"):
        out += " client disconnected"
    return out


class AccessLogMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        status = 0

        async def send_(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_)
        finally:
            if log.isEnabledFor(logging.INFO):
                log.info("%s", line(scope, status or 500, time.perf_counter() - t0))


def configure(access_log: bool) -> None:
    """Log ``llamacpy.*`` to stderr (once); access lines only when ``access_log``."""
    root = logging.getLogger("llamacpy")
    if not any(getattr(h, "_llamacpy", False) for h in root.handlers):
        h = logging.StreamHandler()
        h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        h._llamacpy = True  # type: ignore[attr-defined]
        root.addHandler(h)
    if root.level == logging.NOTSET:
        root.setLevel(logging.WARNING)
    log.setLevel(logging.INFO if access_log else logging.WARNING)
