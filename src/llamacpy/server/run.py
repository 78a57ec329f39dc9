"""Running the application with uvicorn: graceful SIGTERM/SIGINT (stop accepting, let
in-flight requests finish for ``shutdown_timeout`` seconds, cancel the rest, exit 0)."""

from __future__ import annotations

import signal
import socket
import sys
from typing import Any

import uvicorn

from . import accesslog
from .app import ServerState, create_app
from .transport import Limits, protocol_class


def serve(state: ServerState, *, sock: socket.socket | None = None, log_level: str = "warning",
          access_log: bool = False, on_ready: Any = None) -> None:  # fmt: skip
    """Serve ``state`` until SIGTERM/SIGINT (or ``server.should_exit``); returns normally."""
    cfg = state.config
    accesslog.configure(access_log)
    limits = Limits(timeout_headers=cfg.timeout_headers, timeout_body=cfg.timeout_body,
                    max_connections=cfg.max_connections)  # fmt: skip
    config = uvicorn.Config(
        create_app(state),
        host=cfg.host,
        port=cfg.port,
        log_level=log_level,
        access_log=False,  # llamacpy.access logs instead (no query strings)
        timeout_graceful_shutdown=cfg.shutdown_timeout,
        lifespan="on",
        http=protocol_class(limits),
        h11_max_incomplete_event_size=limits.max_head,
    )
    server = uvicorn.Server(config)
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
    if not server.started and state.load_error is None:
        print("llamacpy serve: the server did not start", file=sys.stderr)
