"""Produce tests/fixtures/quantize/*: what llama-quantize writes for the real models.

Dev-only: needs a llama.cpp build (``llama-quantize``); the tests read only the committed
fixtures and regenerate our output to compare. For every case (a preset plus options) run on
SmolLM2 and Gemma-3 it stores the output's per-tensor types, the sha256 of the header
(metadata + tensor infos, i.e. every byte before the tensor data) and of the whole file, and
for the cases whose data the tests recompute, a short hash of every tensor's bytes plus, for
K-quant tensors of the Q4_K_M case, a 16-bit hash of every block (tests accept >= 99.9%
identical blocks there).

    python scripts/make_quantize_fixtures.py [--bin .../llama-quantize] [--only smollm2-135m]
        [--cases TQ1_0 TQ2_0]

With ``--cases`` only those cases run, and their entries replace (or join) the ones in the
existing fixture files.

Importance-matrix cases use small synthetic imatrix files (GGUF and legacy) built by
:func:`write_imatrix_files` from a formula, so the tests can rebuild them byte for byte.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from llamacpy.gguf import GGML_BLOCK_SIZES, GGMLType, GGUFReader, GGUFValueType, GGUFWriter
from llamacpy.registry import resolve_model

DEFAULT_BIN = "/root/oracle/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/llama-quantize"
OUT_DIR = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "quantize"
MODELS = ("smollm2-135m", "gemma3-270m")
PRESETS = [
    "F16",
    "BF16",
    "Q8_0",
    "Q4_0",
    "Q4_1",
    "Q5_0",
    "Q5_1",
    "Q2_K",
    "Q3_K_S",
    "Q3_K_M",
    "Q3_K_L",
    "Q4_K_S",
    "Q4_K_M",
    "Q5_K_S",
    "Q5_K_M",
    "Q6_K",
    "IQ4_NL",
    "IQ4_XS",
    "COPY",
    "TQ1_0",
    "TQ2_0",
    "Q2_0",
]
# presets llama-quantize runs on one model only: Q1_0 has no fallback type, and SmolLM2's
# rows of 576 are not a multiple of its 128 (both tools refuse it, tests/test_quantize_tool)
MODEL_PRESETS = {"smollm2-135m": [], "gemma3-270m": ["Q1_0"]}
IMATRIX_GGUF = "synthetic.imatrix.gguf"
IMATRIX_DAT = "synthetic.imatrix.dat"
IMATRIX_LAYERS = 3  # entries for blocks 0..2 only (the rest quantize without one)

# name -> (options before IN, preset)
OPTION_CASES: dict[str, tuple[list[str], str]] = {
    "pure-Q4_K_M": (["--pure"], "Q4_K_M"),
    "leave-output-Q4_K_M": (["--leave-output-tensor"], "Q4_K_M"),
    "output-type-Q4_0": (["--output-tensor-type", "q4_0"], "Q4_0"),
    "token-embd-type-Q4_K_M": (["--token-embedding-type", "q5_0"], "Q4_K_M"),
    "tensor-type-Q4_K_M": (
        ["--tensor-type", "attn_v=q8_0", "--tensor-type", "BLK\\.1[0-9]\\.ffn_down=q5_1"],
        "Q4_K_M",
    ),
    "override-kv-Q8_0": (
        [
            "--override-kv",
            "general.name=str:requantized by a test",
            "--override-kv",
            "general.file_type=int:7",
            "--override-kv",
            "test.negative=int:-4096",
            "--override-kv",
            "test.float=float:0.25",
            "--override-kv",
            "test.flag=bool:true",
        ],
        "Q8_0",
    ),
    "imatrix-Q4_K_M": (["--imatrix", IMATRIX_GGUF], "Q4_K_M"),
    "imatrix-Q4_0": (["--imatrix", IMATRIX_GGUF], "Q4_0"),
    "imatrix-dat-IQ4_NL": (["--imatrix", IMATRIX_DAT], "IQ4_NL"),
    # NVFP4 has no preset: the attention and FFN matrices through --tensor-type
    "tensor-type-NVFP4": (["--tensor-type", "attn=nvfp4", "--tensor-type", "ffn=nvfp4"], "Q8_0"),
}
# cases whose data the tests recompute: per-tensor hashes (and K-quant block hashes)
DATA_CASES = {
    "smollm2-135m": {
        "Q8_0",
        "Q4_0",
        "Q4_K_M",
        "imatrix-Q4_K_M",
        "imatrix-dat-IQ4_NL",
        "F16",
        "TQ1_0",
        "TQ2_0",
        "Q2_0",
        "tensor-type-NVFP4",
    },
    "gemma3-270m": {"Q1_0"},
}
BLOCK_CASES = {"Q4_K_M"}  # cases whose K-quant tensors get per-block hashes
K_QUANTS = {GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K}
K_QUANTS |= {GGMLType.IQ4_XS}


# --------------------------------------------------------------------------- imatrix
def synthetic_imatrix(path: str | os.PathLike[str]) -> dict[str, tuple[np.ndarray, int]]:
    """name -> (sums of squared activations as (n_mat, ne0), count) for the first blocks'
    2-D weights: smooth, positive, deterministic values (no RNG, so any numpy rebuilds them)."""
    out = {}
    with GGUFReader(path) as r:
        for i, t in enumerate(sorted(r.tensors, key=lambda t: t.name)):
            if not t.name.startswith(tuple(f"blk.{b}." for b in range(IMATRIX_LAYERS))):
                continue
            if len(t.shape) < 2 or "norm" in t.name:
                continue
            ne0 = t.shape[0]
            j = np.arange(ne0, dtype=np.float64)
            v = 1.0 + 0.75 * np.sin(j * 0.37 + i) ** 2 + (j % 7) * 0.125
            count = 100 + 10 * i
            out[t.name] = ((v * count).astype(np.float32).reshape(1, ne0), count)
    return out


def write_imatrix_files(model_path: str | os.PathLike[str], directory: Path) -> None:
    """Write IMATRIX_GGUF and IMATRIX_DAT for a model into ``directory``."""
    data = synthetic_imatrix(model_path)
    w = GGUFWriter(directory / IMATRIX_GGUF)
    w.add("general.type", "imatrix")
    w.add("imatrix.datasets", ["synthetic-dataset.txt"], GGUFValueType.ARRAY, GGUFValueType.STRING)
    w.add("imatrix.chunk_count", 42, GGUFValueType.UINT32)
    w.add("imatrix.chunk_size", 512, GGUFValueType.UINT32)
    for name, (sums, count) in data.items():
        w.add_tensor(f"{name}.in_sum2", GGMLType.F32, (sums.shape[1], sums.shape[0]), sums)
        counts = np.full((sums.shape[0], 1), float(count), dtype=np.float32)
        w.add_tensor(f"{name}.counts", GGMLType.F32, (1, sums.shape[0]), counts)
    w.write()
    # legacy: values stored as (sum / count) * ncall
    parts = [struct.pack("<i", len(data))]
    for name, (sums, count) in data.items():
        ncall = 3
        vals = (sums.reshape(-1) / np.float32(count) * np.float32(ncall)).astype("<f4")
        raw = name.encode()
        parts += [struct.pack("<i", len(raw)), raw, struct.pack("<ii", ncall, vals.size)]
        parts.append(vals.tobytes())
    ds = b"legacy-dataset.txt"
    parts += [struct.pack("<i", 17), struct.pack("<i", len(ds)), ds]
    (directory / IMATRIX_DAT).write_bytes(b"".join(parts))


# --------------------------------------------------------------------------- hashing
def sha256_file(path: Path, start: int = 0, end: int | None = None) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(start)
        remaining = (end - start) if end is not None else None
        while True:
            n = 1 << 20 if remaining is None else min(1 << 20, remaining)
            if n == 0:
                break
            block = f.read(n)
            if not block:
                break
            h.update(block)
            if remaining is not None:
                remaining -= len(block)
    return h.hexdigest()


def short_hash(raw: np.ndarray) -> str:
    return hashlib.sha256(raw.tobytes()).hexdigest()[:16]


def block_hashes(raw: np.ndarray, ggml_type: GGMLType) -> np.ndarray:
    """16-bit blake2b of every block of a tensor's bytes (enough to count agreeing blocks)."""
    size = GGML_BLOCK_SIZES[ggml_type][1]
    b = raw.reshape(-1, size)
    return np.array(
        [int.from_bytes(hashlib.blake2b(r.tobytes(), digest_size=2).digest(), "little") for r in b],
        dtype=np.uint16,
    )


def header_size(r: GGUFReader) -> int:
    t = r.tensors[0]
    return t.data_offset - t.offset


# --------------------------------------------------------------------------- driver
def run_case(binary: str, model: Path, out: Path, opts: list[str], preset: str, cwd: Path) -> float:
    cmd = [binary, "--allow-requantize", *opts, str(model), str(out), preset, "2"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return time.perf_counter() - t0


def describe(out: Path, with_data: bool, blocks: dict[str, np.ndarray], case: str) -> dict:
    with GGUFReader(out) as r:
        hsize = header_size(r)
        entry = {
            "types": " ".join(GGMLType(t.type).name for t in r.tensors),
            "header_size": hsize,
            "header_sha256": sha256_file(out, 0, hsize),
            "file_size": out.stat().st_size,
            "file_sha256": sha256_file(out),
        }
        if with_data:
            entry["tensor_sha"] = [short_hash(t.raw) for t in r.tensors]
            for t in r.tensors:
                if case in BLOCK_CASES and t.type in K_QUANTS:
                    blocks[f"{case}/{t.name}"] = block_hashes(t.raw, t.type)
    return entry


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=DEFAULT_BIN, help="llama-quantize")
    ap.add_argument("--only", choices=MODELS, action="append", help="model(s) to do")
    ap.add_argument("--cases", nargs="+", help="only these cases, merged into the fixtures")
    args = ap.parse_args()
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for name in args.only or MODELS:
        model = resolve_model(name)
        cases = {p: ([], p) for p in PRESETS + MODEL_PRESETS[name]} | OPTION_CASES
        result: dict = {"model": name, "input_sha256": sha256_file(model), "cases": {}}
        blocks: dict[str, np.ndarray] = {}
        path, blocks_path = OUT_DIR / f"{name}.json", OUT_DIR / f"{name}.blocks.npz"
        if args.cases:
            unknown = set(args.cases) - set(cases)
            if unknown:
                sys.exit(f"unknown cases: {sorted(unknown)}")
            cases = {c: cases[c] for c in args.cases}
            old = json.loads(path.read_text())
            if old["input_sha256"] != result["input_sha256"]:
                sys.exit(f"{path} was made from another input file")
            result |= {"tensors": old["tensors"], "cases": old["cases"]}
            if blocks_path.exists():
                with np.load(blocks_path) as f:
                    blocks = {k: f[k] for k in f.files if k.split("/")[0] not in cases}
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            write_imatrix_files(model, work)
            for case, (opts, preset) in cases.items():
                out = work / "out.gguf"
                secs = run_case(args.bin, model, out, opts, preset, work)
                entry = describe(out, case in DATA_CASES[name], blocks, case)
                entry |= {"args": [*opts, preset], "llama_quantize_seconds": round(secs, 3)}
                if "tensors" not in result:
                    with GGUFReader(out) as r:
                        result["tensors"] = [[t.name, list(t.shape)] for t in r.tensors]
                if opts:  # the metadata keys, to explain a header mismatch
                    with GGUFReader(out) as r:
                        entry["keys"] = list(r.fields)
                result["cases"][case] = entry
                print(f"{name} {case}: {secs:.2f} s", file=sys.stderr)
                out.unlink()
        path.write_text(json.dumps(result, indent=1) + "\n")
        if blocks:
            np.savez_compressed(blocks_path, **blocks)
        print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
