"""Optional: every quantizer and dequantizer against a libggml-base shared library, in-process.

Set ``LLAMACPY_LIBGGML_BASE`` to a ``libggml-base.so`` built from llama.cpp (e.g.
``vendor/llama.cpp/build/bin/libggml-base.so``) to run; skipped otherwise. Compares bytes for
random and adversarial data (signed zeros, denormals, huge values, ties), with and without
importance weights, through ``ggml_quantize_chunk`` (what llama-quantize calls).
"""

from __future__ import annotations

import ctypes
import os
import signal

import numpy as np
import pytest

import llamacpy.quants as Q
from llamacpy.gguf.constants import GGMLType

LIB_PATH = os.environ.get("LLAMACPY_LIBGGML_BASE", "")
pytestmark = [
    pytest.mark.skipif(not os.path.isfile(LIB_PATH), reason="LLAMACPY_LIBGGML_BASE not set"),
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
]

CHUNK = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
         "IQ4_NL", "IQ4_XS", "MXFP4", "F16", "BF16"]  # fmt: skip
CHUNK += ["TQ1_0", "TQ2_0", "NVFP4", "Q1_0", "Q2_0"]  # importance weights: ignored by ggml
# ggml aborts the process on some input of these (NaN, inf, overflowing magnitudes), where
# ours raise QuantError: ggml runs them in a forked child
ABORTING = ["IQ3_XXS", "IQ3_S", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M"]
# ggml_quantize_requires_imatrix: ggml asserts without one, ours raise QuantError
NEEDS_IMATRIX = {"IQ2_XXS", "IQ2_XS", "IQ1_S"}
ROW_REF = {"Q8_1": "q8_1", "Q8_K": "q8_K"}  # not in ggml_quantize_chunk


@pytest.fixture(scope="module")
def lib():
    lib = ctypes.CDLL(LIB_PATH)
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, p, p, i64, i64, i64, p]
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_fp32_to_fp16_row.argtypes = [p, p, i64]
    lib.ggml_quantize_init.argtypes = [ctypes.c_int]
    return lib


def _ptr(a: np.ndarray) -> int:
    return a.ctypes.data


def ggml_quantize(lib, x: np.ndarray, name: str, imatrix=None) -> np.ndarray:
    fmt = Q.get(name)
    out = np.zeros(x.shape[0] * fmt.row_nbytes(x.shape[1]), np.uint8)
    im = None if imatrix is None else _ptr(imatrix)
    lib.ggml_quantize_chunk(int(GGMLType[name]), _ptr(x), _ptr(out), 0, *x.shape, im)
    return out.reshape(x.shape[0], -1)


def ggml_row_fn(lib, fn: str, src: np.ndarray, dst: np.ndarray, n: int) -> np.ndarray:
    f = getattr(lib, fn)
    f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    f(_ptr(src), _ptr(dst), n)
    return dst


def datasets() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    g = rng.standard_normal((8, 512)).astype(np.float32)
    d = {f"normal*{s:g}": (g * np.float32(s)).astype(np.float32) for s in (1e-38, 1e-20, 1, 1e30)}
    z = np.zeros((4, 512), np.float32)
    z[1] = -0.0
    z[2, ::3] = -0.0
    z[2, 100] = 1.0
    z[3, ::5] = -0.0
    z[3, 7] = -4.0
    d["signed_zeros"] = z
    t = g.copy()
    t[:, 10], t[:, 11] = 9, -9
    d["ties"] = t
    d["heavy_tail"] = rng.standard_t(1.5, (8, 512)).astype(np.float32)
    d["sparse"] = np.where(rng.random((8, 512)) < 0.95, 0, g).astype(np.float32)
    d["const"] = np.full((2, 512), -1.25, np.float32)
    d["denormal_only"] = (g * np.float32(1e-41)).astype(np.float32)
    # inf / NaN / huge entries: C divides into inf/NaN where numba's default raised
    f = g.copy()
    f[0, 3], f[1, 40], f[2, 7], f[3, 100] = np.inf, -np.inf, np.nan, 1e30
    f[4], f[5, ::2], f[6, 300:330], f[7] = 1e30, np.nan, 3e38, -np.inf
    d["non_finite"] = f
    return d


DATA = datasets()


@pytest.mark.parametrize("name", CHUNK)
@pytest.mark.parametrize("case", sorted(DATA))
def test_quantize_chunk_matches_ggml(lib, name, case):
    x = DATA[case]
    assert np.array_equal(Q.quantize(x, name), ggml_quantize(lib, x, name)), "no imatrix"
    im = (np.random.default_rng(1).uniform(0, 2, x.shape[1]) ** 2).astype(np.float32)
    assert np.array_equal(Q.quantize(x, name, imatrix=im), ggml_quantize(lib, x, name, im))


def ggml_quantize_forked(lib, x: np.ndarray, name: str, imatrix=None) -> np.ndarray | None:
    """``ggml_quantize``, run in a forked child: None where ggml aborted."""
    lib.ggml_quantize_init(int(GGMLType[name]))  # the tables are built before the fork
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.environ["GGML_NO_BACKTRACE"] = "1"
            with os.fdopen(w, "wb") as f:
                f.write(ggml_quantize(lib, x, name, imatrix).tobytes())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGABRT:
        return None
    assert status == 0
    return np.frombuffer(data, np.uint8).reshape(x.shape[0], -1)


@pytest.mark.parametrize("name", ABORTING)
@pytest.mark.parametrize("case", sorted(DATA))
def test_quantize_chunk_matches_ggml_or_both_refuse(lib, name, case):
    """ggml's bytes wherever ggml has them; QuantError on exactly the rows ggml aborts on."""
    x = DATA[case]
    im = (np.random.default_rng(1).uniform(0, 2, x.shape[1]) ** 2).astype(np.float32)
    for qw in (im,) if name in NEEDS_IMATRIX else (None, im):
        ref = ggml_quantize_forked(lib, x, name, qw)
        if ref is not None:
            assert np.array_equal(Q.quantize(x, name, imatrix=qw), ref)
            continue
        for r in range(x.shape[0]):  # row by row: which rows ggml aborts on
            row = x[r : r + 1]
            ref = ggml_quantize_forked(lib, row, name, qw)
            if ref is None:
                with pytest.raises(Q.QuantError, match="aborts"):
                    Q.quantize(row, name, imatrix=qw)
            else:
                assert np.array_equal(Q.quantize(row, name, imatrix=qw), ref), (r, qw is None)


@pytest.mark.parametrize("name", sorted(NEEDS_IMATRIX))
def test_quantize_chunk_needs_an_imatrix_for_some_grid_formats(lib, name):
    x = DATA["normal*1"]
    assert ggml_quantize_forked(lib, x, name) is None  # ggml_quantize_chunk asserts
    with pytest.raises(Q.QuantError, match=f"{name}: quantizing needs an importance matrix"):
        Q.quantize(x, name)


@pytest.mark.parametrize("name", sorted(ROW_REF))
@pytest.mark.parametrize("case", sorted(DATA))
def test_row_ref_quantizers_match_ggml(lib, name, case):
    x = DATA[case]
    out = np.zeros(x.shape[0] * Q.get(name).row_nbytes(x.shape[1]), np.uint8)
    ref = ggml_row_fn(lib, f"quantize_row_{ROW_REF[name]}_ref", x, out, x.size)
    assert np.array_equal(Q.quantize(x, name).reshape(-1), ref)


def test_iq4_nl_row_ref_matches_ggml(lib):
    x = DATA["normal*1"]
    out = np.zeros(x.size // 32 * 18, np.uint8)
    ref = ggml_row_fn(lib, "quantize_row_iq4_nl_ref", x, out, x.size)
    assert np.array_equal(Q.iq4_nl.quantize_row_ref(x).reshape(-1), ref)


DEQUANT = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
           "Q8_K", "IQ4_NL", "IQ4_XS", "MXFP4", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS",
           "IQ3_S", "IQ1_S", "IQ1_M", "TQ1_0", "TQ2_0", "NVFP4", "Q1_0", "Q2_0"]  # fmt: skip


@pytest.mark.parametrize("name", DEQUANT)
def test_dequantize_matches_ggml(lib, name):
    fmt = Q.get(name)
    rng = np.random.default_rng(3)
    raw = rng.integers(0, 256, 64 * fmt.type_size, dtype=np.uint8)
    n = 64 * fmt.block_size
    ref = ggml_row_fn(lib, f"dequantize_row_{name.lower().replace('_k', '_K')}", raw,
                      np.zeros(n, np.float32), n)  # fmt: skip
    ours = fmt.dequantize(raw, n)
    same = (ours.view(np.uint32) == ref.view(np.uint32)) | (np.isnan(ours) & np.isnan(ref))
    assert same.all()


def test_fp16_conversion_matches_ggml(lib):
    bits = np.random.default_rng(0).integers(0, 2**32, 1 << 20, dtype=np.uint64)
    x = bits.astype(np.uint32).view(np.float32)
    ref = ggml_row_fn(lib, "ggml_fp32_to_fp16_row", x, np.zeros(x.size, np.uint16), x.size)
    assert np.array_equal(Q.quantize(x, "F16").view(np.uint16), ref)
    halves = np.arange(1 << 16, dtype=np.uint16)
    ref32 = ggml_row_fn(lib, "ggml_fp16_to_fp32_row", halves, np.zeros(1 << 16, np.float32),
                        1 << 16)  # fmt: skip
    assert np.array_equal(Q.dequantize(halves, "F16").view(np.uint32), ref32.view(np.uint32))
