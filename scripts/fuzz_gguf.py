#!/usr/bin/env python
"""Fuzz the GGUF reader with mutated copies of small valid files.

Every variant must load (and be fully usable) or raise GGUFError; the script counts the
outcomes and prints the first few variants that did anything else, with how to reproduce
them. The mutation code is shared with tests/test_gguf_fuzz.py (tests/gguf_fuzzing.py).

    python scripts/fuzz_gguf.py                 # 100000 variants, 2 worker processes
    python scripts/fuzz_gguf.py --n 5000 --seed 7 --jobs 1
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from gguf_fuzzing import Mutator, Timeout, build_seeds, check_variant

MAX_EXAMPLES = 5
CHUNK = 500

_mutator: Mutator | None = None
_workdir: str = ""


def _init_worker(seeds: list[bytes], parent: str) -> None:
    global _mutator, _workdir
    _mutator = Mutator(seeds)
    _workdir = tempfile.mkdtemp(dir=parent)


def _run_chunk(args: tuple[int, int, int, bool]) -> tuple[Counter, list[str]]:
    seed, start, stop, rewrite = args
    assert _mutator is not None
    path = os.path.join(_workdir, "variant.gguf")
    counts: Counter = Counter()
    examples: list[str] = []
    for i in range(start, stop):
        data, how = _mutator.variant(seed, i)
        try:
            counts[check_variant(path, data, use_mmap=i % 2 == 0, rewrite=rewrite)] += 1
        except Timeout:
            counts["timeout"] += 1
            if len(examples) < MAX_EXAMPLES:
                examples.append(f"variant {i} ({how}): timeout")
        except Exception as e:
            counts["other"] += 1
            if len(examples) < MAX_EXAMPLES:
                last = traceback.format_exception(type(e), e, e.__traceback__)
                examples.append(f"variant {i} ({how}): {''.join(last[-3:]).strip()}")
    return counts, examples


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000, help="number of variants (default 100000)")
    ap.add_argument("--seed", type=int, default=0, help="run seed (default 0)")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument(
        "--rewrite", action="store_true", help="also write back every loaded variant and reread it"
    )
    args = ap.parse_args(argv)

    parent = tempfile.mkdtemp(prefix="gguf-fuzz-")
    try:
        return _run(args, parent)
    finally:
        shutil.rmtree(parent, ignore_errors=True)


def _run(args: argparse.Namespace, parent: str) -> int:
    seeds = build_seeds(parent)
    chunks = [
        (args.seed, start, min(start + CHUNK, args.n), args.rewrite)
        for start in range(0, args.n, CHUNK)
    ]
    counts: Counter = Counter()
    examples: list[str] = []
    t0 = time.perf_counter()
    # fork keeps start-up cheap; each worker has its own directory and SIGALRM timer
    ctx = mp.get_context("fork")
    with ctx.Pool(max(1, args.jobs), initializer=_init_worker, initargs=(seeds, parent)) as pool:
        for c, ex in pool.imap_unordered(_run_chunk, chunks):
            counts.update(c)
            examples.extend(ex[: MAX_EXAMPLES - len(examples)])
    elapsed = time.perf_counter() - t0

    total = sum(counts.values())
    print(f"GGUF reader fuzz: {total} variants of {len(seeds)} seeds, run seed {args.seed}")
    print(f"  loaded ok        {counts['ok']:>8}")
    print(f"  GGUFError        {counts['error']:>8}")
    print(f"  other exceptions {counts['other']:>8}")
    print(f"  timeouts         {counts['timeout']:>8}")
    print(f"  total time       {elapsed:>8.1f} s ({total / max(elapsed, 1e-9):.0f} variants/s)")
    if examples:
        print("first failures (reproduce: Mutator(build_seeds(dir)).variant(seed, index)):")
        for ex in examples:
            print("  " + ex.replace("\n", "\n    "))
    return 1 if counts["other"] or counts["timeout"] else 0


if __name__ == "__main__":
    sys.exit(main())
