"""Quantization speed, side by side with llama.cpp on the same data and thread count.

1. Per format: dequantize and quantize throughput (million values per second) of
   :mod:`llamacpy.quants` against ggml's ``to_float`` / ``ggml_quantize_chunk`` (the functions
   llama-quantize runs, called through ctypes). Both sides split the rows into the same
   chunks and run them on a pool of NTHREAD threads (ctypes and numba both drop the GIL).
   Both write into preallocated outputs, as ``to_float`` and ``ggml_quantize_chunk`` do;
   our dequantize is also timed returning a new array per chunk (``new arrays``: the chunks'
   fresh pages included).
2. Whole model: ``llamacpy quantize`` against ``llama-quantize`` on the same input, preset
   and thread count: wall time of the command (process start included) and the time of the
   quantization itself (llama-quantize's own "quantize time"; our :func:`quantize_model`).

Runs alternate between the two sides and the best of ``--repeat`` is kept, so other jobs on
a shared machine disturb both alike. Ratios are llama.cpp's time over ours: above 1 means
llamacpy is faster.

    python benchmarks/bench_quantize.py [--threads 2] [--repeat 3] [--models smollm2-135m]
    python benchmarks/bench_quantize.py --formats-only --formats Q4_K Q6_K
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from llamacpy import quants
from llamacpy.gguf import GGMLType
from llamacpy.quantize import QuantizeParams, parse_preset, quantize_model
from llamacpy.registry import resolve_model

LLAMA_BIN = Path("/root/oracle/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin")
FORMATS = [
    "F16",
    "BF16",
    "Q8_0",
    "Q4_0",
    "Q4_1",
    "Q5_0",
    "Q5_1",
    "Q2_K",
    "Q3_K",
    "Q4_K",
    "Q5_K",
    "Q6_K",
    "IQ4_NL",
    "IQ4_XS",
    "MXFP4",
    "TQ1_0",
    "TQ2_0",
    "IQ3_XXS",
    "IQ3_S",
    "IQ2_XXS",
    "IQ2_XS",
    "IQ2_S",
    "IQ1_S",
    "IQ1_M",
    "NVFP4",
    "Q1_0",
    "Q2_0",
]
# formats ggml quantizes only with an importance matrix: timed with one (on both sides)
NEEDS_IMATRIX = {"IQ2_XXS", "IQ2_XS", "IQ1_S"}
PRESETS = ("Q8_0", "Q4_0", "Q4_K_M")
CHUNK_ROWS = 64  # rows of 4096 values: 256K values per work item (as our pipeline)


# --------------------------------------------------------------------------- ggml via ctypes
class _Traits(ctypes.Structure):
    _fields_ = [
        ("type_name", ctypes.c_char_p),
        ("blck_size", ctypes.c_int64),
        ("blck_size_interleave", ctypes.c_int64),
        ("type_size", ctypes.c_size_t),
        ("is_quantized", ctypes.c_bool),
        ("to_float", ctypes.c_void_p),
        ("from_float_ref", ctypes.c_void_p),
    ]


_TO_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)


class Ggml:
    def __init__(self, lib: Path) -> None:
        self.lib = ctypes.CDLL(str(lib))
        self.lib.ggml_quantize_chunk.restype = ctypes.c_size_t
        self.lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        self.lib.ggml_quantize_chunk.argtypes += [ctypes.c_int64] * 3 + [ctypes.c_void_p]
        self.lib.ggml_get_type_traits.restype = ctypes.POINTER(_Traits)
        self.lib.ggml_get_type_traits.argtypes = [ctypes.c_int]
        self.lib.ggml_fp16_to_fp32_row.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        self.lib.ggml_bf16_to_fp32_row.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]

    def quantize(self, t: GGMLType, x: np.ndarray, dst: np.ndarray, im=None) -> None:
        qw = None if im is None else im.ctypes.data
        self.lib.ggml_quantize_chunk(int(t), x.ctypes.data, dst.ctypes.data, 0, *x.shape, qw)

    def dequantize(self, t: GGMLType, raw: np.ndarray, y: np.ndarray) -> None:
        # what llama-quantize calls: the row converters for F16/BF16, else the type's to_float
        if t == GGMLType.F16:
            self.lib.ggml_fp16_to_fp32_row(raw.ctypes.data, y.ctypes.data, y.size)
        elif t == GGMLType.BF16:
            self.lib.ggml_bf16_to_fp32_row(raw.ctypes.data, y.ctypes.data, y.size)
        else:
            fn = _TO_FLOAT(self.lib.ggml_get_type_traits(int(t)).contents.to_float)
            fn(raw.ctypes.data, y.ctypes.data, y.size)


# --------------------------------------------------------------------------- helpers
def _best(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _single_threaded_numba() -> None:
    import numba

    numba.set_num_threads(1)


def bench_formats(
    ggml: Ggml, nthread: int, repeat: int, n_rows: int, names: list[str] = FORMATS
) -> list[dict]:
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((n_rows, 4096)) * 0.02).astype(np.float32)
    imatrix = (rng.chisquare(2, 4096) + 1e-3).astype(np.float32)
    chunks = [(r, min(r + CHUNK_ROWS, n_rows)) for r in range(0, n_rows, CHUNK_ROWS)]
    pool = ThreadPoolExecutor(nthread, initializer=_single_threaded_numba)
    rows = []
    for name in names:
        t = GGMLType[name]
        fmt = quants.get(t)
        im = imatrix if name in NEEDS_IMATRIX else None
        q = fmt.quantize(x, im)
        ref = np.empty_like(q)
        ggml.quantize(t, x, ref, im)
        y = np.empty_like(x)
        nb = q.shape[1]

        qo = np.empty_like(q)

        def ours_q(fmt=fmt, qo=qo, im=im) -> None:
            list(pool.map(lambda c: fmt.quantize(x[c[0] : c[1]], im, qo[c[0] : c[1]]), chunks))

        def ggml_q(t=t, ref=ref, im=im) -> None:
            list(pool.map(lambda c: ggml.quantize(t, x[c[0] : c[1]], ref[c[0] : c[1]], im), chunks))

        def ours_d(fmt=fmt, q=q, y=y) -> None:
            def chunk(c: tuple[int, int]) -> None:
                fmt.dequantize(q[c[0] : c[1]], (c[1] - c[0]) * 4096, y[c[0] : c[1]])

            list(pool.map(chunk, chunks))

        def ours_d_new(fmt=fmt, q=q) -> None:
            list(pool.map(lambda c: fmt.dequantize(q[c[0] : c[1]], (c[1] - c[0]) * 4096), chunks))

        def ggml_d(t=t, q=q, y=y) -> None:
            list(pool.map(lambda c: ggml.dequantize(t, q[c[0] : c[1]], y[c[0] : c[1]]), chunks))

        for f in (ours_q, ggml_q, ours_d, ggml_d, ours_d_new):  # warm up (numba compile / cache)
            f()
        res = {"format": name, "bytes_per_row": nb}
        for label, fn in (
            ("q_ours", ours_q),
            ("q_ggml", ggml_q),
            ("d_ours", ours_d),
            ("d_ggml", ggml_d),
            ("d_ours_new", ours_d_new),
        ):
            res[label] = x.size / _best(fn, repeat) / 1e6
        res["identical_rows"] = float(np.mean(np.all(qo == ref, axis=1)))
        rows.append(res)
        print(
            f"{name:7s} quantize {res['q_ours']:8.1f} vs {res['q_ggml']:8.1f} Mval/s "
            f"(x{res['q_ours'] / res['q_ggml']:.2f})   dequantize {res['d_ours']:8.1f} vs "
            f"{res['d_ggml']:8.1f} Mval/s (x{res['d_ours'] / res['d_ggml']:.2f}; new arrays "
            f"{res['d_ours_new']:8.1f}, x{res['d_ours_new'] / res['d_ggml']:.2f})",
            flush=True,
        )
    pool.shutdown()
    return rows


def _ours_cli(model: Path, out: Path, preset: str, nthread: int) -> list[str]:
    code = (
        "import sys; from llamacpy import cli; "
        "cli.SUBCOMMANDS = cli.SUBCOMMANDS + ['quantize'] * ('quantize' not in cli.SUBCOMMANDS); "
        "sys.exit(cli.main(sys.argv[1:]))"
    )
    args = [str(model), str(out), preset, str(nthread)]
    return [sys.executable, "-c", code, "quantize", "-q", "--allow-requantize", *args]


def bench_model(name: str, nthread: int, repeat: int) -> list[dict]:
    model = resolve_model(name)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.gguf"
        for preset in PRESETS:
            llama_cmd = [str(LLAMA_BIN / "llama-quantize"), "--allow-requantize", str(model)]
            llama_cmd += [str(out), preset, str(nthread)]
            ours_cmd = _ours_cli(model, out, preset, nthread)
            params = QuantizeParams(parse_preset(preset).ftype, nthread, allow_requantize=True)
            quantize_model(model, out, params)  # warm the numba cache for this preset
            best = {"llama_wall": 1e9, "llama_quant": 1e9, "ours_wall": 1e9, "ours_quant": 1e9}
            for _ in range(repeat):
                t0 = time.perf_counter()
                p = subprocess.run(llama_cmd, capture_output=True, text=True, check=True)
                best["llama_wall"] = min(best["llama_wall"], time.perf_counter() - t0)
                m = re.search(r"quantize time =\s*([\d.]+) ms", p.stdout + p.stderr)
                if m:
                    best["llama_quant"] = min(best["llama_quant"], float(m.group(1)) / 1000)
                t0 = time.perf_counter()
                subprocess.run(ours_cmd, capture_output=True, text=True, check=True)
                best["ours_wall"] = min(best["ours_wall"], time.perf_counter() - t0)
                t0 = time.perf_counter()
                quantize_model(model, out, params)
                best["ours_quant"] = min(best["ours_quant"], time.perf_counter() - t0)
            row = {"model": name, "preset": preset, **best}
            rows.append(row)
            print(
                f"{name} {preset:7s} quantize: llama.cpp {best['llama_quant']:6.2f} s, ours "
                f"{best['ours_quant']:6.2f} s (x{best['llama_quant'] / best['ours_quant']:.2f});"
                f" whole command: {best['llama_wall']:6.2f} s vs {best['ours_wall']:6.2f} s "
                f"(x{best['llama_wall'] / best['ours_wall']:.2f})",
                flush=True,
            )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rows", type=int, default=1024, help="rows of 4096 values per format test")
    ap.add_argument("--models", nargs="*", default=["smollm2-135m", "gemma3-270m"])
    ap.add_argument("--formats", nargs="*", default=FORMATS, help="formats to time (default: all)")
    ap.add_argument("--formats-only", action="store_true")
    ap.add_argument("--models-only", action="store_true")
    ap.add_argument("--lib", type=Path, default=LLAMA_BIN / "libggml-base.so")
    args = ap.parse_args()
    print(f"threads: {args.threads}, best of {args.repeat}; ratios: llama.cpp time / ours")
    if not args.models_only:
        bench_formats(Ggml(args.lib), args.threads, args.repeat, args.rows, args.formats)
    if not args.formats_only:
        for name in args.models:
            bench_model(name, args.threads, args.repeat)


if __name__ == "__main__":
    main()
