"""Q1_0, Q2_0 and NVFP4 kernels (``ops/qdot_bits``): bit for bit against libggml-cpu's x86
``vec_dot`` (fixture from scripts/make_q1_q2_nvfp4_fixtures.py) and against numpy references
of those ``vec_dot`` (ggml's lanes and float order: integer sums exact, float operations one
by one), at token counts that take every path of the drivers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import llamacpy.quants as Q
from ggml_float import fma32 as _fma
from ggml_float import hsum_float_8 as _hsum8
from llamacpy.gguf import GGMLType
from llamacpy.models.tiny import random_tensor
from llamacpy.ops import formats
from llamacpy.ops import matmul as M
from llamacpy.ops.quantize_act import quantize_q8_numpy
from llamacpy.quants.mxfp4 import KVALUES
from llamacpy.quants.nvfp4 import UE4M3_HALF

TYPES = [GGMLType.Q1_0, GGMLType.Q2_0, GGMLType.NVFP4]
FIX = Path(__file__).parent / "fixtures" / "quants" / "q1_q2_nvfp4.npz"
F32 = np.float32


def _lanes(v, x):
    """ggml's 8 int32 lanes of 32 products (lane j: elements 4j..4j+3) as float32."""
    return (v * x).reshape(*v.shape[:-1], 8, 4).sum(-1).astype(F32)


def q1_0_vec_dot(raw, nrows, q, dq):
    """AVX2 ``ggml_vec_dot_q1_0_q8_0``: per activation block a lane vector, ``blk = d_x0 *
    lanes``, then ``fma(d_xK, lanes, blk)``; ``acc = fma(d_w, blk, acc)``; ``hsum_float_8``."""
    b = raw.view(Q.get("Q1_0").block_dtype).reshape(nrows, -1)
    sign = np.unpackbits(b["qs"], axis=-1, bitorder="little").astype(np.int64) * 2 - 1
    d = b["d"].astype(F32)
    out = np.zeros((len(q), nrows), F32)
    for n in range(len(q)):
        acc = np.zeros((nrows, 8), F32)
        for i in range(b.shape[1]):
            blk = np.zeros((nrows, 8), F32)
            for K in range(4):
                k = 4 * i + K
                lanes = _lanes(sign[:, i, 32 * K : 32 * K + 32], q[n, 32 * k : 32 * k + 32])
                blk = dq[n, k] * lanes if K == 0 else _fma(dq[n, k], lanes, blk)
            acc = _fma(d[:, i, None], blk, acc)
        out[n] = _hsum8(acc)
    return out


def q2_0_vec_dot(raw, nrows, q, dq):
    """ggml's generic ``ggml_vec_dot_q2_0_q8_0`` (x86 has no other): ``sumi = 0.0f``,
    ``sumi += d_x * isum`` per q8_0 block, ``sumf += sumi * d_w`` (nothing fused)."""
    b = raw.view(Q.get("Q2_0").block_dtype).reshape(nrows, -1)
    codes = (b["qs"][..., None] >> (2 * np.arange(4, dtype=np.uint8))) & 3
    v = codes.reshape(nrows, b.shape[1], 64).astype(np.int64) - 1
    d = b["d"].astype(F32)
    out = np.zeros((len(q), nrows), F32)
    for n in range(len(q)):
        sumf = np.zeros(nrows, F32)
        for i in range(b.shape[1]):
            sumi = np.zeros(nrows, F32)
            for h in range(2):
                k = 2 * i + h
                isum = (v[:, i, 32 * h : 32 * h + 32] * q[n, 32 * k : 32 * k + 32]).sum(-1)
                sumi = sumi + dq[n, k] * isum.astype(F32)
            sumf = sumf + sumi * d[:, i]
        out[n] = sumf
    return out


def nvfp4_vec_dot(raw, nrows, q, dq):
    """AVX2 ``ggml_vec_dot_nvfp4_q8_0``: per block two steps of 32 weights, ``acc_j =
    fma(ue4m3(d_s) * d_x, lane_j, acc_j)`` (lanes 0..3 sub-block ``2h``, 4..7 ``2h + 1``)."""
    b = raw.view(Q.get("NVFP4").block_dtype).reshape(nrows, -1)
    qs = b["qs"].reshape(nrows, -1, 4, 8)
    v = KVALUES[np.concatenate([qs & 0xF, qs >> 4], axis=-1)].astype(np.int64)
    v = v.reshape(nrows, -1, 64)
    sc = UE4M3_HALF[b["d"]]  # [rows, blocks, 4]
    out = np.zeros((len(q), nrows), F32)
    for n in range(len(q)):
        acc = np.zeros((nrows, 8), F32)
        for i in range(b.shape[1]):
            for h in range(2):
                k = 2 * i + h
                lanes = _lanes(v[:, i, 32 * h : 32 * h + 32], q[n, 32 * k : 32 * k + 32])
                s = (sc[:, i, 2 * h : 2 * h + 2] * dq[n, k]).astype(F32)
                acc = _fma(np.repeat(s, 4, axis=1), lanes, acc)
        out[n] = _hsum8(acc)
    return out


REFERENCE = {
    GGMLType.Q1_0: q1_0_vec_dot,
    GGMLType.Q2_0: q2_0_vec_dot,
    GGMLType.NVFP4: nvfp4_vec_dot,
}


def _matmul(raw, t, nrows, ncols, x):
    packed = formats.repack(raw, t, nrows, ncols)
    desc = np.array([int(t), 0, nrows, ncols], np.int64)
    n = len(x)
    a = M.new_acts(n, ncols)
    M.prepare_acts(x, 0, n, ncols, M.act_need([t]), a)
    groups = (nrows + 15) // 16
    out = np.zeros((n, 16 * groups), F32)
    M.matmul(M.FormatSet([t]), packed, desc, a, 0, n, 0, groups, out, 0, False)
    return out[:, :nrows]


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_kernels_equal_ggml_vec_dot_fixture(t: GGMLType) -> None:
    """libggml-cpu's own ``vec_dot`` results, 1 to 3 tokens (a single, a pair, both)."""
    with np.load(FIX) as z:
        w, want, act = z[f"{t.name}/w"], z[f"{t.name}/dot"], z["act"]
    for n in (1, 2, 3):
        np.testing.assert_array_equal(_matmul(w, t, 24, 512, act[:n]), want[:n])


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n_tok", [3, 9])
def test_kernels_follow_ggml_vec_dot_bit_for_bit(t: GGMLType, n_tok: int) -> None:
    """3 row groups (the last padded), several blocks per row; 3 tokens: a pair and a single
    (Q2_0: singles), 9: pairs (Q2_0: groups of four) and a single."""
    nrows, ncols = 40, 768
    raw = random_tensor(np.random.default_rng(11), t, nrows, ncols)
    x = np.random.default_rng(12).standard_normal((n_tok, ncols)).astype(F32)
    q, dq, _, _ = quantize_q8_numpy(x)
    want = REFERENCE[t](raw, nrows, q.astype(np.int64), dq)
    np.testing.assert_array_equal(_matmul(raw, t, nrows, ncols, x), want)


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_extreme_scales_follow_ggml_vec_dot(t: GGMLType) -> None:
    """Scales at the formats' extremes (f16 denormals and 65504; every UE4M3 byte, 0x7F's zero
    and the ignored top bit) and activations of mixed magnitude."""
    nrows, ncols = 16, 1024
    raw = random_tensor(np.random.default_rng(7), t, nrows, ncols)
    fmt = Q.get(t.name)
    blocks = raw.view(fmt.block_dtype)
    if t == GGMLType.NVFP4:
        blocks["d"] = np.arange(blocks["d"].size, dtype=np.int64).reshape(-1, 4) % 256
    else:
        d = np.array([6e-8, 1e-5, 0.5, 65504.0, 2e-3, 1.0], np.float16)
        blocks["d"] = np.resize(d, blocks.shape)
    x = np.random.default_rng(8).standard_normal((3, ncols)).astype(F32)
    x[1] *= np.float32(1e-6)
    x[2, ::7] *= np.float32(1e4)
    q, dq, _, _ = quantize_q8_numpy(x)
    want = REFERENCE[t](raw, nrows, q.astype(np.int64), dq)
    np.testing.assert_array_equal(_matmul(raw, t, nrows, ncols, x), want)
