#!/usr/bin/env python
"""Record ``llama-perplexity`` over ``tests/fixtures/generation/prose.txt`` with every KV-cache
type llama.cpp allows (dev-only; needs the llama.cpp oracle) for
``tests/test_kv_cache_types.py``: the final perplexity and the ``llama_kv_cache`` size line
of each (K type, V type) case, ``-c 256 --chunks 4 -b 256 -fa on``, both real models.

    .venv/bin/python scripts/make_kv_cache_type_fixtures.py [--bin DIR]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

from llamacpy.fileio import atomic_write

ROOT = Path(__file__).resolve().parent.parent
TEXT = ROOT / "tests" / "fixtures" / "generation" / "prose.txt"
OUT = ROOT / "tests" / "fixtures" / "generation" / "kv_cache_types.json"
DEFAULT_BIN = "/root/oracle/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin"
TYPES = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"]
CASES = [("smollm2-135m", t, t) for t in TYPES] + [
    ("smollm2-135m", "q4_0", "f16"),
    ("smollm2-135m", "f16", "q5_1"),
    ("smollm2-135m", "q8_0", "iq4_nl"),
    ("gemma3-270m", "q4_0", "q4_0"),
    ("gemma3-270m", "q5_1", "iq4_nl"),
    ("gemma3-270m", "bf16", "bf16"),
    ("gemma3-270m", "q4_1", "q8_0"),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=DEFAULT_BIN)
    args = ap.parse_args()
    from llamacpy.registry import resolve_model

    rows = []
    for model, tk, tv in CASES:
        r = subprocess.run([f"{args.bin}/llama-perplexity", "-m", str(resolve_model(model)),
                            "-f", str(TEXT), "-c", "256", "--chunks", "4", "-b", "256",
                            "-t", "2", "-fa", "on", "-ctk", tk, "-ctv", tv, "-v"],
                           capture_output=True, text=True, check=True)  # fmt: skip
        log = r.stdout + r.stderr
        ppl = float(re.search(r"Final estimate: PPL = (\d+\.\d+)", log)[1])
        kv = sorted({m[1] for m in re.finditer(r"(llama_kv_cache: size = .*)", log)})
        rows.append({"model": model, "type_k": tk, "type_v": tv, "ppl": ppl, "kv": kv})
        print(model, tk, tv, ppl, kv)
    data = {"file": TEXT.name, "n_ctx": 256, "chunks": 4, "n_batch": 256, "cases": rows}
    with atomic_write(OUT) as f:
        f.write((json.dumps(data, indent=1) + "\n").encode())
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
