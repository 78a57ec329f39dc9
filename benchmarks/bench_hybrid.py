#!/usr/bin/env python
"""A hybrid model of a real shape side by side with llama.cpp, in one run: prefill and decode
speed of ``qwen35`` (Gated DeltaNet + gated attention) with random Q8_0 weights.

    .venv/bin/python benchmarks/bench_hybrid.py [-p 512] [-n 128] [-t 2] [-r 3]
        [--llama-bin DIR] [--out PATH]

The model has the shape of Qwen3.5-0.8B (1024 wide, 24 layers of which every fourth is full
attention, 16 key and 16 value heads of 128 in the DeltaNet layers, 8 query and 2 KV heads of
256 in the attention layers, FFN 3584, vocabulary 248320), written once by
``models.tiny.write_tiny_qwen35`` to ``--out``. Speed is measured as ``bench_engine.py``
does (``llama-bench -p 512 -n 128``; the two sides alternate, one repetition each).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_engine import DEFAULT_BIN, speed_table

QWEN35_0_8B = dict(
    n_embd=1024, n_layer=24, n_ff=3584, n_head=8, n_head_kv=2, head_dim=256, n_rot=64,
    d_conv=4, d_state=128, n_group=16, dt_rank=16, n_vocab=248320, n_ctx=4096,
)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("-r", type=int, default=3)
    ap.add_argument("--llama-bin", default=os.environ.get("LLAMA_CPP_BIN", DEFAULT_BIN))
    ap.add_argument(
        "--out", default=str(Path.home() / ".cache/llamacpy/bench/qwen35-0.8b-q8_0.gguf")
    )
    a = ap.parse_args()

    from llamacpy.gguf import GGMLType
    from llamacpy.models.tiny import write_tiny_qwen35

    path = Path(a.out)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        print(f"writing {path} ...", flush=True)
        write_tiny_qwen35(path, GGMLType.Q8_0, seed=0, **QWEN35_0_8B)
    model, bin_dir = str(path), Path(a.llama_bin)
    have_llama = (bin_dir / "llama-bench").exists()
    print(f"model {model}\nthreads {a.t}, load: {os.getloadavg()}")
    speed_table(model, a, bin_dir if have_llama else None)


if __name__ == "__main__":
    main()
