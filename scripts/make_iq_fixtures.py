"""Produce tests/fixtures/quants/iq_dequant.npz: ggml's ``to_float`` of the grid and ternary
formats (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, TQ1_0, TQ2_0).

Dev-only: calls ``dequantize_row_<type>`` of a llama.cpp ``libggml-base.so`` through ctypes;
the tests read only the committed fixture. Per type: ``raw/<T>`` (blocks of random bytes:
most with a moderate f16 scale, some with denormal, huge, inf or NaN scales, some wholly
random) and ``ggml/<T>``, the floats ggml makes of them.

    python scripts/make_iq_fixtures.py [--lib PATH/libggml-base.so]
"""

from __future__ import annotations

import argparse
import ctypes
from pathlib import Path

import numpy as np

from llamacpy.gguf import GGML_BLOCK_SIZES, GGMLType

DEFAULT_LIB = "/root/oracle/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/libggml-base.so"
OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "quants" / "iq_dequant.npz"
TYPES = ["IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "TQ1_0", "TQ2_0"]
D_OFFSET = {"TQ1_0": 52, "TQ2_0": 64}  # the f16 d of the others is the block's first field
N_BLOCKS = 24
SPECIAL_D = [0x0001, 0x03FF, 0x7BFF, 0x7C00, 0xFC00, 0x7E00, 0x8000, 0x0000]  # f16 bits


def blocks(name: str, rng: np.random.Generator) -> np.ndarray:
    _, size = GGML_BLOCK_SIZES[GGMLType[name]]
    raw = rng.integers(0, 256, (N_BLOCKS, size), dtype=np.uint8)
    sane = rng.uniform(-2, 2, N_BLOCKS).astype(np.float16).view(np.uint16)
    sane[8:16] = SPECIAL_D
    if name == "IQ1_M":  # d is spread over the top nibbles of the four scale words
        w = raw[:, 48:56].copy().view(np.uint16)
        for k in range(4):
            w[:, k] = (w[:, k] & 0x0FFF) | (((sane >> (4 * k)) & 0xF) << 12)
        raw[:, 48:56] = w.view(np.uint8)
    else:
        o = D_OFFSET.get(name, 0)
        raw[:, o : o + 2] = sane.view(np.uint8).reshape(-1, 2)
    raw[20:] = rng.integers(0, 256, raw[20:].shape, dtype=np.uint8)  # wholly random
    return raw.reshape(-1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--lib", default=DEFAULT_LIB)
    args = ap.parse_args()
    lib = ctypes.CDLL(args.lib)
    rng = np.random.default_rng(17)
    out = {}
    for name in TYPES:
        raw = blocks(name, rng)
        n = N_BLOCKS * GGML_BLOCK_SIZES[GGMLType[name]][0]
        y = np.zeros(n, np.float32)
        f = getattr(lib, f"dequantize_row_{name.lower()}")
        f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        f(raw.ctypes.data, y.ctypes.data, n)
        out[f"raw/{name}"], out[f"ggml/{name}"] = raw, y
    np.savez_compressed(OUT, **out)
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
