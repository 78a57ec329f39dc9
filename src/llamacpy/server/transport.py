"""The HTTP/1.1 connection layer under the application: uvicorn's h11 protocol with the
bounds a public server needs.

- a request head (request line and headers) must arrive within ``timeout_headers`` seconds
  of the connection opening or of the previous response (slow-loris), a body within
  ``timeout_body`` seconds of its head; then 408 and the connection is closed;
- at most ``max_connections`` open connections; one more is answered 503 and closed;
- a request line over ``max_line`` bytes is 414, a head over ``max_head`` bytes 431, other
  malformed requests 400, each a JSON error instead of uvicorn's plain text or a reset.

Every error answer closes "lingering" (as Apache and nginx): the write side is shut and
what the client still sends is read and dropped for a few seconds, so that the client
reads the answer instead of a TCP reset.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .errors import APIError

log = logging.getLogger("llamacpy.server")

LINGER_SECONDS = 2.0


@dataclass(frozen=True)
class Limits:
    timeout_headers: float = 10.0
    timeout_body: float = 30.0
    max_connections: int = 100
    max_line: int = 8 << 10
    max_head: int = 16 << 10


def error_bytes(status: int, message: str) -> bytes:
    """A whole HTTP/1.1 response (JSON error, ``Connection: close``) as bytes."""
    err = APIError(status, message)
    body = json.dumps(err.body()).encode()
    reason = HTTPStatus(status).phrase
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")  # fmt: skip
    return head.encode() + body


class BoundedH11Protocol(H11Protocol):
    """:class:`H11Protocol` with :class:`Limits` (a subclass per limits, see
    :func:`protocol_class`)."""

    limits = Limits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._phase = ""  # "head" or "body" while a deadline runs
        self._closing = False

    # ------------------------------------------------------------------ connection
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            self._refuse(503, f"too many open connections (at most "
                              f"{self.limits.max_connections}); retry later")  # fmt: skip
            return
        self._arm("head")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return  # lingering: drop what the client still sends
        if self._phase == "head":
            refusal = self._oversized(self.conn.trailing_data[0] + data[: self.limits.max_head + 4])
            if refusal is not None:
                self._refuse(*refusal)
                return
        super().data_received(data)
        self._follow()

    def _oversized(self, head: bytes) -> tuple[int, str] | None:
        """414 or 431 when the start of a request is already too long (h11 checks only
        what arrives in pieces)."""
        lim = self.limits
        eol = head.find(b"\n")
        if eol > lim.max_line or (eol < 0 and len(head) > lim.max_line):
            return 414, f"the request line is longer than {lim.max_line} bytes"
        ends = [i for i in (head.find(b"\n\r\n"), head.find(b"\n\n")) if i >= 0]
        end = min(ends) if ends else -1
        if end > lim.max_head or (end < 0 and len(head) > lim.max_head):
            return 431, f"the request head is larger than {lim.max_head} bytes"
        return None

    def _follow(self) -> None:
        """Move the deadline along with the request: head, then body, then none."""
        if self._closing or self.transport.is_closing():
            return
        state = self.conn.their_state
        if state is h11.SEND_BODY and self._phase == "head":
            self._arm("body")
        elif state in (h11.DONE, h11.MUST_CLOSE) and self._phase:
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is not h11.SEND_BODY:
            self._arm("head")

    # ------------------------------------------------------------------ deadlines
    def _arm(self, phase: str) -> None:
        self._disarm()
        seconds = self.limits.timeout_headers if phase == "head" else self.limits.timeout_body
        self._phase = phase
        self._deadline = self.loop.call_later(seconds, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = None
        self._phase = ""

    def _expired(self) -> None:
        phase, self._deadline = self._phase, None
        if self.transport.is_closing() or self._closing:
            return
        if phase == "head" and self.conn.their_state is h11.IDLE and not self.conn.trailing_data[0]:
            self.transport.close()  # idle between requests: close quietly
            return
        what = "request head" if phase == "head" else "request body"
        seconds = self.limits.timeout_headers if phase == "head" else self.limits.timeout_body
        started = self.cycle is not None and self.cycle.response_started
        if self.cycle is not None:  # the application sees a disconnect
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        if started:
            self.transport.close()
        else:
            self._refuse(408, f"the {what} did not arrive within {seconds:g} seconds")

    # ------------------------------------------------------------------ errors
    def send_400_response(self, msg: str) -> None:
        """h11 refused the request: 431 for a head over the limit, else 400 (JSON)."""
        pending = self.conn.trailing_data[0]
        if len(pending) > self.limits.max_head:
            self._refuse(431, f"the request head is larger than {self.limits.max_head} bytes")
        else:
            self._refuse(400, "invalid HTTP request")

    def _refuse(self, status: int, message: str) -> None:
        """Answer ``status`` and close lingering."""
        who = self.client[0] if self.client else "-"
        log.warning("%s: answered %d and closed the connection: %s", who, status, message)
        self._disarm()
        self._closing = True
        if self.cycle is not None:
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        self.transport.write(error_bytes(status, message))
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.transport.resume_reading()
        self.loop.call_later(LINGER_SECONDS, self.transport.close)

    def eof_received(self) -> bool | None:
        if self._closing:
            self.transport.close()
        return None


def protocol_class(limits: Limits) -> type[BoundedH11Protocol]:
    """A :class:`BoundedH11Protocol` subclass bound to ``limits`` (uvicorn's ``http=``)."""
    return type("BoundedH11Protocol", (BoundedH11Protocol,), {"limits": limits})
