#!/usr/bin/env python
"""Prefill speed of Hugging Face transformers on PyTorch CPU (fp32, weights dequantized from
the same GGUF), as the other side of the engine's prefill goal. Dev-only: run it with a
Python that has torch, transformers and gguf (not llamacpy's dependencies).

    /path/to/torch-python benchmarks/bench_prefill_transformers.py MODEL.gguf [-p 512] [-t 2] [-r 3]

Prints pp tokens/s (one forward over ``p`` random tokens, no KV reuse), mean over ``r``
repetitions after a warm-up run of the same prompt, like ``llama-bench -p``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("-r", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(a.t)
    path = Path(a.model)
    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    ).eval()
    ids = torch.randint(
        0, model.config.vocab_size, (1, a.p), generator=torch.Generator().manual_seed(0)
    )
    with torch.inference_mode():
        model(ids, logits_to_keep=1)  # warm-up: one whole prompt run, as llama-bench
        speeds = []
        for _ in range(a.r):
            t0 = time.perf_counter()
            model(ids, logits_to_keep=1)
            speeds.append(a.p / (time.perf_counter() - t0))
    sd = statistics.stdev(speeds) if len(speeds) > 1 else 0.0
    print(f"transformers pp{a.p}: {statistics.mean(speeds):.1f} +- {sd:.1f} t/s ({a.t} threads)")


if __name__ == "__main__":
    main()
