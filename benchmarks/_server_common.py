"""Shared pieces of the server benchmarks (imported as a sibling module when a script in
``benchmarks/`` runs): the prompts they send and a free loopback port."""

from __future__ import annotations

import socket

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
