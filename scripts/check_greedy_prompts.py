#!/usr/bin/env python
"""Greedy continuations of llamacpy against ``llama-completion`` on many varied prompts
(prose, code, lists, other languages, long prompts past Gemma-3's 512-token sliding window),
at the command line (``llamacpy run``) and through the server (``POST /completion``).

    .venv/bin/python scripts/check_greedy_prompts.py [--bin DIR] [--models smollm2-135m,gemma3-270m]
        [--n-predict 64] [--write-fixture]

``--write-fixture`` also writes llama.cpp's continuations of the first prompts to
``tests/fixtures/engine/greedy_prompts.json`` (the test suite's reduced check,
``tests/test_greedy_prompts.py``). Exit status 1 if any continuation differs.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from llamacpy.fileio import atomic_write

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "engine" / "greedy_prompts.json"
DEFAULT_BIN = "/root/oracle/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin"
N_FIXTURE = 12  # prompts per model kept for the test suite
GPL3 = Path("/usr/share/common-licenses/GPL-3")

PROMPTS = [
    "The following is a list of the largest cities in Europe by population:",
    "Once upon a time, in a small village at the edge of a forest,",
    "The three primary colors are",
    "def fibonacci(n):\n    ",
    "import numpy as np\n\n# compute the mean of each row of a matrix\n",
    "SELECT name, COUNT(*) FROM orders",
    "The capital of France is",
    "Here are five tips for staying healthy:\n1.",
    "La Tour Eiffel est situee a Paris. Elle a ete construite en",
    "Der schnellste Weg von Berlin nach Muenchen ist",
    "El agua hierve a cien grados",
    "東京は日本の首都で、",
    "Москва — столица России, и",
    "Q: What is 12 times 12?\nA:",
    "To bake bread, you need flour, water, yeast and",
    "<html>\n<head>\n<title>",
    "The mitochondria is the powerhouse of",
    "In 1969, the first humans landed on",
    "function add(a, b) {\n  return",
    "Dear Sir or Madam,\n\nI am writing to",
    "The theory of relativity was developed by",
    "Ingredients:\n- 2 eggs\n- 1 cup of milk\n-",
    "The quick brown fox",
    "Photosynthesis is the process by which",
    "#include <stdio.h>\n\nint main(void) {\n",
    "A haiku about autumn:\n",
    "Python is a programming language that",
    "The most important thing to remember when learning to drive is",
    "Chapter 1\n\nIt was a dark and stormy night",
    "Translate to French: Good morning, how are you?\nFrench:",
    "The largest planet in our solar system is",
    "1, 1, 2, 3, 5, 8, 13,",
    "Monday, Tuesday, Wednesday,",
    "The recipe for a perfect cup of tea:",
    "git commit -m",
    "Rust's ownership model guarantees",
    "The stock market fell sharply today after",
    "My favourite book is",
    "In machine learning, overfitting occurs when",
    "The Great Wall of China is",
    "Water is made of hydrogen and",
    "How to change a flat tire:\nStep 1:",
    "Il Colosseo di Roma e",
    "A Lisboa e a capital de",
    "class Stack:\n    def __init__(self):\n",
    "The sun rises in the east and",
    "Summary of the meeting:\n-",
    "The weather forecast for tomorrow is",
    "Shakespeare wrote many plays, including",
    "An apple a day",
]


def long_prompts() -> list[str]:
    """Prompts of ~700-900 tokens (past a 512-token sliding window)."""
    if not GPL3.is_file():
        return []
    text = GPL3.read_text()
    return [text[i : i + 3200] for i in (2000, 9000, 16000)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def llama_completion(bin_dir: str, model: str, prompt: str, n: int) -> str:
    r = subprocess.run([f"{bin_dir}/llama-completion", "-m", model, "-c", "2048", "-t", "2",
                        "-no-cnv", "--temp", "0", "-n", str(n), "-p", prompt, "--no-warmup"],
                       capture_output=True, text=True, errors="surrogateescape",
                       stdin=subprocess.DEVNULL)  # fmt: skip
    out = r.stdout
    # the prompt is echoed first; the tool ends with "\n\n" (" [end of text]\n" before it
    # at an end-of-generation token)
    out = out[len(prompt) :] if out.startswith(prompt) else out
    out = out.removesuffix("\n\n")
    out = out.removesuffix(" [end of text]\n").removesuffix(" [end of text]")
    # a character cut by the token limit: llama.cpp writes its first bytes, llamacpy (as text)
    # a replacement character; the tokens are the same
    return out.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def llamacpy_run(model: str, prompt: str, n: int) -> str:
    exe = ROOT / ".venv" / "bin" / "llamacpy"
    r = subprocess.run([str(exe), "run", "-m", model, "-c", "2048", "-t", "2", "--temp", "0",
                        "--no-display-prompt", "-n", str(n), "-p", prompt], capture_output=True,
                       text=True, errors="surrogateescape", stdin=subprocess.DEVNULL)  # fmt: skip
    return r.stdout.removesuffix("\n")  # the newline that ends the output


class Server:
    def __init__(self, model: str) -> None:
        self.port = free_port()
        exe = ROOT / ".venv" / "bin" / "llamacpy"
        self.proc = subprocess.Popen([str(exe), "serve", "-m", model, "-c", "2048", "-t", "2",
                                      "-np", "1", "--port", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        end = time.monotonic() + 300
        while time.monotonic() < end:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError("server did not start")

    def complete(self, prompt: str, n: int) -> str:
        # cache_prompt false: a reused prefix would leave the rest of the prompt to a smaller
        # batch, whose matmul numerics differ (as in llama-server against llama-completion)
        body = json.dumps({"prompt": prompt, "n_predict": n, "temperature": 0,
                           "cache_prompt": False}).encode()  # fmt: skip
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/completion", data=body,
                                     headers={"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(req, timeout=300) as r:
            return json.loads(r.read())["content"]

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.environ.get("LLAMA_CPP_BIN", DEFAULT_BIN))
    ap.add_argument("--models", default="smollm2-135m,gemma3-270m")
    ap.add_argument("--n-predict", type=int, default=64)
    ap.add_argument("--write-fixture", action="store_true")
    ap.add_argument("--fixture-only", action="store_true",
                    help="only the prompts the fixture keeps")  # fmt: skip
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    from llamacpy.registry import resolve_model

    prompts = PROMPTS + long_prompts()
    if args.fixture_only:
        prompts = PROMPTS[:N_FIXTURE] + long_prompts()[:1]
    fixture: dict = {"n_predict": args.n_predict, "models": {}}
    if args.write_fixture and FIXTURE.is_file():  # models not run this time are kept
        fixture["models"] = json.loads(FIXTURE.read_text())["models"]
    bad = 0
    for name in args.models.split(","):
        path = str(resolve_model(name))
        server = Server(path)
        same_cli = same_srv = 0
        rows = []
        try:
            for p in prompts:
                ref = llama_completion(args.bin, path, p, args.n_predict)
                cli = llamacpy_run(path, p, args.n_predict)
                srv = server.complete(p, args.n_predict)
                same_cli += cli == ref
                same_srv += srv == ref
                rows.append({"prompt": p, "text": ref})
                for what, ours in (("command line", cli), ("server", srv)):
                    if ours != ref:
                        at = next((i for i, (x, y) in enumerate(zip(ours, ref)) if x != y),
                                  min(len(ours), len(ref)))  # fmt: skip
                        print(f"  {name} {what} differs on {p[:40]!r} at character {at}: "
                              f"llama.cpp {ref[at:at + 40]!r}, llamacpy {ours[at:at + 40]!r}")  # fmt: skip
        finally:
            server.close()
        print(f"{name}: {len(prompts)} prompts, command line identical on {same_cli}, "
              f"server identical on {same_srv}")  # fmt: skip
        bad += 2 * len(prompts) - same_cli - same_srv
        n_short = min(N_FIXTURE, len(PROMPTS), len(rows))
        long_rows = [r for r in rows if r["prompt"] not in PROMPTS]
        fixture["models"][name] = rows[:n_short] + long_rows[:1]
    if args.write_fixture:
        with atomic_write(FIXTURE) as f:
            f.write((json.dumps(fixture, ensure_ascii=False, indent=1) + "\n").encode())
        print(f"wrote {FIXTURE}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
