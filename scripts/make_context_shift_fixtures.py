#!/usr/bin/env python
"""Record ``llama-completion --context-shift`` runs that go past the context (dev-only; needs
the llama.cpp oracle) for ``tests/test_cli_run.py``: greedy, ``-c 256`` (llama.cpp pads a
context to a multiple of 256, so a smaller one would not fill), 300 tokens after the prompt
(two shifts or more), several ``--keep`` values, both real models.

    .venv/bin/python scripts/make_context_shift_fixtures.py [--bin DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from llamacpy.fileio import atomic_write

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "generation" / "context_shift.json"
DEFAULT_BIN = "/root/oracle/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin"
PROMPT = "Once upon a time, in a small village by the sea, there lived an old fisherman who"
N_CTX, N_PREDICT = 256, 300
CASES = [("smollm2-135m", 0), ("smollm2-135m", 5), ("smollm2-135m", -1), ("gemma3-270m", 3)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=DEFAULT_BIN)
    args = ap.parse_args()
    from llamacpy.registry import resolve_model

    rows = []
    for model, keep in CASES:
        r = subprocess.run([f"{args.bin}/llama-completion", "-m", str(resolve_model(model)),
                            "-c", str(N_CTX), "-n", str(N_PREDICT), "-t", "1", "--temp", "0",
                            "--context-shift", "--keep", str(keep), "-p", PROMPT,
                            "--no-display-prompt", "-no-cnv", "--no-warmup", "--ignore-eos"],
                           capture_output=True, text=True, check=True)  # fmt: skip
        text = r.stdout.removesuffix("\n\n")  # the tool's own ending
        rows.append({"model": model, "keep": keep, "text": text})
        print(model, keep, repr(text[-60:]))
    data = {"prompt": PROMPT, "n_ctx": N_CTX, "n_predict": N_PREDICT, "cases": rows}
    with atomic_write(OUT) as f:
        f.write((json.dumps(data, indent=1, ensure_ascii=False) + "\n").encode())
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
