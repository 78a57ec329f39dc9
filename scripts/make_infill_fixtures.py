#!/usr/bin/env python
"""Record llama-server's ``POST /infill`` answers (dev-only; needs the llama.cpp oracle).

SmolLM2's vocabulary has no fill-in-the-middle tokens, so the model is given some, as a
qwen2.5-coder-style file declares them (``tokenizer.ggml.fim_{pre,suf,mid,rep,sep}_token_id``
set on control tokens of its vocabulary: :func:`fim_model`). llama-server serves that file
with ``-c 2048 -b 512 -np 1`` (and once more with ``--spm-infill``); each case's greedy
answer (content and prompt size) goes to ``tests/fixtures/generation/infill.json``.

    .venv/bin/python scripts/make_infill_fixtures.py [--bin DIR]
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from llamacpy.fileio import atomic_write

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from infill_cases import CASES, FLAGS, fim_model  # noqa: E402

OUT = ROOT / "tests" / "fixtures" / "generation" / "infill.json"
DEFAULT_BIN = "/root/oracle/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(bin_dir: str, model: Path, extra: list[str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([f"{bin_dir}/llama-server", "-m", str(model), "--port", str(port),
                             *FLAGS, *extra], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("llama-server did not come up")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=DEFAULT_BIN)
    args = ap.parse_args()
    from llamacpy.registry import resolve_model

    out = {"flags": FLAGS, "cases": []}
    with tempfile.TemporaryDirectory() as d:
        model = fim_model(resolve_model("smollm2-135m"), Path(d))
        for spm in (False, True):
            proc, base = serve(args.bin, model, ["--spm-infill"] if spm else [])
            try:
                for case in CASES:
                    if case.get("spm", False) != spm:
                        continue
                    r = httpx.post(base + "/infill", json=case["body"], timeout=300)
                    res = r.json()
                    row = {"name": case["name"], "status": r.status_code}
                    if r.status_code == 200:
                        row.update(content=res["content"], n_prompt=res["tokens_evaluated"])
                    out["cases"].append(row)
                    print(row["name"], row["status"], row.get("n_prompt"), repr(row.get("content")))
            finally:
                proc.terminate()
                proc.wait(30)
    with atomic_write(OUT) as f:
        f.write((json.dumps(out, indent=1, ensure_ascii=False) + "\n").encode())
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
