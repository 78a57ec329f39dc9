"""The grid formats' kernels (``ops/qdot_iq``) against numpy references of llama.cpp's two
ways of multiplying them on x86: ``vec_dot`` under 8 tokens (8 int32 lanes per super-block,
lane ``j`` = elements 4j..4j+3 of every 32, each lane ``fma(d_w * d_x, lane, acc_j)``, then
``f * hsum_float_8``; IQ1 keeps its delta products apart) and the tiled kernels from 8 tokens (one exact int32 per super-block,
``acc = fma(float(s) * (d_w * f), d_x, acc)``). Integer sums are exact and the float
operations are taken in ggml's order, so the kernels must agree bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from ggml_float import fma32 as _fma
from ggml_float import hsum_float_8 as _hsum8
from llamacpy.gguf import GGMLType
from llamacpy.models.tiny import random_tensor
from llamacpy.ops import formats, traits
from llamacpy.ops import matmul as M
from llamacpy.ops.quantize_act import quantize_q8k_numpy

GRID = [GGMLType.IQ2_XXS, GGMLType.IQ2_XS, GGMLType.IQ2_S, GGMLType.IQ3_XXS, GGMLType.IQ3_S]
IQ1 = [GGMLType.IQ1_S, GGMLType.IQ1_M]
TQ = [GGMLType.TQ1_0, GGMLType.TQ2_0]
FACTOR = {GGMLType.IQ3_XXS: 0.25, GGMLType.IQ3_S: 1.0}  # the others (IQ2): 1/8
F32 = np.float32


def _integer_form(raw, t, nrows, ncols):
    """(d float32 [rows, blocks], values int64 [rows, blocks, 256], scale of every 16 weights
    int64 [rows, blocks, 16]) from the file's blocks."""
    mod = formats.iq_module(t)
    dbits, v, sc = mod.decode_numpy(np.ascontiguousarray(raw).view(mod.BLOCK).reshape(-1))
    dbits = np.asarray(dbits)
    dbits = dbits.view(np.uint16) if dbits.dtype == np.float16 else dbits.astype(np.uint16)
    nblk = ncols // 256
    d = dbits.view(np.float16).astype(F32).reshape(nrows, nblk)
    sc16 = np.repeat(sc.astype(np.int64), 16 // sc.shape[1], axis=1).reshape(nrows, nblk, 16)
    return d, v.astype(np.int64).reshape(nrows, nblk, 256), sc16


def vec_dot_reference(d, v, sc16, q, dq, f):
    """ggml's AVX2 ``vec_dot`` of every row with every token (float32 [tokens, rows])."""
    nrows, nblk = d.shape
    out = np.zeros((len(q), nrows), F32)
    for n in range(len(q)):
        acc = np.zeros((nrows, 8), F32)
        for b in range(nblk):
            x = q[n, 256 * b : 256 * (b + 1)].astype(np.int64)
            xs = np.where(v[:, b] < 0, -x, x)  # the sign moves to the activation
            prod = np.abs(v[:, b]) * xs * np.repeat(sc16[:, b], 16, axis=1)
            lanes = prod.reshape(nrows, 8, 8, 4).sum(axis=(1, 3))  # [rows, lane]
            dd = (d[:, b] * dq[n, b]).astype(F32)
            acc = _fma(dd[:, None], lanes.astype(F32), acc)
        out[n] = F32(f) * _hsum8(acc)
    return out


def iq1_vec_dot_reference(d, v, sc16, q, dq, per_lane_delta):
    """ggml's AVX2 ``vec_dot`` of IQ1_S (``per_lane_delta`` False: the delta products as one
    int per super-block) and IQ1_M (True: in 8 lanes of their own)."""
    nrows, nblk = d.shape
    out = np.zeros((len(q), nrows), F32)
    g = (v + 4) >> 3  # v = 8 g + delta
    delta = v - 8 * g
    for n in range(len(q)):
        acc = np.zeros((nrows, 8), F32)
        acc2 = np.zeros((nrows, 8 if per_lane_delta else 1), F32)
        for b in range(nblk):
            x = q[n, 256 * b : 256 * (b + 1)].astype(np.int64)
            s = np.repeat(sc16[:, b], 16, axis=1)
            lg = (g[:, b] * x * s).reshape(nrows, 8, 8, 4).sum(axis=(1, 3))
            ld = (delta[:, b] * x * s).reshape(nrows, 8, 8, 4).sum(axis=(1, 3))
            if not per_lane_delta:
                ld = ld.sum(-1, keepdims=True)
            dd = (d[:, b] * dq[n, b]).astype(F32)[:, None]
            acc = _fma(dd, lg.astype(F32), acc)
            acc2 = _fma(dd, ld.astype(F32), acc2)
        h2 = _hsum8(acc2) if per_lane_delta else acc2[:, 0]
        out[n] = _hsum8(acc) + F32(0.125) * h2
    return out


def tq_vec_dot_reference(d, v, q, dq, bsums):
    """ggml's AVX2 ``vec_dot`` of TQ1_0 / TQ2_0: lane ``j`` = ``(v + 1) x`` over elements
    4j..4j+3 of every 32 less the activation sums of 16 number 2j and 2j+1."""
    nrows, nblk = d.shape
    out = np.zeros((len(q), nrows), F32)
    for n in range(len(q)):
        acc = np.zeros((nrows, 8), F32)
        for b in range(nblk):
            x = q[n, 256 * b : 256 * (b + 1)].astype(np.int64)
            lanes = ((v[:, b] + 1) * x).reshape(nrows, 8, 8, 4).sum(axis=(1, 3))
            bs = bsums[n, 16 * b : 16 * (b + 1)].astype(np.int64).reshape(8, 2).sum(-1)
            dd = (dq[n, b] * d[:, b]).astype(F32)[:, None]
            acc = _fma((lanes - bs).astype(F32), dd, acc)
        out[n] = _hsum8(acc)
    return out


def tiled_reference(d, v, sc16, q, dq, f):
    """llama.cpp's tiled kernels (float32 [tokens, rows])."""
    nrows, nblk = d.shape
    out = np.zeros((len(q), nrows), F32)
    dw = (d * F32(f)).astype(F32)
    for n in range(len(q)):
        acc = np.zeros(nrows, F32)
        for b in range(nblk):
            x = q[n, 256 * b : 256 * (b + 1)].astype(np.int64)
            s = (v[:, b] * x * np.repeat(sc16[:, b], 16, axis=1)).sum(-1)
            r = (s.astype(F32) * dw[:, b]).astype(F32)
            acc = _fma(r, dq[n, b], acc)
        out[n] = acc
    return out


@pytest.mark.parametrize("t", GRID + IQ1 + TQ, ids=lambda t: t.name)
@pytest.mark.parametrize("n_tok", [3, 9])
def test_kernels_follow_llama_cpp_bit_for_bit(t: GGMLType, n_tok: int) -> None:
    """3 tokens: the vec_dot kernels (one pair, one single); 9: the tiled ones (a group of
    four, then singles), vec_dot again for TQ1_0 / TQ2_0, which have no tiled kernel."""
    nrows, ncols = 40, 768  # 3 row groups, the last one padded; 3 super-blocks per row
    raw = random_tensor(np.random.default_rng(11), t, nrows, ncols)
    packed = formats.repack(raw, t, nrows, ncols)
    desc = np.array([int(t), 0, nrows, ncols], np.int64)
    x = np.random.default_rng(12).standard_normal((n_tok, ncols)).astype(F32)
    a = M.new_acts(n_tok, ncols)
    M.prepare_acts(x, 0, n_tok, ncols, M.act_need([t]), a)
    out = np.zeros((n_tok, 48), F32)
    M.matmul(M.FormatSet([t]), packed, desc, a, 0, n_tok, 0, 3, out, 0, False)
    q, dq, bsums = quantize_q8k_numpy(x)
    ints = _integer_form(raw, t, nrows, ncols)
    if t in TQ:
        want = tq_vec_dot_reference(ints[0], ints[1], q, dq, bsums)
    elif n_tok >= 8:
        want = tiled_reference(*ints, q, dq, FACTOR.get(t, 0.125))
    elif t in IQ1:
        want = iq1_vec_dot_reference(*ints, q, dq, t == GGMLType.IQ1_M)
    else:
        want = vec_dot_reference(*ints, q, dq, FACTOR.get(t, 0.125))
    np.testing.assert_array_equal(out[:, :nrows], want)


@pytest.mark.parametrize("t", GRID + IQ1 + TQ, ids=lambda t: t.name)
def test_repacked_integer_form_and_rows(t: GGMLType) -> None:
    """The repacked values and scales are the file's integer form; rows decode as the
    quants module dequantizes."""
    nrows, ncols = 20, 512
    raw = random_tensor(np.random.default_rng(3), t, nrows, ncols)
    packed = formats.repack(raw, t, nrows, ncols)
    f = formats.unpack_fields(packed, t, nrows, ncols)
    d, v, sc16 = _integer_form(raw, t, nrows, ncols)
    np.testing.assert_array_equal(f["v"], v)
    np.testing.assert_array_equal(f["sc"], sc16)
    np.testing.assert_array_equal(f["d"].view(np.float16).astype(F32), d)
    want = traits.get(t).quant.dequantize(raw, nrows * ncols).reshape(nrows, ncols)
    got = M.dequantize_repacked_numpy(packed, t, nrows, ncols)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("t", GRID + IQ1 + TQ, ids=lambda t: t.name)
def test_every_value_a_block_can_hold_has_a_code(t: GGMLType) -> None:
    """The repacked form keeps 4-bit codes of a format's ``VALUES``: random blocks (every
    grid index, sign pattern and TQ2_0's never-written q = 3) decode to those values only,
    at most 16 of them."""
    from llamacpy.ops.formats import iq_module

    mod = iq_module(t)
    raw = np.frombuffer(np.random.default_rng(5).bytes(mod.TYPE_SIZE * 4096), np.uint8)
    _d, v, _sc = mod.decode_numpy(raw.copy().view(mod.BLOCK))
    assert len(mod.VALUES) <= 16
    assert set(np.unique(v).tolist()) == set(mod.VALUES)
