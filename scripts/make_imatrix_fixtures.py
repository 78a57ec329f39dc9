#!/usr/bin/env python
"""Record ``llama-imatrix`` on both real models (dev-only; needs the llama.cpp oracle) for
``tests/test_imatrix_tool.py``: the final perplexity, every entry's count and the float64
total of its sums, the sums themselves (float32, base64) of the first and last layer, and
the ``--show-statistics`` report of the file.

    .venv/bin/python scripts/make_imatrix_fixtures.py [--bin DIR]

Cases: SmolLM2 over ``tests/fixtures/engine/text.txt`` with ``-c 128`` (20 chunks: a pass
of 16 sequences side by side, then one of 4, so both of llama.cpp's attention kernels run)
and Gemma-3 over ``gemma3_text.txt`` with ``-c 256 --chunks 4``; then tiny mixtures of
experts (qwen3moe, Mixtral) over ``text.txt``, every expert's sums and counts.
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from llamacpy.fileio import atomic_write
from llamacpy.quantize.imatrix import load_imatrix_raw

ROOT = Path(__file__).resolve().parent.parent
ENGINE = ROOT / "tests" / "fixtures" / "engine"
OUT = ROOT / "tests" / "fixtures" / "quantize" / "imatrix_tool.json"
DEFAULT_BIN = "/root/oracle/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin"
CASES = [
    {"model": "smollm2-135m", "text": "text.txt", "args": ["-c", "128"], "layers": [0, 29]},
    {"model": "gemma3-270m", "text": "gemma3_text.txt", "args": ["-c", "256", "--chunks", "4"],
     "layers": [0]},
]  # fmt: skip


# tiny mixtures of experts (models.tiny, Q8_0, seed 5), every sum recorded
TINY = {"qwen3moe": ("qwen3moe", {}), "mixtral": ("llama", {"n_expert": 4})}
TINY_ARGS = ["-c", "64", "--chunks", "8"]


def tiny_model(name: str, path: Path) -> Path:
    from llamacpy.gguf import GGMLType
    from llamacpy.models.tiny import write_tiny_llama

    arch, opts = TINY[name]
    write_tiny_llama(path, GGMLType.Q8_0, seed=5, arch=arch, **opts)
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=DEFAULT_BIN)
    args = ap.parse_args()
    from llamacpy.registry import resolve_model

    cases = []
    for case in CASES:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "imatrix.gguf"
            r = subprocess.run([f"{args.bin}/llama-imatrix", "-m", str(resolve_model(case["model"])),
                                "-f", str(ENGINE / case["text"]), *case["args"], "-t", "2",
                                "-o", str(out)], capture_output=True, text=True, check=True)  # fmt: skip
            ppl = float(re.search(r"Final estimate: PPL = (\d+\.\d+)", r.stdout + r.stderr)[1])
            raw = load_imatrix_raw(out, 512)
            # (its logger's thread sometimes loses the last lines at exit: the longest of
            # five runs; its log lines' timestamps and level removed)
            runs = [subprocess.run([f"{args.bin}/llama-imatrix", "-m",
                                    str(resolve_model(case["model"])), "--show-statistics",
                                    "--in-file", str(out)],
                                   capture_output=True, text=True, check=True).stderr
                    for _ in range(5)]  # fmt: skip
            log = max(runs, key=len)
            lines = [re.sub(r"^\d+\.\d+\.\d+\.\d+ [IWE] ", "", ln) for ln in log.split("\n")]
            start = next(i for i, ln in enumerate(lines) if ln.startswith("Computing statistics"))
            statistics = "\n".join(lines[start - 1 :]).rstrip("\n") + "\n"
        entries = {}
        for name, (sums, counts) in sorted(raw.entries.items()):
            e = {"count": int(counts[0]), "total": float(sums.astype(np.float64).sum())}
            m = re.match(r"blk\.(\d+)\.", name)
            if m and int(m[1]) in case["layers"]:
                e["sums"] = base64.b64encode(sums.astype("<f4").tobytes()).decode()
            entries[name] = e
        cases.append({**case, "ppl": ppl, "entries": entries, "statistics": statistics})
        print(case["model"], ppl, len(entries), "entries")
    tiny = []
    for name in TINY:
        with tempfile.TemporaryDirectory() as tmp:
            model, out = tiny_model(name, Path(tmp) / "m.gguf"), Path(tmp) / "imatrix.gguf"
            subprocess.run([f"{args.bin}/llama-imatrix", "-m", str(model), "-f",
                            str(ENGINE / "text.txt"), *TINY_ARGS, "-t", "2", "-o", str(out)],
                           capture_output=True, text=True, check=True)  # fmt: skip
            raw = load_imatrix_raw(out, 512)
        entries = {
            k: {"counts": c.tolist(), "sums": base64.b64encode(s.astype("<f4").tobytes()).decode()}
            for k, (s, c) in sorted(raw.entries.items())
        }
        tiny.append({"name": name, "args": TINY_ARGS, "entries": entries})
        print(name, len(entries), "entries")
    with atomic_write(OUT) as f:
        f.write((json.dumps({"cases": cases, "tiny": tiny}, indent=1) + "\n").encode())
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
