"""Running the application with uvicorn: graceful SIGTERM/SIGINT (with ``drain_seconds``,
first answer ``/health`` and new requests 503 for that long; then stop accepting, let
in-flight requests finish for ``shutdown_timeout`` seconds, cancel the rest, exit 0)."""

from __future__ import annotations

import signal
import socket
import sys
import threading
import time
from typing import Any

import uvicorn

from . import accesslog
from .app import create_app
from .transport import Limits, protocol_class


class _Server(uvicorn.Server):
    """uvicorn's server with a drain before its graceful shutdown: the first SIGTERM/SIGINT
    marks the state draining (503 to ``/health`` and new requests, in-flight ones go on)
    and shuts down after ``drain_seconds``; another signal ends the drain early."""

    def __init__(self, config: uvicorn.Config, state: Any) -> None:
        super().__init__(config)
        self.state = state

    def handle_exit(self, sig: int, frame: Any) -> None:
        drain = self.state.config.drain_seconds
        if drain > 0 and not self.state.draining and not self.should_exit:
            self.state.draining = True
            threading.Thread(target=self._drain, args=(drain,), daemon=True).start()
            return
        super().handle_exit(sig, frame)

    def _drain(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end and not self.should_exit:
            time.sleep(0.05)
        self.should_exit = True


def serve(state: Any, *, sock: socket.socket | None = None, log_level: str = "warning",
          access_log: bool = False, on_ready: Any = None) -> None:  # fmt: skip
    """Serve ``state`` (a :class:`ServerState`, or a :class:`~.router.Router` of several
    models) until SIGTERM/SIGINT (or ``server.should_exit``); returns normally."""
    cfg = state.config
    accesslog.configure(access_log)
    limits = Limits(timeout_headers=cfg.timeout_headers, timeout_body=cfg.timeout_body,
                    max_connections=cfg.max_connections)  # fmt: skip
    from .router import Router, create_router_app

    app = create_router_app(state) if isinstance(state, Router) else create_app(state)
    config = uvicorn.Config(
        app,
        host=cfg.host,
        port=cfg.port,
        log_level=log_level,
        access_log=False,  # llamacpy.access logs instead (no query strings)
        timeout_graceful_shutdown=cfg.shutdown_timeout,
        lifespan="on",
        http=protocol_class(limits),
        h11_max_incomplete_event_size=limits.max_head,
    )
    server = _Server(config, state)
    if on_ready is not None:
        on_ready(server)
    # uvicorn re-raises the signal it caught once it has shut down; a no-op handler makes
    # that a clean exit (status 0) instead of death by SIGTERM
    previous = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            previous[sig] = signal.signal(sig, lambda *_: None)
        except ValueError:  # not the main thread: uvicorn does not handle signals there
            break
    try:
        server.run(sockets=[sock] if sock is not None else None)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if not server.started and getattr(state, "load_error", None) is None:
        print("llamacpy serve: the server did not start", file=sys.stderr)
