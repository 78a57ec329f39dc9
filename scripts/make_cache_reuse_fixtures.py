#!/usr/bin/env python
"""llama-server's ``--cache-reuse`` on SmolLM2 (the oracle; dev-only).

    .venv/bin/python scripts/make_cache_reuse_fixtures.py [--bin DIR]

Writes ``tests/fixtures/server/cache_reuse.json``: for each case, a first prompt and a
second one that repeats chunks of it after a different start (``--cache-reuse 8``, one
slot, greedy): the second request's ``timings.cache_n`` and ``prompt_n`` and its text.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from llamacpy.registry import ModelRegistry  # noqa: E402

OUT = ROOT / "tests" / "fixtures" / "server" / "cache_reuse.json"
BIN = "/root/oracle/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin"
N_REUSE = 8
D1 = "The river Seine flows through Paris and empties into the English Channel at Le Havre. " * 3
D2 = ("Mount Everest is the highest mountain above sea level, located in the Himalayas on the "
      "border of Nepal and China. ") * 3  # fmt: skip
D3 = "The Pacific Ocean is the largest and deepest of Earth's five oceanic divisions. " * 3
CASES = [  # (first prompt, second prompt)
    (
        "Document A: " + D1 + "\nDocument B: " + D2 + "\nSummary:",
        "Document B: " + D2 + "\nSummary:",
    ),
    (
        "Notes: " + D1 + D2 + "\nQ: what is tallest?\nA:",
        "Notes: " + D2 + "\nQ: what is tallest?\nA:",
    ),
    (
        "Notes: " + D1 + D2 + "\nQ: what is tallest?\nA:",
        "Notes: " + D3 + D2 + "\nQ: what is tallest?\nA:",
    ),
    ("Intro. " + D2 + D3 + " End.", "Intro. " + D1 + D2 + D3 + " End."),
    ("A: " + D1 + "B: " + D2 + "C: " + D3, "A: " + D1 + "C: " + D3),
]


def post(port: int, body: dict) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=BIN, help="llama.cpp's build/bin")
    args = ap.parse_args()
    model = ModelRegistry.from_environment().pull("smollm2-135m", quiet=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [f"{args.bin}/llama-server", "-m", str(model), "--port", str(port), "-t", "2", "-c",
         "2048", "-np", "1", "--cache-reuse", str(N_REUSE), "--no-webui"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
                break
            except OSError:
                time.sleep(0.2)
        cases = []
        for first, second in CASES:
            post(port, {"prompt": first, "n_predict": 8, "temperature": 0})
            r = post(port, {"prompt": second, "n_predict": 24, "temperature": 0})
            cases.append({"first": first, "second": second, "cache_n": r["timings"]["cache_n"],
                          "prompt_n": r["timings"]["prompt_n"], "content": r["content"]})  # fmt: skip
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"n_cache_reuse": N_REUSE, "cases": cases}, indent=1) + "\n")
    print(f"wrote {OUT}: {[(c['cache_n'], c['prompt_n']) for c in cases]}")


if __name__ == "__main__":
    main()
