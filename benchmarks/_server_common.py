"""Shared pieces of the server benchmarks (imported as a sibling module when a script in
``benchmarks/`` runs): the prompts they send, a free loopback port, waiting for a server to
answer ``/health`` and its process's anonymous memory."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time

import httpx

PROMPTS = [
    "The capital of France is",
    "Once upon a time, there was a",
    "def fibonacci(n):",
    "List three colors:",
    "Water boils at",
    "The best way to learn a language is",
    "In 1969, the first humans",
    "A haiku about autumn:",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(proc: subprocess.Popen, base: str, timeout: float = 180.0) -> bool:
    """Until ``base/health`` answers 200; False when the process ends or time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return True
        if proc.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.2)


def rss_anon_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    raise RuntimeError("no RssAnon in /proc status")
