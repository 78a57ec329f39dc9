"""Quantizers against llama.cpp's own output (fixture made by scripts/make_quant_fixtures.py).

For every input set and type, with and without an importance matrix: the share of output
blocks byte-identical to llama.cpp's, and the RMSE of our dequantized result against
llama.cpp's. Simple formats and MXFP4 must be identical everywhere; K-quants and IQ4 at least
99.9% of blocks, with an error no worse than llama.cpp's.
"""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from llamacpy import quants
from llamacpy.gguf import GGML_BLOCK_SIZES, GGMLType

FIXTURE = Path(__file__).parent / "fixtures" / "quants" / "llamacpp_quant.npz"
EXACT = {"F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "MXFP4"}


@cache
def _fixture() -> dict[str, np.ndarray]:
    with np.load(FIXTURE) as z:
        return {k: z[k] for k in z.files}


def _cases() -> list[tuple[str, str, str]]:
    keys = [k.split("/", 1)[1] for k in _fixture() if k.startswith("hash/")]
    return sorted(tuple(k.split("/")) for k in keys)  # (type, mode, dataset)


def _block_hashes(raw: bytes, t: GGMLType) -> np.ndarray:
    block, nbytes = GGML_BLOCK_SIZES[t]
    if block == 1:
        nbytes *= 32
    return np.array(
        [
            int.from_bytes(hashlib.blake2b(raw[i : i + nbytes], digest_size=8).digest(), "little")
            for i in range(0, len(raw), nbytes)
        ],
        dtype=np.uint64,
    )


def _ours(type_name: str, mode: str, dataset: str) -> tuple[np.ndarray, np.ndarray]:
    fx = _fixture()
    x = fx[f"input/{dataset}"]
    im = fx[f"imatrix/{dataset}"] if mode == "imatrix" else None
    fmt = quants.get(type_name)
    q = np.ascontiguousarray(fmt.quantize(x, imatrix=im))
    return x, q


TYPES = sorted({c[0] for c in _cases()})


@pytest.mark.parametrize("type_name", TYPES)
def test_quantize_matches_llamacpp(type_name: str) -> None:
    t = GGMLType[type_name]
    total = same = 0
    worse = []
    for tn, mode, dataset in _cases():
        if tn != type_name:
            continue
        x, q = _ours(tn, mode, dataset)
        expected = _fixture()[f"hash/{tn}/{mode}/{dataset}"]
        got = _block_hashes(q.tobytes(), t)
        assert got.shape == expected.shape, (mode, dataset)
        total += got.size
        same += int((got == expected).sum())
        ours = quants.get(tn).dequantize(q.reshape(-1), x.size).astype(np.float64)
        rmse = float(np.sqrt(np.mean((ours - x.reshape(-1)) ** 2)))
        ref = float(_fixture()[f"rmse/{tn}/{mode}/{dataset}"])
        if rmse > ref * (1 + 1e-6) + 1e-30:
            worse.append(f"{mode}/{dataset}: ours {rmse:.6g} > llama.cpp {ref:.6g}")
    share = same / total
    print(f"{type_name}: {same}/{total} blocks identical ({share:.4%})")
    if type_name in EXACT:
        assert same == total, f"{type_name}: {total - same} of {total} blocks differ"
    else:
        assert share >= 0.999, f"{type_name}: only {share:.4%} of blocks identical"
        assert not worse, "\n".join(worse)
