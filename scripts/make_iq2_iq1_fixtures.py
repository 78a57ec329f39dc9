"""Produce tests/fixtures/quants/iq2_iq1_quant.npz: ggml's bytes for IQ2_XXS, IQ2_XS, IQ2_S,
IQ1_S and IQ1_M quantization of a few small inputs.

Dev-only: calls ``ggml_quantize_chunk`` of a llama.cpp ``libggml-base.so`` through ctypes (in
a forked child: ggml aborts the process on some input); the tests read only the committed
fixture. Arrays: ``x`` (4 rows of 512: normal, heavy tailed and small, sparse with signed
zeros and an all-zero group, integers with ties next to tiny values), ``im`` (importance
per column), ``x_nan`` (one row with a NaN and an infinity), and per type ``<T>/im``
(ggml's bytes of ``x`` with ``im``), ``<T>`` (without: only the types ggml quantizes
without an importance matrix, IQ2_S and IQ1_M) and ``<T>/nan`` (its bytes of ``x_nan``
with the first 256 of ``im``, empty where ggml aborts).

    python scripts/make_iq2_iq1_fixtures.py [--lib PATH/libggml-base.so]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _ggml_quantize import DEFAULT_LIB, load, quantize_forked

OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "quants" / "iq2_iq1_quant.npz"
TYPES = ["IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M"]
WITHOUT_IMATRIX = {"IQ2_S", "IQ1_M"}  # the others: ggml_quantize_requires_imatrix


def inputs(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x = np.zeros((4, 512), np.float32)
    x[0] = rng.standard_normal(512)
    x[1] = rng.standard_t(2, 512) * 1e-3
    x[2] = np.where(rng.random(512) < 0.7, 0, rng.standard_normal(512))
    x[2, 64:96] = 0  # an all-zero group among non-zero ones
    x[2, 300:400:3] = -0.0
    x[3] = rng.integers(-3, 4, 512)
    x[3, 256:288] = rng.standard_normal(32) * 1e-9
    im = (rng.uniform(0, 2, 512) ** 2).astype(np.float32)
    im[::7] = 0  # columns no activation reached
    x_nan = rng.standard_normal((1, 256)).astype(np.float32)
    x_nan[0, 37] = np.nan
    x_nan[0, 200] = np.inf
    return x, im, x_nan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--lib", default=DEFAULT_LIB)
    args = ap.parse_args()
    lib = load(args.lib)
    x, im, x_nan = inputs(np.random.default_rng(29))
    out = {"x": x, "im": im, "x_nan": x_nan}
    for name in TYPES:
        cases = [(f"{name}/im", x, im), (f"{name}/nan", x_nan, im[: x_nan.shape[1]])]
        if name in WITHOUT_IMATRIX:
            cases.append((name, x, None))
        for key, xs, w in cases:
            q = quantize_forked(lib, name, xs, w)
            if q is None and key != f"{name}/nan":
                raise SystemExit(f"ggml aborted on {key}")
            out[key] = np.zeros(0, np.uint8) if q is None else q
            print(key, "aborts" if q is None else f"{q.size} bytes")
    np.savez_compressed(OUT, **out)
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
