"""Tokenization throughput: llamacpy vs llama.cpp's ``llama-tokenize``, side by side.

    python benchmarks/bench_tokenize.py [-m MODEL ...] [--file TEXT] [--llama-tokenize PATH]

The text defaults to 1 MB of English prose (Python's own documentation, shipped with every
CPython). llama-tokenize's time is its run on the file minus its run on a one-character
prompt (model loading), best of ``--repeat``; ours is ``Tokenizer.encode`` on a loaded
tokenizer, best of ``--repeat`` (first call excluded: it JIT-loads). Both produce the ids,
which are compared. Prints MB/s for both and the ratio (>1: llamacpy is faster).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def default_text(size: int = 1_000_000) -> str:
    from pydoc_data.topics import topics

    base = "\n\n".join(topics[k] for k in sorted(topics))
    text = base
    while len(text.encode()) < size:
        text += "\n\n" + base
    return text.encode()[:size].decode("utf-8", "ignore")


def find_llama_tokenize(arg: str | None) -> str | None:
    if arg:
        return arg
    env = os.environ.get("LLAMA_TOKENIZE")
    return env or shutil.which("llama-tokenize")


def time_llama(exe: str, model: Path, path: Path, repeat: int) -> tuple[float, list[int]]:
    def run(args: list[str]) -> tuple[float, str]:
        t0 = time.perf_counter()
        proc = subprocess.run(
            [exe, "-m", str(model), "--log-disable", "--ids", "--no-escape", *args],
            capture_output=True,
            text=True,
            check=True,
        )
        return time.perf_counter() - t0, proc.stdout

    base = min(run(["-p", "x"])[0] for _ in range(repeat))
    best = float("inf")
    out = ""
    for _ in range(repeat):
        t, out = run(["-f", str(path)])
        best = min(best, t)
    ids = [int(x) for x in out.strip().strip("[]").split(",") if x.strip()]
    return max(best - base, 1e-9), ids


def main(argv: list[str] | None = None) -> int:
    from llamacpy.registry import resolve_model
    from llamacpy.tokenizer import Tokenizer

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", action="append", help="model path or registry name")
    ap.add_argument("--file", type=Path, help="text to tokenize (default: 1 MB of prose)")
    ap.add_argument("--llama-tokenize", help="path of llama.cpp's llama-tokenize")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    models = args.model or ["smollm2-135m", "gemma3-270m"]
    text = args.file.read_text() if args.file else default_text()
    data = text.encode()
    exe = find_llama_tokenize(args.llama_tokenize)
    print(f"text: {len(data) / 1e6:.2f} MB")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "text.txt"
        path.write_bytes(data)
        for name in models:
            model = resolve_model(name)
            t0 = time.perf_counter()
            tok = Tokenizer.from_gguf(model)
            t_load = time.perf_counter() - t0
            add = tok.add_bos
            t0 = time.perf_counter()
            ids = tok.encode(data, add_special=add)
            t_first = time.perf_counter() - t0
            ours = float("inf")
            for _ in range(args.repeat):
                tok.model.cache.clear() if hasattr(tok.model, "cache") else None
                t0 = time.perf_counter()
                ids = tok.encode(data, add_special=add)
                ours = min(ours, time.perf_counter() - t0)
            mb = len(data) / 1e6
            line = (
                f"{name}: llamacpy {mb / ours:7.2f} MB/s ({ours:.3f} s; load {t_load:.2f} s, "
                f"first call {t_first:.2f} s)"
            )
            if exe:
                theirs, ref = time_llama(exe, model, path, args.repeat)
                same = "identical ids" if ref == ids else "IDS DIFFER"
                line += (
                    f" | llama-tokenize {mb / theirs:7.2f} MB/s ({theirs:.3f} s) | "
                    f"ratio {theirs / ours:.2f}x | {same} ({len(ids)} tokens)"
                )
            else:
                line += " | llama-tokenize not found (--llama-tokenize PATH)"
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
