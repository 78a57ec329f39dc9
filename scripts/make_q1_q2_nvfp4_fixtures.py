"""Produce tests/fixtures/quants/q1_q2_nvfp4.npz: ggml's bytes for Q1_0, Q2_0 and NVFP4
quantization of small hostile inputs, and ggml's floats for their dequantization.

Dev-only: calls ``ggml_quantize_chunk`` and ``dequantize_row_*`` of a llama.cpp
``libggml-base.so`` through ctypes; the tests read only the committed fixture. Arrays:
``x`` (8 rows of 512: normal; heavy tailed and small; sparse with signed zeros and all-zero
blocks; NaN, infinities, huge and denormal values; sub-blocks whose largest magnitudes sweep
UE4M3's subnormal, normal and saturating scales; all-equal blocks; random bit patterns; tiny
values), ``im`` (per column), per type ``<T>`` and ``<T>/im`` (ggml's bytes of ``x`` without
and with ``im``: ggml ignores it for these types), ``<T>/raw`` (64 blocks of random bytes,
f16 scales with inf, NaN, -0 and denormals; NVFP4 with every scale byte 0..255) and
``<T>/deq`` (ggml's ``dequantize_row_*`` of them); for the engine's kernels, ``act``
(3 tokens of 512 activations) and per type ``<T>/w`` (a random 24 x 512 weight of
``llamacpy.models.tiny.random_tensor``, seed 5) and ``<T>/dot`` (``[token, row]``: the x86
``ggml_vec_dot_<t>_q8_0`` of libggml-cpu, what llama.cpp's matmul runs for these types, of
each row with each token quantized by its ``quantize_row_q8_0``).

    python scripts/make_q1_q2_nvfp4_fixtures.py [--lib PATH/libggml-base.so]
"""

from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _ggml_quantize import DEFAULT_LIB, load, quantize_forked
from llamacpy.gguf import GGML_BLOCK_SIZES, GGMLType
from llamacpy.models.tiny import random_tensor

OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "quants" / "q1_q2_nvfp4.npz"
TYPES = ["Q1_0", "Q2_0", "NVFP4"]
N_BLOCKS = 64


def inputs(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    x = np.zeros((8, 512), np.float32)
    x[0] = rng.standard_normal(512)
    x[1] = rng.standard_t(2, 512) * 1e-3
    x[2] = np.where(rng.random(512) < 0.8, 0, rng.standard_normal(512))
    x[2, 128:256] = 0  # all-zero blocks among non-zero ones
    x[2, 300:420:2] = -0.0
    x[3] = rng.standard_normal(512)
    x[3, [3, 200, 301, 450]] = np.nan, np.inf, -np.inf, 1e30
    x[3, 384:448] = 3e38
    x[3, 130:140] = 1e-41
    # sub-block maxima from 2**-14 to 2**10: UE4M3 subnormal, normal and saturated scales
    scale = 2.0 ** np.linspace(-14, 10, 32)
    x[4] = (rng.uniform(-1, 1, (32, 16)) * scale[:, None]).reshape(-1)
    x[5, :128] = 0.75
    x[5, 128:256] = -3.5
    x[5, 256:384] = 1e-41
    x[5, 384:] = -0.0
    x[6] = rng.integers(0, 2**32, 512, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x[7] = rng.standard_normal(512) * 1e-9
    im = (rng.uniform(0, 2, 512) ** 2).astype(np.float32)
    return x, im


def raw_blocks(rng: np.random.Generator, name: str) -> np.ndarray:
    size = GGML_BLOCK_SIZES[GGMLType[name]][1]
    raw = rng.integers(0, 256, (N_BLOCKS, size), dtype=np.uint8)
    if name == "NVFP4":
        raw[:, :4] = np.arange(256, dtype=np.uint8).reshape(N_BLOCKS, 4)
    else:  # f16 scale: inf, NaN, -0, +0, denormals, largest
        d = raw[:, :2].copy().view("<u2")
        d[:8, 0] = [0x7C00, 0xFC00, 0x7E00, 0x8000, 0x0000, 0x0001, 0x83FF, 0x7BFF]
        raw[:, :2] = d.view(np.uint8)
    return raw.reshape(-1)


def dequantize_ggml(lib, name: str, raw: np.ndarray) -> np.ndarray:
    n = N_BLOCKS * GGML_BLOCK_SIZES[GGMLType[name]][0]
    f = getattr(lib, f"dequantize_row_{name.lower()}")
    f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    y = np.zeros(n, np.float32)
    f(raw.ctypes.data, y.ctypes.data, n)
    return y


def vec_dots(cpu, name: str, w: np.ndarray, act: np.ndarray, nrows: int) -> np.ndarray:
    """ggml's CPU ``vec_dot`` of every weight row with every token (float32 [tokens, rows])."""
    p, sz = ctypes.c_void_p, ctypes.c_size_t
    ncols = act.shape[1]
    qrow = cpu.quantize_row_q8_0
    qrow.argtypes = [p, p, ctypes.c_int64]
    dot = getattr(cpu, f"ggml_vec_dot_{name.lower()}_q8_0")
    dot.argtypes = [ctypes.c_int, p, sz, p, sz, p, sz, ctypes.c_int]
    row_bytes = w.size // nrows
    out = np.zeros((act.shape[0], nrows), np.float32)
    for t in range(act.shape[0]):
        xq = np.zeros(ncols // 32 * 34, np.uint8)
        qrow(act[t].ctypes.data, xq.ctypes.data, ncols)
        for r in range(nrows):
            s = np.zeros(1, np.float32)
            dot(ncols, s.ctypes.data, 0, w[r * row_bytes :].ctypes.data, 0, xq.ctypes.data, 0, 1)
            out[t, r] = s[0]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--lib", default=DEFAULT_LIB)
    args = ap.parse_args()
    lib = load(args.lib)
    cpu = ctypes.CDLL(str(Path(args.lib).with_name("libggml-cpu.so")))
    cpu.ggml_cpu_init()  # fills the f16 and UE4M3 tables vec_dot reads
    rng = np.random.default_rng(41)
    x, im = inputs(rng)
    act = np.random.default_rng(6).standard_normal((3, 512)).astype(np.float32)
    out = {"x": x, "im": im, "act": act}
    for name in TYPES:
        for key, w in ((name, None), (f"{name}/im", im)):
            q = quantize_forked(lib, name, x, w)
            if q is None:
                raise SystemExit(f"ggml aborted on {key}")
            out[key] = q
        out[f"{name}/raw"] = raw = raw_blocks(rng, name)
        out[f"{name}/deq"] = dequantize_ggml(lib, name, raw)
        out[f"{name}/w"] = w = random_tensor(np.random.default_rng(5), GGMLType[name], 24, 512)
        out[f"{name}/dot"] = vec_dots(cpu, name, w, out["act"], 24)
        print(name, out[name].size, "bytes;", out[f"{name}/deq"].size, "floats")
    np.savez_compressed(OUT, **out)
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
