"""Quantized matmul kernels vs their float64 numpy twin, activation quantization vs its
twin, and the batch invariance the engine relies on (a token's result does not depend on
the other tokens of the ubatch)."""

from __future__ import annotations

import numpy as np
import pytest

from llamacpy.gguf import GGMLType
from llamacpy.models.tiny import random_tensor
from llamacpy.ops import formats, quantize_act, traits
from llamacpy.ops import matmul as M

TYPES = list(traits.supported_types())
ALL = M.FormatSet(TYPES)  # one compiled dispatcher for every test


def _weights(t: GGMLType, nrows: int, ncols: int, seed: int = 0):
    raw = random_tensor(np.random.default_rng(seed), t, nrows, ncols)
    packed = formats.repack(raw, t, nrows, ncols)
    desc = np.array([int(t), 0, nrows, ncols], np.int64)
    return packed, desc


def _run(packed, desc, x: np.ndarray, t0: int, t1: int, g0: int, g1: int, out=None):
    n, k = x.shape
    a = M.new_acts(n, k)
    M.prepare_acts(x, 0, n, k, M.act_need([GGMLType(int(desc[0]))]), a)
    if out is None:
        out = np.zeros((n, formats.n_groups(int(desc[2])) * 16), np.float32)
    M.matmul(ALL, packed, desc, a, t0, t1, g0, g1, out, t0, False)
    return out


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_matmul_matches_numpy_twin(t: GGMLType) -> None:
    nrows, ncols = 40, 512  # 3 row groups, the last one padded
    packed, desc = _weights(t, nrows, ncols)
    x = np.random.default_rng(1).standard_normal((7, ncols)).astype(np.float32)
    out = _run(packed, desc, x, 0, 7, 0, 3)[:, :nrows]
    ref = M.matmul_numpy(packed, t, nrows, ncols, x)
    tol = 2e-5 * np.abs(ref).max()
    np.testing.assert_allclose(out, ref, rtol=0, atol=tol)


@pytest.mark.parametrize(
    "t",
    [GGMLType.Q4_1, GGMLType.Q8_0, GGMLType.Q6_K, GGMLType.IQ4_NL, GGMLType.MXFP4, GGMLType.F16],
    ids=lambda t: t.name,
)
def test_results_do_not_depend_on_batch_or_row_split(t: GGMLType) -> None:
    nrows, ncols = 64, 768 if traits.get(t).layout.qk == 256 else 96
    packed, desc = _weights(t, nrows, ncols, seed=5)
    x = np.random.default_rng(2).standard_normal((6, ncols)).astype(np.float32)
    together = _run(packed, desc, x, 0, 6, 0, 4)
    for i in range(6):  # one token at a time, row groups in two calls
        out = np.zeros_like(together)
        _run(packed, desc, x, i, i + 1, 0, 1, out)
        _run(packed, desc, x, i, i + 1, 1, 4, out)
        np.testing.assert_array_equal(out[i], together[i])


def test_q4_k_groups_of_four_sum_as_ggml_gemm_and_singles_as_gemv() -> None:
    """llama.cpp runs Q4_K through repacked kernels: tokens in groups of four (gemm) add
    one product per 64 weights, the rest (gemv) one per super-block. Both are reproduced,
    so a token's last bits depend on its place in the batch exactly as in llama.cpp."""
    t, nrows, ncols = GGMLType.Q4_K, 64, 768
    packed, desc = _weights(t, nrows, ncols, seed=5)
    x = np.random.default_rng(2).standard_normal((6, ncols)).astype(np.float32)
    together = _run(packed, desc, x, 0, 6, 0, 4)  # tokens 0-3: a group; 4, 5: singles
    alone = np.zeros_like(together)
    for i in range(6):
        _run(packed, desc, x, i, i + 1, 0, 4, alone)
    np.testing.assert_array_equal(alone[4:], together[4:])
    np.testing.assert_allclose(alone[:4], together[:4], rtol=1e-5, atol=1e-5)
    assert (alone[:4] != together[:4]).any()  # the two orders do differ somewhere


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_invariant_kernels_give_every_token_its_single_token_result(t: GGMLType) -> None:
    """A deterministic context's kernels: a token's row is the same bits in a call of 11
    tokens (groups of four, pairs, the 8+-token paths) as alone, and alone it is the default
    kernel's single-token result (deterministic decoding is ordinary decoding). A format
    without a ``matmul_invariant`` kernel must be invariant as it is."""
    inv = M.FormatSet([t], invariant=True) if traits.get(t).matmul_invariant else ALL
    qk = traits.get(t).layout.qk
    nrows, ncols = 48, 768 if qk == 256 else (96 if qk <= 32 else 3 * qk)
    packed, desc = _weights(t, nrows, ncols, seed=9)
    x = np.random.default_rng(3).standard_normal((11, ncols)).astype(np.float32)
    a = M.new_acts(11, ncols)
    M.prepare_acts(x, 0, 11, ncols, M.act_need([t]), a)
    together, alone, plain = (np.zeros((11, 48), np.float32) for _ in range(3))
    M.matmul(inv, packed, desc, a, 0, 11, 0, 3, together, 0, False)
    for i in range(11):
        M.matmul(inv, packed, desc, a, i, i + 1, 0, 3, alone, i, False)
        M.matmul(ALL, packed, desc, a, i, i + 1, 0, 3, plain, i, False)
    np.testing.assert_array_equal(together, alone)
    np.testing.assert_array_equal(alone, plain)


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_gathered_rows_get_their_single_token_results(t: GGMLType) -> None:
    """``matmul_rows`` (one expert's rows of a mixture of experts): each gathered row, read
    from activation row ``a0 + r // adiv`` and written to ``o0 + r``, is the same bits as
    that token alone (11 rows: groups of four, a pair and a single), for every format
    (MXFP4's multi-token kernel; the others row by row); an empty row list is the range."""
    qk = traits.get(t).layout.qk
    nrows, ncols = 48, 768 if qk == 256 else (160 if qk <= 32 else 5 * qk)  # MXFP4: 5 blocks
    packed, desc = _weights(t, nrows, ncols, seed=11)
    x = np.random.default_rng(4).standard_normal((6, ncols)).astype(np.float32)
    a = M.new_acts(6, ncols)
    M.prepare_acts(x, 0, 6, ncols, M.act_need([t]), a)
    rows = np.array([0, 1, 3, 4, 6, 7, 9, 10, 12, 13, 15], np.int64)  # token r // 3 (of 2..7)
    got = np.zeros((17, 48), np.float32)
    M.matmul_rows(ALL, packed, desc, a, rows, len(rows), 3, 0, 0, 3, got, 1, False)
    want = np.zeros_like(got)
    for r in rows:
        M.matmul(ALL, packed, desc, a, r // 3, r // 3 + 1, 0, 3, want, 1 + r, False)
    np.testing.assert_array_equal(got, want)
    rng, alone = np.zeros((6, 48), np.float32), np.zeros((6, 48), np.float32)
    M.matmul_rows(ALL, packed, desc, a, rows[:0], 6, 1, 0, 0, 3, rng, 0, False)
    for i in range(6):
        M.matmul(ALL, packed, desc, a, i, i + 1, 0, 3, alone, i, False)
    np.testing.assert_array_equal(rng, alone)


def test_mxfp4_multi_token_kernel_at_extreme_scales() -> None:
    """MXFP4's multi-token kernel scales by ``ldexp(d_x, e - 128)`` where one token alone
    multiplies ``d_x`` by ``2**(e - 128)``: one rounding either way, the same bits, down to
    subnormal and up to overflowing scales."""
    t, nrows, ncols = GGMLType.MXFP4, 32, 96
    raw = random_tensor(np.random.default_rng(0), t, nrows, ncols).reshape(nrows, 3, 17)
    raw[:, :, 0] = np.array([0, 1, 2, 3, 60, 127, 128, 200, 254, 255], np.uint8)[
        np.arange(nrows * 3).reshape(nrows, 3) % 10
    ]
    packed = formats.repack(raw.reshape(-1), t, nrows, ncols)
    desc = np.array([int(t), 0, nrows, ncols], np.int64)
    x = np.random.default_rng(1).standard_normal((5, ncols)).astype(np.float32)
    x[1] *= np.float32(1e-4)
    x[2] *= np.float32(1e3)
    together = _run(packed, desc, x, 0, 5, 0, 2)
    for i in range(5):
        alone = np.zeros_like(together)
        _run(packed, desc, x, i, i + 1, 0, 2, alone)
        np.testing.assert_array_equal(together[i], alone[i])


def test_accumulate_mode_adds_to_output() -> None:
    packed, desc = _weights(GGMLType.Q4_0, 32, 64)
    x = np.random.default_rng(3).standard_normal((2, 64)).astype(np.float32)
    base = np.full((2, 32), 1.5, np.float32)
    a = M.new_acts(2, 64)
    M.prepare_acts(x, 0, 2, 64, M.NEED_Q8, a)
    plain = _run(packed, desc, x, 0, 2, 0, 2)
    M.matmul(ALL, packed, desc, a, 0, 2, 0, 2, base, 0, True)
    np.testing.assert_array_equal(base, np.float32(1.5) + plain)


def test_q8_quantization_matches_twin() -> None:
    x = np.random.default_rng(4).standard_normal((5, 256)).astype(np.float32)
    x[1, :32] = 0  # an all-zero block
    xq, xd, xs, xb = (
        np.zeros((5, 256), np.int8),
        np.zeros((5, 8), np.float32),
        np.zeros((5, 8), np.float32),
        np.zeros((5, 64), np.int32),
    )
    quantize_act.quantize_q8(x, 0, 5, 256, xq, xd, xs, xb)
    for got, want in zip((xq, xd, xs, xb), quantize_act.quantize_q8_numpy(x)):
        np.testing.assert_array_equal(got, want)


def test_q8k_quantization_matches_twin() -> None:
    x = np.random.default_rng(5).standard_normal((3, 512)).astype(np.float32)
    x[2, 256:] = 0
    xq, xd, xb = (
        np.zeros((3, 512), np.int8),
        np.zeros((3, 2), np.float32),
        np.zeros((3, 32), np.int32),
    )
    quantize_act.quantize_q8k(x, 0, 3, 512, xq, xd, xb)
    for got, want in zip((xq, xd, xb), quantize_act.quantize_q8k_numpy(x)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("mode", [2, 3, 4])
def test_float_activation_rounding_matches_twin(mode: int) -> None:
    x = np.random.default_rng(6).standard_normal((2, 64)).astype(np.float32) * 100
    out = np.zeros_like(x)
    quantize_act.round_activations(x, 0, 2, 64, mode, out)
    np.testing.assert_array_equal(out, quantize_act.round_activations_numpy(x, mode))
