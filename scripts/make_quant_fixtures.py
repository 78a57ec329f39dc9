"""Produce tests/fixtures/quants/llamacpp_quant.npz: what llama.cpp's quantizers output.

Dev-only: needs a llama.cpp build (libggml-base.so, called through ctypes) and the `gguf`
package; the tests read only the committed fixture. For every input set (random
distributions, edge cases, weights taken from the real models) and every type, with and
without an importance matrix, it stores a 64-bit hash of every output block, and the
RMSE of llama.cpp's dequantized output, so the tests can report block-level agreement
and compare errors without carrying megabytes of expected bytes.

    python scripts/make_quant_fixtures.py --lib /path/to/libggml-base.so
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
from pathlib import Path

import numpy as np
from gguf.quants import dequantize as gguf_dequantize

from llamacpy.gguf import GGML_BLOCK_SIZES, GGMLType, GGUFReader
from llamacpy.registry import resolve_model

DEFAULT_LIB = "/root/oracle/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/libggml-base.so"
OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "quants" / "llamacpp_quant.npz"
TYPES = [
    GGMLType.F16, GGMLType.BF16, GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1,
    GGMLType.Q8_0, GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K,
    GGMLType.IQ4_NL, GGMLType.IQ4_XS, GGMLType.MXFP4,
]  # fmt: skip
N_PER_ROW = 512


def block_hashes(raw: bytes, ggml_type: GGMLType) -> np.ndarray:
    """64-bit blake2b of every block (32-element chunks for the plain float types)."""
    block, nbytes = GGML_BLOCK_SIZES[ggml_type]
    if block == 1:
        nbytes *= 32
    n = len(raw) // nbytes
    return np.array(
        [
            int.from_bytes(
                hashlib.blake2b(raw[i * nbytes : (i + 1) * nbytes], digest_size=8).digest(),
                "little",
            )
            for i in range(n)
        ],
        dtype=np.uint64,
    )


def datasets(rng: np.random.Generator) -> dict[str, np.ndarray]:
    rows = 16
    shape = (rows, N_PER_ROW)
    sets = {
        "normal": rng.standard_normal(shape),
        "uniform": rng.uniform(-1, 1, shape),
        "student_t3": rng.standard_t(3, shape),
        "outliers": rng.standard_normal(shape) * np.where(rng.random(shape) < 0.01, 50.0, 1.0),
        "small_scale": rng.standard_normal(shape) * 1e-3,
        "large_scale": rng.standard_normal(shape) * 3e3,
        "positive": np.abs(rng.standard_normal(shape)) + 0.1,
    }
    edge = np.zeros((8, N_PER_ROW))
    edge[1] = 0.5
    edge[2] = -0.25
    edge[3, ::32] = rng.standard_normal(N_PER_ROW // 32)  # one value per 32-block
    edge[4] = rng.standard_normal(N_PER_ROW) * 1e-30  # scales underflow f16
    edge[5] = np.where(np.arange(N_PER_ROW) % 2, 1.0, -1.0) * 7.0
    edge[6] = rng.standard_normal(N_PER_ROW) * (rng.random(N_PER_ROW) < 0.1)  # sparse
    edge[7] = -np.abs(rng.standard_normal(N_PER_ROW))  # negative max magnitude
    sets["edge"] = edge
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in sets.items()}


def real_sets() -> dict[str, np.ndarray]:
    """Weights of the real models (dequantized): what requantizing a model sees."""
    out = {}
    picks = [
        ("smollm2-135m", "blk.0.ffn_down.weight", "smollm2_ffn_down"),
        ("smollm2-135m", "token_embd.weight", "smollm2_token_embd"),
        ("gemma3-270m", "blk.0.ffn_up.weight", "gemma3_ffn_up"),
        ("gemma3-270m", "blk.3.attn_v.weight", "gemma3_attn_v"),
    ]
    for model, tensor, name in picks:
        with GGUFReader(resolve_model(model)) as r:
            t = r.tensor(tensor)
            w = gguf_dequantize(np.asarray(t.raw).reshape(t.data.shape), int(t.type)).reshape(-1)
            out[name] = np.ascontiguousarray(w[: 32 * N_PER_ROW].reshape(32, N_PER_ROW), np.float32)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", default=DEFAULT_LIB, help="path to llama.cpp's libggml-base.so")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()

    lib = ctypes.CDLL(args.lib)
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [
        ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
        ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
    ]  # fmt: skip

    rng = np.random.default_rng(20261129)
    inputs = datasets(rng) | real_sets()
    arrays: dict[str, np.ndarray] = {}
    for name, x in inputs.items():
        arrays[f"input/{name}"] = x
        imatrix = (rng.chisquare(2, N_PER_ROW) + 1e-3).astype(np.float32)
        arrays[f"imatrix/{name}"] = imatrix
        for t in TYPES:
            for mode, im in (("plain", None), ("imatrix", imatrix)):
                block, nbytes = GGML_BLOCK_SIZES[t]
                dst = np.zeros(x.size // block * nbytes, dtype=np.uint8)
                written = lib.ggml_quantize_chunk(
                    int(t), x.ctypes.data, dst.ctypes.data, 0, x.shape[0], x.shape[1],
                    None if im is None else im.ctypes.data,
                )  # fmt: skip
                assert written == dst.size, (name, t, written, dst.size)
                key = f"{t.name}/{mode}/{name}"
                arrays[f"hash/{key}"] = block_hashes(dst.tobytes(), t)
                deq = gguf_dequantize(dst.reshape(x.shape[0], -1), int(t)).astype(np.float64)
                arrays[f"rmse/{key}"] = np.array(np.sqrt(np.mean((deq - x) ** 2)))
                if t in (GGMLType.Q4_0, GGMLType.Q8_0, GGMLType.Q4_K) and name == "normal":
                    arrays[f"bytes/{key}"] = dst  # a few full outputs, for debugging diffs
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **arrays)
    print(f"wrote {args.out}: {len(inputs)} input sets x {len(TYPES)} types x 2 modes")


if __name__ == "__main__":
    main()
