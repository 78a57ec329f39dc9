#!/usr/bin/env python
"""Record llama-perplexity's KL-divergence mode (the oracle; dev-only).

Run from the repository root with the project's venv::

    .venv/bin/python scripts/make_kld_fixtures.py [SMOLLM2_Q4_1_GGUF]

Writes into ``tests/fixtures/kld/``:

* ``tiny_base.bin``: ``llama-perplexity --kl-divergence-base`` of the tiny random llama
  (``llamacpy.models.tiny``, Q8_0, seed ``SEED``, rebuilt by the tests) on
  ``tests/fixtures/generation/prose.txt`` with ``-c 64 --chunks 4`` (odd vocabulary of 259:
  the rows carry a pad);
* ``kld.json``: for that run its stdout; the sha256 of ``llama-quantize --allow-requantize``
  of the tiny model to Q5_0 and the stdout of ``llama-perplexity --kl-divergence`` of that
  file against ``tiny_base.bin``; for SmolLM2-135M Q4_1 with
  ``-c 128 --chunks 4``: the sha256 and size of llama-perplexity's base file (24.8 MB, not
  kept), the sha256 of its requantization to Q8_0 and
  the KL-divergence stdout of that Q8_0 file and of the Q4_1 file itself against the base.

Flash attention on and one thread, as the other fixtures.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from llamacpy.gguf import GGMLType  # noqa: E402
from llamacpy.models.tiny import write_tiny_llama  # noqa: E402

OUT = ROOT / "tests" / "fixtures" / "kld"
TEXT = ROOT / "tests" / "fixtures" / "generation" / "prose.txt"
BIN = Path("/root/oracle/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin")
SMOLLM2 = Path.home() / ".cache/llamacpy/models/SmolLM2-135M-Instruct.Q4_1.gguf"
SEED = 5
TINY = {"n_ctx": 64, "chunks": 4}
SMOL = {"n_ctx": 128, "chunks": 4}


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def perplexity(model: Path, base: Path, n_ctx: int, chunks: int, kld: bool) -> str:
    """llama-perplexity's stdout (writing ``base``, or with ``kld`` reading it)."""
    cmd = [str(BIN / "llama-perplexity"), "-m", str(model), "-c", str(n_ctx), "-t", "1",
           "-fa", "on", "--kl-divergence-base", str(base)]  # fmt: skip
    cmd += ["--kl-divergence"] if kld else ["-f", str(TEXT), "--chunks", str(chunks)]
    env = {**os.environ, "LD_LIBRARY_PATH": str(BIN)}
    proc = subprocess.run(cmd, capture_output=True, env=env, check=True)
    return proc.stdout.decode()


def requantize(src: Path, dst: Path, ftype: str) -> None:
    cmd = [str(BIN / "llama-quantize"), "--allow-requantize", str(src), str(dst), ftype, "1"]
    env = {**os.environ, "LD_LIBRARY_PATH": str(BIN)}
    subprocess.run(cmd, capture_output=True, check=True, env=env)


def main() -> None:
    smollm2 = Path(sys.argv[1]) if len(sys.argv) > 1 else SMOLLM2
    OUT.mkdir(parents=True, exist_ok=True)
    data: dict = {"text": "generation/prose.txt", "seed": SEED}
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        q8, q5 = t / "tiny_q8_0.gguf", t / "tiny_q5_0.gguf"
        write_tiny_llama(q8, GGMLType.Q8_0, seed=SEED)
        requantize(q8, q5, "Q5_0")
        base = OUT / "tiny_base.bin"
        data["tiny"] = {
            **TINY,
            "q5_0_sha256": sha256(q5),
            "base_stdout": perplexity(q8, base, TINY["n_ctx"], TINY["chunks"], kld=False),
            "kld_q5_0_stdout": perplexity(q5, base, TINY["n_ctx"], 0, kld=True),
        }
        sbase, sq8 = t / "smollm2_base.bin", t / "smollm2_q8_0.gguf"
        run = perplexity(smollm2, sbase, SMOL["n_ctx"], SMOL["chunks"], kld=False)
        requantize(smollm2, sq8, "Q8_0")
        data["smollm2"] = {
            **SMOL,
            "model": smollm2.name,
            "base_stdout": run,
            "base_sha256": sha256(sbase),
            "base_size": sbase.stat().st_size,
            "q8_0_sha256": sha256(sq8),
            "kld_q8_0_stdout": perplexity(sq8, sbase, SMOL["n_ctx"], 0, kld=True),
            "kld_self_stdout": perplexity(smollm2, sbase, SMOL["n_ctx"], 0, kld=True),
        }
    (OUT / "kld.json").write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
