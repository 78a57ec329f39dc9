"""The server's connection layer against hostile clients (no model needed: a stub
tokenizer serves ``/tokenize``): slow-loris heads and bodies are answered 408 and closed
while normal requests are still served, open connections are bounded (503), oversized
request lines and heads are 414/431 JSON errors instead of a reset, a body over the limit
is 413 while the client is still sending, and a client gone while its body is read leaves
no traceback.

Timeouts are short (1 s) to keep the tests quick; socket timeouts are only hang guards.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import time
from collections.abc import Iterator
from types import SimpleNamespace

import httpx
import pytest

from llamacpy.server import ServerConfig, ServerState
from test_server import running

GUARD = 30.0  # seconds: only against a hang, never a measured figure
MAX_CONNECTIONS = 40
MAX_BODY = 4096


class _Tokenizer:
    n_vocab = 100

    def encode(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        return [len(text)]


class _Embedder:
    def tokenizer(self) -> _Tokenizer:
        return _Tokenizer()


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    cfg = ServerConfig(max_body=MAX_BODY, timeout_headers=1.0, timeout_body=1.0,
                       max_connections=MAX_CONNECTIONS)  # fmt: skip
    with running(ServerState(cfg, embedder=_Embedder(), model_name="stub")) as url:
        yield url


def _port(base: str) -> int:
    return int(base.rsplit(":", 1)[1])


def _connect(base: str) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", _port(base)), timeout=GUARD)
    return s


def _answer(s: socket.socket) -> tuple[int, bytes]:
    """Read a whole answer up to the server's close: (status, body)."""
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def _json_error(body: bytes, status: int) -> str:
    err = json.loads(body)["error"]
    assert err["code"] == status
    return err["message"]


def _tokenize(base: str) -> httpx.Response:
    return httpx.post(base + "/tokenize", json={"content": "abc"}, timeout=GUARD)


def _wait_served(base: str) -> None:
    """Until a fresh connection is served (earlier connections have been closed)."""
    end = time.monotonic() + GUARD
    while _tokenize(base).status_code != 200:
        assert time.monotonic() < end
        time.sleep(0.1)


def test_slow_heads_and_bodies_are_408_and_closed_while_others_are_served(base):
    heads = [_connect(base) for _ in range(20)]
    for s in heads:
        s.sendall(b"POST /tokenize HT")  # half a request line
    bodies = [_connect(base) for _ in range(10)]
    for s in bodies:
        s.sendall(b"POST /tokenize HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 1000\r\n\r\n0123456789")  # fmt: skip
    r = _tokenize(base)  # served while the 30 slow connections are open
    assert r.status_code == 200 and r.json() == {"tokens": [3]}
    for s in heads + bodies:
        status, body = _answer(s)  # the server closes them: recv reaches EOF
        assert status == 408
        assert "did not arrive within 1 seconds" in _json_error(body, 408)
        s.close()
    assert _tokenize(base).status_code == 200


def test_open_connections_are_bounded(base):
    _wait_served(base)
    idle = [_connect(base) for _ in range(MAX_CONNECTIONS)]
    try:
        extra = _connect(base)
        status, body = _answer(extra)
        assert status == 503
        assert "too many open connections" in _json_error(body, 503)
        extra.close()
    finally:
        for s in idle:
            s.close()
    _wait_served(base)


def _send_all(s: socket.socket, data: bytes, piece: int = 4096) -> None:
    for i in range(0, len(data), piece):
        s.sendall(data[i : i + piece])


@pytest.mark.parametrize("request_bytes, status", [
    (b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: localhost\r\n\r\n", 414),
    (b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"a" * 1_000_000 + b"\r\n\r\n", 431),
    (b"GET /health HTTP/1.1\r\nHost: localhost\r\n" + b"X-H: v\r\n" * 5000 + b"\r\n", 431),
    (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 500, 400),  # TLS hello
])  # fmt: skip
def test_oversized_or_malformed_requests_are_json_errors_not_resets(base, request_bytes, status):
    s = _connect(base)
    _send_all(s, request_bytes)  # no reset while the client is still sending
    got, body = _answer(s)
    s.close()
    assert got == status
    _json_error(body, status)
    assert _tokenize(base).status_code == 200


@pytest.mark.parametrize("chunked", [False, True])
def test_body_over_the_limit_is_413_while_the_client_still_sends(base, chunked):
    body = b"x" * (MAX_BODY * 200)
    if chunked:
        head = b"Transfer-Encoding: chunked\r\n\r\n"
        data = b"".join(b"%x\r\n%s\r\n" % (4096, body[i : i + 4096])
                        for i in range(0, len(body), 4096)) + b"0\r\n\r\n"  # fmt: skip
    else:
        head, data = b"Content-Length: %d\r\n\r\n" % len(body), body
    s = _connect(base)
    s.sendall(
        b"POST /tokenize HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n" + head
    )
    _send_all(s, data)
    s.shutdown(socket.SHUT_WR)
    status, answer = _answer(s)
    s.close()
    assert status == 413
    assert "larger than 4096 bytes" in _json_error(answer, 413)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def _recording(*names: str) -> Iterator[SimpleNamespace]:
    h = _Records()
    loggers = [logging.getLogger(n) for n in names]
    for lg in loggers:
        lg.addHandler(h)
    try:
        yield SimpleNamespace(handler=h)
    finally:
        for lg in loggers:
            lg.removeHandler(h)


def _access_lines(rec: SimpleNamespace) -> list[str]:
    return [r.getMessage() for r in rec.handler.records if r.name == "llamacpy.access"]


@pytest.fixture
def access_log() -> Iterator[SimpleNamespace]:
    lg = logging.getLogger("llamacpy.access")
    level = lg.level
    lg.setLevel(logging.INFO)
    with _recording("llamacpy.access", "uvicorn.error", "uvicorn") as rec:
        yield rec
    lg.setLevel(level)


def test_one_access_line_per_request_without_key_query_or_body(base, access_log):
    r = httpx.post(base + "/tokenize?token=QUERY-SECRET", json={"content": "PROMPT-SECRET"},
                   headers={"Authorization": "Bearer KEY-SECRET"}, timeout=GUARD)  # fmt: skip
    assert r.status_code == 200
    assert httpx.get(base + "/nowhere", timeout=GUARD).status_code == 404
    lines = _access_lines(access_log)
    assert len(lines) == 2, lines
    assert '"POST /tokenize" 200 ' in lines[0] and '"GET /nowhere" 404 ' in lines[1]
    assert not any("SECRET" in ln for ln in lines)


def test_client_gone_while_its_body_is_read_is_one_line_without_traceback(base, access_log):
    s = _connect(base)
    s.sendall(b"POST /tokenize HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
              b"Content-Length: 1000\r\n\r\n{\"content\": ")  # fmt: skip
    time.sleep(0.2)  # the server is reading the body
    s.close()
    _wait_served(base)
    end = time.monotonic() + GUARD
    while not any("client disconnected" in ln for ln in _access_lines(access_log)):
        assert time.monotonic() < end, _access_lines(access_log)
        time.sleep(0.05)
    records = access_log.handler.records
    assert not [r for r in records if r.exc_info], [r.getMessage() for r in records]
    gone = [ln for ln in _access_lines(access_log) if "client disconnected" in ln]
    assert len(gone) == 1 and '"POST /tokenize" 499 ' in gone[0], gone


# --------------------------------------------------------------------------- browsers
@pytest.mark.parametrize("content_type, status", [
    ("text/plain", 415),  # what a foreign page may POST without a preflight
    ("application/x-www-form-urlencoded", 415),
    ("multipart/form-data; boundary=x", 415),
    (None, 415),  # fetch() with a Blob body sends none
    ("application/json; charset=utf-8", 200),
    ("application/vnd.api+json", 200),
])  # fmt: skip
def test_json_routes_refuse_other_content_types(base, content_type, status):
    headers = {"Content-Type": content_type} if content_type else {}
    r = httpx.post(base + "/tokenize", content=b'{"content": "abc"}', headers=headers,
                   timeout=GUARD)  # fmt: skip
    assert r.status_code == status, r.text
    if status == 415:
        assert "application/json" in _json_error(r.content, 415)


@pytest.mark.parametrize("host, status", [
    ("evil.example:{port}", 403),  # a rebound name: 127.0.0.1 behind a foreign page
    ("evil.example", 403),
    ("127.0.0.1.evil.example:{port}", 403),
    ("localhost:{port}", 200),
    ("127.0.0.1:{port}", 200),
    ("[::1]:{port}", 200),
])  # fmt: skip
def test_loopback_server_answers_loopback_host_names_only(base, host, status):
    r = httpx.get(base + "/health", headers={"Host": host.format(port=_port(base))},
                  timeout=GUARD)  # fmt: skip
    assert r.status_code == status, r.text
    if status == 403:
        assert "--allowed-hosts" in _json_error(r.content, 403)


def test_allowed_hosts_default_and_configured():
    from llamacpy.server.app import allowed_hosts, host_name

    assert allowed_hosts(ServerConfig()) == {"localhost", "127.0.0.1", "::1"}
    assert allowed_hosts(ServerConfig(host="0.0.0.0")) == {"*"}
    assert allowed_hosts(ServerConfig(allowed_hosts=("My.Host",))) == {"my.host"}
    assert [host_name(h) for h in ("a.b:80", "[::1]:8080", "::1", "x")] == [
        "a.b",
        "::1",
        "::1",
        "x",
    ]
