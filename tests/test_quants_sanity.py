"""Round-trip sanity of the quantizers gguf-py cannot check (K-quants, IQ4, Q8_1, Q8_K), and
of MXFP4.

Bit-exactness of these against llama.cpp is covered by ``test_quants_ggml.py`` when a
libggml-base is available; here: error levels, determinism, stability, imatrix effect.
"""

from __future__ import annotations

import numpy as np
import pytest

import llamacpy.quants as Q

# relative RMSE of dequantize(quantize(x)) on Gaussian data: (bound, bits per weight)
EXPECTED = {
    "Q2_K": (0.32, 2.625),
    "Q3_K": (0.17, 3.4375),
    "Q4_K": (0.080, 4.5),
    "Q5_K": (0.040, 5.5),
    "Q6_K": (0.020, 6.5625),
    "Q8_K": (0.008, 9.125),
    "IQ4_NL": (0.085, 4.5),
    "IQ4_XS": (0.085, 4.25),
    "MXFP4": (0.13, 4.25),  # a power-of-two scale from |max|, no search
    "Q4_0": (0.095, 4.5),
    "Q4_1": (0.085, 5.0),
    "Q5_0": (0.047, 5.5),
    "Q5_1": (0.042, 6.0),
    "Q8_0": (0.006, 8.5),
    "Q8_1": (0.006, 9.0),
}
# a constant 0.3 comes back within this relative error (MXFP4's grid steps from 8 to 12
# times its power-of-two scale: 0.3 becomes 0.25)
CONST_RTOL = {"MXFP4": 0.2}
WITH_IMATRIX = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
                "IQ4_NL", "IQ4_XS"]  # fmt: skip


@pytest.fixture(scope="module")
def gaussian() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((32, 1024)).astype(np.float32)


def rel_rmse(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sqrt(np.mean((a - b) ** 2)) / np.sqrt(np.mean(b**2)))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_round_trip_error_matches_bits(name, gaussian):
    fmt = Q.get(name)
    bound, bpw = EXPECTED[name]
    assert 8 * fmt.type_size / fmt.block_size == bpw
    q = fmt.quantize(gaussian)
    y = fmt.dequantize(q, gaussian.size).reshape(gaussian.shape)
    err = rel_rmse(y, gaussian)
    assert bound / 2 < err < bound, err
    # scale invariance (up to fp16 rounding of the scales)
    y2 = fmt.dequantize(fmt.quantize(gaussian * 1000), gaussian.size).reshape(gaussian.shape)
    assert abs(rel_rmse(y2, gaussian * 1000) - err) < 0.1 * err


def test_error_decreases_with_bits(gaussian):
    errs = []
    for name in ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K"]:
        fmt = Q.get(name)
        y = fmt.dequantize(fmt.quantize(gaussian), gaussian.size).reshape(gaussian.shape)
        errs.append(rel_rmse(y, gaussian))
    assert errs == sorted(errs, reverse=True)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_deterministic_and_requantization_stable(name, gaussian):
    fmt = Q.get(name)
    x = gaussian[:8]
    q = fmt.quantize(x)
    assert np.array_equal(q, fmt.quantize(x.copy()))
    y = fmt.dequantize(q, x.size).reshape(x.shape)
    q2 = fmt.quantize(y)
    y2 = fmt.dequantize(q2, x.size).reshape(x.shape)
    # quantizing the grid points again lands on (nearly) the same grid
    assert rel_rmse(y2, y) <= 0.25 * rel_rmse(y, x)
    assert np.mean(q2 == q) > 0.85


@pytest.mark.parametrize("name", WITH_IMATRIX)
def test_imatrix_lowers_weighted_error(name, gaussian):
    fmt = Q.get(name)
    rng = np.random.default_rng(1)
    im = (rng.uniform(0.01, 10, gaussian.shape[1]) ** 2).astype(np.float32)

    def weighted_err(q):
        y = fmt.dequantize(q, gaussian.size).reshape(gaussian.shape)
        return float(np.sum(im * np.mean((y - gaussian) ** 2, axis=0)))

    assert weighted_err(fmt.quantize(gaussian, im)) < weighted_err(fmt.quantize(gaussian))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_special_inputs(name):
    fmt = Q.get(name)
    n = 2 * fmt.block_size * (256 // fmt.block_size)
    zeros = np.zeros((2, n // 2), np.float32)
    assert not fmt.dequantize(fmt.quantize(zeros), n).any()
    const = np.full((2, n // 2), 0.3, np.float32)
    y = fmt.dequantize(fmt.quantize(const), n)
    assert np.allclose(y, 0.3, rtol=CONST_RTOL.get(name, 0.08))
    one_hot = zeros.copy()
    one_hot[:, 5] = -2.0
    y = fmt.dequantize(fmt.quantize(one_hot), n).reshape(one_hot.shape)
    assert np.allclose(y, one_hot, atol=0.1)


def test_q8_1_sum_field_and_q8_k_bsums():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 256)).astype(np.float32)
    b = Q.quantize(x, "Q8_1").reshape(-1).view(Q.get("Q8_1").block_dtype)
    s = b["qs"].astype(np.float32).sum(axis=1) * b["d"].astype(np.float32)
    assert np.allclose(b["s"].astype(np.float32), s, rtol=1e-3)
    k = Q.quantize(x, "Q8_K").reshape(-1).view(Q.get("Q8_K").block_dtype)
    assert np.array_equal(k["bsums"], k["qs"].reshape(-1, 16, 16).sum(axis=2))
    assert np.array_equal(np.abs(k["qs"]).max(axis=1), np.full(4, 127))


def test_iq4_nl_row_ref_variant():
    fmt = Q.get("IQ4_NL")
    x = np.random.default_rng(3).standard_normal((4, 256)).astype(np.float32)
    q_ref = Q.iq4_nl.quantize_row_ref(x)
    assert q_ref.shape == (4, 8 * 18)
    y_ref = fmt.dequantize(q_ref, x.size).reshape(x.shape)
    y = fmt.dequantize(fmt.quantize(x), x.size).reshape(x.shape)
    assert rel_rmse(y, x) <= rel_rmse(y_ref, x) < 0.1  # the scale search only helps
