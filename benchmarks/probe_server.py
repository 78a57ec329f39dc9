"""Hostile probe of ``llamacpy serve``, on loopback only and bounded in time: hostile bodies
on every POST route, slow and oversized requests, clients that disconnect, overflow (429)
and the server's memory over 1,000 requests.

Starts its own server (``-np 2 --max-queue 2``, short read timeouts) on a free 127.0.0.1
port and prints one row per input: the statuses it got (with counts), whether every error
was a JSON error, whether ``/health`` answered 200 afterwards, and the server's RssAnon.
Exits 1 if any answer was a 500 or none (a reset), an error was not JSON, or the server was
not healthy afterwards.

    python benchmarks/probe_server.py [-m smollm2-135m] [--requests 1000]
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx

from _server_common import free_port, rss_anon_kib, wait_healthy

ROUTES = ["/completion", "/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize",
          "/apply-template", "/embedding", "/v1/embeddings"]  # fmt: skip
MAX_BODY = 64 * 1024
JSON_TYPE = {"Content-Type": "application/json"}
MSG = [{"role": "user", "content": "hi"}]


def _all(**fields: object) -> bytes:
    """One body that feeds the same hostile value to every route's fields."""
    base: dict = {"prompt": "hi", "messages": MSG, "content": "hi", "input": "hi",
                  "tokens": [1], "n_predict": 2, "max_tokens": 2}  # fmt: skip
    return json.dumps({**base, **fields}).encode()


BODIES: list[tuple[str, bytes, dict[str, str]]] = [
    ("malformed JSON", b'{"prompt": "x", ', JSON_TYPE),
    ("not an object", b'["prompt"]', JSON_TYPE),
    ("deep nesting", b'{"a": ' + b"[" * 5000 + b"]" * 5000 + b"}", JSON_TYPE),
    ("NaN", b'{"prompt": "x", "messages": [], "temperature": NaN}', JSON_TYPE),
    ("wrong types", _all(prompt=5, messages=5, content=5, input=5, tokens="x"), JSON_TYPE),
    ("huge numbers", _all(n_predict=10**30, max_tokens=10**30, tokens=[10**30]), JSON_TYPE),
    (
        "lone surrogate",
        _all(
            prompt="a\ud800",
            content="a\ud800",
            input="\udc00",
            messages=[{"role": "user", "content": "\ud800"}],
        ),
        JSON_TYPE,
    ),
    ("invalid UTF-8", b'{"prompt": "\xff\xfe", "content": "\xff", "messages": []}', JSON_TYPE),
    ("logit_bias false", _all(logit_bias=[[905, False]]), JSON_TYPE),
    ("logit_bias text", _all(logit_bias=[["Hello", -100]]), JSON_TYPE),
    ("10k stop strings", _all(stop=["x"] * 10_000), JSON_TYPE),
    ("text/plain body", _all(), {"Content-Type": "text/plain"}),
    ("over --max-body", b'{"prompt": "' + b"x" * MAX_BODY + b'"}', JSON_TYPE),
]


@dataclass
class Row:
    name: str
    statuses: Counter = field(default_factory=Counter)
    json_errors: bool = True
    healthy: bool = False
    rss_mib: float = 0.0


class Probe:
    def __init__(self, base: str, pid: int) -> None:
        self.base, self.pid = base, pid
        self.http = httpx.Client(base_url=base, timeout=60)
        self.rows: list[Row] = []

    def record(self, row: Row) -> Row:
        try:
            row.healthy = self.http.get("/health", timeout=30).status_code == 200
        except httpx.HTTPError:
            row.healthy = False
        row.rss_mib = rss_anon_kib(self.pid) / 1024
        self.rows.append(row)
        return row

    def answer(self, row: Row, r: httpx.Response) -> None:
        row.statuses[r.status_code] += 1
        if r.status_code >= 400:
            try:
                row.json_errors &= isinstance(r.json()["error"]["message"], str)
            except (ValueError, KeyError, TypeError):
                row.json_errors = False

    def raw(self, data: bytes, wait: float = 30.0) -> int:
        """Send raw bytes; the status of the answer (0: reset or none)."""
        port = int(self.base.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=wait) as s:
            try:
                for i in range(0, len(data), 8192):
                    s.sendall(data[i : i + 8192])
                head = s.recv(64)
            except OSError:
                return 0
        return int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/") else 0


def hostile_bodies(p: Probe) -> None:
    for name, body, headers in BODIES:
        row = Row(f"{name} x {len(ROUTES)} routes")
        for route in ROUTES:
            p.answer(row, p.http.post(route, content=body, headers=headers))
        p.record(row)


def slow_connections(p: Probe) -> None:
    port = int(p.base.rsplit(":", 1)[1])
    heads = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(20)]
    for s in heads:
        s.sendall(b"POST /completion HT")
    bodies = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(10)]
    for s in bodies:
        s.sendall(b"POST /completion HTTP/1.1\r\nHost: localhost\r\nContent-Type: "
                  b"application/json\r\nContent-Length: 1000\r\n\r\n0123456789")  # fmt: skip
    during = Row("a normal request during 30 slow ones")
    p.answer(during, p.http.post("/tokenize", json={"content": "hi"}))
    row = Row("20 half heads + 10 bodies at 10/1000 bytes")
    for s in heads + bodies:
        try:
            head = s.recv(64)
            row.statuses[int(head.split(b" ", 2)[1]) if head else 0] += 1
        except OSError:
            row.statuses[0] += 1
        s.close()
    p.record(during)
    p.record(row)


def oversized(p: Probe) -> None:
    cases = [
        ("URL of 100 KB", b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: localhost\r\n\r\n"),
        ("header of 1 MB", b"GET /health HTTP/1.1\r\nHost: localhost\r\nX: " + b"a" * (1 << 20)
         + b"\r\n\r\n"),
        ("not HTTP (TLS hello)", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\0" * 500),
        ("foreign Host header", b"GET /health HTTP/1.1\r\nHost: evil.example\r\n\r\n"),
    ]  # fmt: skip
    for name, data in cases:
        row = Row(name)
        row.statuses[p.raw(data)] += 1
        p.record(row)
    row = Row("GET /metrics without --metrics")
    p.answer(row, p.http.get("/metrics"))
    p.record(row)


def disconnects(p: Probe) -> None:
    port = int(p.base.rsplit(":", 1)[1])
    row = Row("client gone mid-body, mid-wait, mid-stream")
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(b"POST /completion HTTP/1.1\r\nHost: localhost\r\nContent-Type: "
                  b"application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\": ")  # fmt: skip
    long = {"prompt": "Write a long story.", "n_predict": 400, "ignore_eos": True}
    try:
        p.http.post("/completion", json=long, timeout=0.5)
    except httpx.TimeoutException:
        pass
    with p.http.stream("POST", "/completion", json={**long, "stream": True}) as r:
        next(r.iter_lines())
    end = time.monotonic() + 30
    while any(s["is_processing"] for s in p.http.get("/slots").json()):
        if time.monotonic() > end:
            row.statuses["slots still busy"] += 1
            break
        time.sleep(0.1)
    else:
        row.statuses["slots idle"] += 1
    p.record(row)


def overflow(p: Probe) -> None:
    """10 long requests at once against 2 slots + 2 queue places: 6 are 429."""
    row = Row("10 at once, 2 slots + queue of 2")
    body = {"prompt": "Count to a hundred:", "n_predict": 32, "ignore_eos": True}
    with ThreadPoolExecutor(10) as ex:
        for r in ex.map(lambda _: p.http.post("/completion", json=body), range(10)):
            p.answer(row, r)
    p.record(row)


def many_requests(p: Probe, n: int) -> None:
    before = rss_anon_kib(p.pid) / 1024
    row = Row(f"{n} requests (n_predict 4), RSS from {before:.1f} MiB")
    for i in range(n):
        r = p.http.post("/completion", json={"prompt": f"Item {i}:", "n_predict": 4})
        p.answer(row, r)
    p.record(row)


def table(rows: list[Row]) -> str:
    out = ["| input | statuses | JSON errors | healthy after | RssAnon MiB |",
           "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for r in rows:
        st = ", ".join(f"{k} x{v}" for k, v in sorted(r.statuses.items(), key=str))
        out.append(f"| {r.name} | {st} | {'yes' if r.json_errors else 'NO'} | "
                   f"{'yes' if r.healthy else 'NO'} | {r.rss_mib:.1f} |")  # fmt: skip
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("--requests", type=int, default=1000, help="requests of the memory row")
    args = ap.parse_args()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "llamacpy", "serve", "-m", args.model, "--port", str(port),
           "-np", "2", "-c", "1024", "-t", str(args.threads), "--max-queue", "2",
           "--max-body", str(MAX_BODY), "--timeout-headers", "2", "--timeout-body", "2",
           "--log-disable"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        if not wait_healthy(proc, base):
            print("the server did not come up", file=sys.stderr)
            return 1
        p = Probe(base, proc.pid)
        p.record(Row("(started)"))
        for step in (hostile_bodies, slow_connections, oversized, disconnects, overflow):
            step(p)
        many_requests(p, args.requests)
    finally:
        proc.terminate()
        proc.wait(30)
    print(table(p.rows))
    # a failure: a 500 (or a gateway-like 5xx), no answer (0, a reset), an error that is not
    # JSON, or /health not 200 afterwards; 501 (no embeddings here) and 503 are answers
    bad = [r.name for r in p.rows if not (r.healthy and r.json_errors)
           or any(s in (0, 500, 502, 504) for s in r.statuses)]  # fmt: skip
    print(f"\nrows failing: {bad or 'none'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
