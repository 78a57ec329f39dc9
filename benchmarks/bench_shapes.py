#!/usr/bin/env python
"""Random-weight models of real shapes side by side with llama.cpp, in one run: prefill and
decode speed of the architectures no real model here covers.

    .venv/bin/python benchmarks/bench_shapes.py [--model NAME] [--type Q8_0] [-p 512]
        [-n 128] [-t 2] [-r 3] [--llama-bin DIR] [--dir DIR]

Models (random weights of ``--type``, Q8_0 by default, every matrix of that type; written
once to ``--dir`` by ``models.tiny``):

* ``llama-1b``: ``llama`` with Llama-3.2-1B's shape (2048 wide, 16 layers, 32 query and 8 KV
  heads of 64, FFN 8192, vocabulary 128256): the ~1B model the weight formats are timed on
  (``--type IQ2_XXS``, ``TQ1_0``, ...; ``--types`` runs several in one go);
* ``qwen3-0.6b``: the dense ``qwen3`` with Qwen3-0.6B's shape (1024 wide, 28 layers, 16
  query and 8 KV heads of 128, FFN 3072, vocabulary 151936): a small dense model to time the
  weight formats on (``--type IQ2_XXS``, ``IQ3_S``, ...);
* ``qwen35-0.8b``: the hybrid ``qwen35`` with Qwen3.5-0.8B's shape (1024 wide, 24 layers of
  which every fourth is full attention; 16 key and 16 value heads of 128 in the Gated
  DeltaNet layers, 8 query and 2 KV heads of 256 in the attention layers; FFN 3584;
  vocabulary 248320);
* ``qwen3moe-30b-a3b-8l``: ``qwen3moe`` with Qwen3-30B-A3B's layer shape (2048 wide, 32
  query and 4 KV heads of 128, 128 experts of 768 with 8 used per token, vocabulary 151936)
  but 8 of its 48 layers, so that it fits in memory: the per-layer work of the real model;
* ``gpt-oss-20b-8l``: ``gpt-oss`` with gpt-oss-20b's layer shape (2880 wide, 64 query and 8
  KV heads of 64, sliding window 128 in every other layer, 32 experts of 2880 in MXFP4 with 4
  used, vocabulary 201088), 8 of its 24 layers.

Speed is measured as ``bench_engine.py`` does (``llama-bench -p 512 -n 128``; the two sides
alternate, one repetition each).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_engine import DEFAULT_BIN, speed_table

SHAPES = {
    "llama-1b": ("llama", dict(
        n_embd=2048, n_layer=16, n_ff=8192, n_head=32, n_head_kv=8, head_dim=64,
        n_vocab=128256, n_ctx=4096,
    )),
    "qwen3-0.6b": ("qwen3", dict(
        n_embd=1024, n_layer=28, n_ff=3072, n_head=16, n_head_kv=8, head_dim=128,
        n_vocab=151936, n_ctx=4096,
    )),
    "qwen35-0.8b": ("qwen35", dict(
        n_embd=1024, n_layer=24, n_ff=3584, n_head=8, n_head_kv=2, head_dim=256, n_rot=64,
        d_conv=4, d_state=128, n_group=16, dt_rank=16, n_vocab=248320, n_ctx=4096,
    )),
    "qwen3moe-30b-a3b-8l": ("qwen3moe", dict(
        n_embd=2048, n_layer=8, n_ff=6144, n_head=32, n_head_kv=4, head_dim=128,
        n_expert=128, n_expert_used=8, n_ff_exp=768, n_vocab=151936, n_ctx=4096,
    )),
    "gpt-oss-20b-8l": ("gpt-oss", dict(
        n_embd=2880, n_layer=8, n_ff=2880, n_head=64, n_head_kv=8, head_dim=64,
        n_expert=32, n_expert_used=4, n_ff_exp=2880, n_vocab=201088, n_ctx=4096,
        experts_type=39, sliding_window=128,  # MXFP4 experts, as released
    )),
}  # fmt: skip


def write(name: str, path: Path, type_name: str = "Q8_0") -> None:
    from llamacpy.gguf import GGMLType
    from llamacpy.models.tiny import write_tiny_llama, write_tiny_qwen35

    arch, shape = SHAPES[name]
    t = GGMLType[type_name]
    path.parent.mkdir(parents=True, exist_ok=True)
    print(f"writing {path} ...", flush=True)
    if arch == "qwen35":
        write_tiny_qwen35(path, t, seed=0, **shape)
    else:
        write_tiny_llama(path, t, seed=0, arch=arch, **shape)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=sorted(SHAPES), default="qwen35-0.8b")
    ap.add_argument("--type", default="Q8_0", help="weight type of every matrix")
    ap.add_argument("--types", nargs="*", help="several weight types, one after the other")
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("-r", type=int, default=3)
    ap.add_argument("--llama-bin", default=os.environ.get("LLAMA_CPP_BIN", DEFAULT_BIN))
    ap.add_argument("--dir", default=str(Path.home() / ".cache/llamacpy/bench"))
    a = ap.parse_args()

    bin_dir = Path(a.llama_bin)
    have_llama = (bin_dir / "llama-bench").exists()
    rows = []
    for type_name in a.types or [a.type]:
        path = Path(a.dir) / f"{a.model}-{type_name.lower()}.gguf"
        if not path.exists():
            write(a.model, path, type_name)
        print(f"\nmodel {path}\nthreads {a.t}, load: {os.getloadavg()}", flush=True)
        rows.append((type_name, speed_table(str(path), a, bin_dir if have_llama else None)))
    if len(rows) > 1 and have_llama:
        print(f"\n{'type':8s} {'pp' + str(a.p) + ' ours':>10s} {'llama.cpp':>10s} {'ratio':>6s}"
              f" {'tg' + str(a.n) + ' ours':>10s} {'llama.cpp':>10s} {'ratio':>6s}")  # fmt: skip
        for name, s in rows:
            ours, ref = s["llamacpy"], s["llama.cpp"]
            cells = [
                f"{ours[k]:10.2f} {ref[k]:10.2f} {ours[k] / ref[k]:6.2f}" for k in ("pp", "tg")
            ]
            print(f"{name:8s} " + " ".join(cells))


if __name__ == "__main__":
    main()
