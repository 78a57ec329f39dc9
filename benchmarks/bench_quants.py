"""Throughput of llamacpy.quants (numba) against the gguf package's numpy code.

    .venv/bin/python benchmarks/bench_quants.py [--rows 1024] [--cols 4096] [--threads N]

Prints Melem/s (million float32 weights per second, best of ``--repeat``) for dequantization
and quantization (reference path; "imat" is the importance-matrix path). Kernels are compiled
or loaded from the cache before timing. ``-`` means the gguf package has no implementation.
"""

from __future__ import annotations

import argparse
import time

import gguf
import gguf.quants as gq
import numba
import numpy as np

import llamacpy.quants as Q

TYPES = ["F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q2_K", "Q3_K",
         "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ4_NL", "IQ4_XS", "MXFP4"]  # fmt: skip
TYPES += ["TQ1_0", "TQ2_0", "IQ3_XXS", "IQ3_S", "NVFP4", "Q1_0", "Q2_0"]
NO_IMATRIX = {"F16", "BF16", "Q8_0", "Q8_1", "Q8_K", "MXFP4", "TQ1_0", "TQ2_0"}
NO_IMATRIX |= {"NVFP4", "Q1_0", "Q2_0"}


def best_time(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def gguf_fn(kind: str, name: str, arg):
    qtype = getattr(gguf.GGMLQuantizationType, name, None)
    try:
        fn = gq.dequantize if kind == "dequantize" else gq.quantize
        fn(arg[:1], qtype)
    except (NotImplementedError, AttributeError, TypeError, ValueError):
        return None
    return lambda: fn(arg, qtype)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--quant-rows", type=int, default=256, help="rows for quantization")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--types", nargs="*", default=TYPES)
    args = ap.parse_args()
    if args.threads:
        numba.set_num_threads(args.threads)

    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.rows, args.cols)).astype(np.float32)
    xq = np.ascontiguousarray(x[: args.quant_rows])
    im = (rng.uniform(0.1, 3, args.cols) ** 2).astype(np.float32)
    print(f"{args.rows}x{args.cols} dequantize, {args.quant_rows}x{args.cols} quantize, "
          f"numba threads {numba.get_num_threads()}, Melem/s (best of {args.repeat})")  # fmt: skip
    head = f"{'type':7} {'deq numba':>10} {'deq numpy':>10} {'deq gguf':>9} | "
    head += f"{'q numba':>8} {'q imat':>7} {'q numpy':>8} {'q gguf':>7}"
    print(head)
    print("-" * len(head))

    def rate(seconds: float | None, n: int) -> str:
        return "-" if seconds is None else f"{n / seconds / 1e6:.1f}"

    for name in args.types:
        fmt = Q.get(name)
        raw = fmt.quantize(x)
        fmt.dequantize(raw, x.size)  # compile / load from cache
        fmt.quantize(xq[:2], None if name in NO_IMATRIX else im)
        n, nq = x.size, xq.size
        t_dn = best_time(lambda fmt=fmt, raw=raw, n=n: fmt.dequantize(raw, n), args.repeat)
        t_dp = best_time(lambda fmt=fmt, raw=raw, n=n: fmt.dequantize_numpy(raw, n), 1)
        g = gguf_fn("dequantize", name, raw)
        t_dg = best_time(g, args.repeat) if g else None
        t_qn = best_time(lambda fmt=fmt: fmt.quantize(xq), args.repeat)
        t_qi = None
        if name not in NO_IMATRIX:
            t_qi = best_time(lambda fmt=fmt: fmt.quantize(xq, im), args.repeat)
        small = np.ascontiguousarray(xq[: max(1, args.quant_rows // 8)])
        t_qp = best_time(lambda fmt=fmt, s=small: fmt.quantize_numpy(s), 1)
        g = gguf_fn("quantize", name, xq)
        t_qg = best_time(g, 1) if g else None
        print(
            f"{name:7} {rate(t_dn, n):>10} {rate(t_dp, n):>10} {rate(t_dg, n):>9} | "
            f"{rate(t_qn, nq):>8} {rate(t_qi, nq):>7} {rate(t_qp, small.size):>8} "
            f"{rate(t_qg, nq):>7}"
        )


if __name__ == "__main__":
    main()
