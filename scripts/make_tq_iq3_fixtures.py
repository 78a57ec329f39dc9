"""Produce tests/fixtures/quants/tq_iq3_quant.npz: ggml's bytes for TQ1_0, TQ2_0, IQ3_XXS and
IQ3_S quantization of a few small inputs, with and without an importance matrix.

Dev-only: calls ``ggml_quantize_chunk`` of a llama.cpp ``libggml-base.so`` through ctypes;
the tests read only the committed fixture. Arrays: ``x`` (4 rows of 512: normal, heavy
tailed, sparse with signed zeros and all-zero sub-blocks, tiny and constant sub-blocks),
``im`` (per column), ``x_nan`` (one row with a NaN), and per type ``<T>`` and ``<T>/im``
(ggml's bytes of ``x``) and ``<T>/nan`` (its bytes of ``x_nan``, empty where ggml aborts
the process on it: the IQ3 types, whose neighbour search finds no finite distance).

    python scripts/make_tq_iq3_fixtures.py [--lib PATH/libggml-base.so]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _ggml_quantize import DEFAULT_LIB, load, quantize_forked

OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "quants" / "tq_iq3_quant.npz"
TYPES = ["TQ1_0", "TQ2_0", "IQ3_XXS", "IQ3_S"]


def inputs(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x = np.zeros((4, 512), np.float32)
    x[0] = rng.standard_normal(512)
    x[1] = rng.standard_t(2, 512) * 1e-3
    x[2] = np.where(rng.random(512) < 0.8, 0, rng.standard_normal(512))
    x[2, 64:96] = 0  # an all-zero sub-block among non-zero ones
    x[2, 300:400] = -0.0
    x[3, :256] = rng.standard_normal(256) * 1e-9  # below IQ3_XXS's group threshold
    x[3, 256:288] = 0.75
    x[3, 288:] = rng.uniform(-2, 2, 224)
    im = (rng.uniform(0, 2, 512) ** 2).astype(np.float32)
    x_nan = rng.standard_normal((1, 256)).astype(np.float32)
    x_nan[0, 37] = np.nan
    return x, im, x_nan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--lib", default=DEFAULT_LIB)
    args = ap.parse_args()
    lib = load(args.lib)
    x, im, x_nan = inputs(np.random.default_rng(23))
    out = {"x": x, "im": im, "x_nan": x_nan}
    for name in TYPES:
        for key, xs, w in ((name, x, None), (f"{name}/im", x, im), (f"{name}/nan", x_nan, None)):
            q = quantize_forked(lib, name, xs, w)
            if q is None and key != f"{name}/nan":
                raise SystemExit(f"ggml aborted on {key}")
            out[key] = np.zeros(0, np.uint8) if q is None else q
            print(key, "aborts" if q is None else f"{q.size} bytes")
    np.savez_compressed(OUT, **out)
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
