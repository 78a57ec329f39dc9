"""Norm, rope, SwiGLU and attention kernels vs their numpy twins."""

from __future__ import annotations

import numpy as np
import pytest

from llamacpy.ops import activations, attention, norm, rope
from llamacpy.ops import attention_ref as AR
from llamacpy.ops.attention import KV_F16, KV_F32, KV_Q8_0

NO_ORDER = np.zeros(0, np.int32)
NO_SINKS = np.zeros(0, np.float32)

F32 = np.float32


def test_rms_norm_matches_twin() -> None:
    x = np.random.default_rng(0).standard_normal((3, 96)).astype(F32) * 3
    w = np.random.default_rng(1).standard_normal(96).astype(F32)
    out = np.zeros_like(x)
    norm.rms_norm(x, 0, 3, 96, w, F32(1e-5), out)
    np.testing.assert_array_equal(out, norm.rms_norm_numpy(x, w, 1e-5))


def test_swiglu_matches_twin_and_silu() -> None:
    g = np.random.default_rng(2).standard_normal((2, 64)).astype(F32) * 8
    g[0, :4] = [0.0, -100.0, 100.0, -1e-30]
    u = np.random.default_rng(3).standard_normal((2, 64)).astype(F32)
    out = np.zeros_like(g)
    activations.swiglu(g, u, 0, 2, 0, 64, out)
    np.testing.assert_array_equal(out, activations.swiglu_numpy(g, u))
    exact = g / (1 + np.exp(-g.astype(np.float64))) * u
    np.testing.assert_allclose(out, exact, rtol=1e-5, atol=1e-30)


@pytest.mark.parametrize(
    "params",
    [
        rope.RopeParams(64),
        rope.RopeParams(64, neox=True, freq_base=100000.0),
        rope.RopeParams(32, freq_scale=0.25),
        rope.RopeParams(64, freq_scale=0.25, ext_factor=1.0, attn_factor=0.9, n_ctx_orig=4096),
    ],
    ids=["normal", "neox", "linear", "yarn"],
)
def test_rope_matches_twin(params: rope.RopeParams) -> None:
    hd, nh = 64, 3
    x = np.random.default_rng(4).standard_normal((5, nh * hd)).astype(F32)
    pos = np.array([0, 1, 7, 100, 4000], np.int32)
    ff = np.linspace(1, 8, params.n_rot // 2).astype(F32)
    for factors in (None, ff):
        got = x.copy()
        cache = np.zeros(params.n_rot, F32)
        f = np.zeros(0, F32) if factors is None else factors
        for t, p in enumerate(pos):
            rope.rope_cache(int(p), params.packed(), f, cache)
            rope.rope_apply(got, t, 0, nh, hd, cache, params.n_rot, params.neox)
        want = rope.rope_numpy(x.reshape(5, nh, hd), pos, params, factors)
        np.testing.assert_array_equal(got.reshape(5, nh, hd), want)


def test_rope_position_zero_is_identity_and_rotation_preserves_norm() -> None:
    p = rope.RopeParams(64)
    x = np.random.default_rng(5).standard_normal((1, 64)).astype(F32)
    cache = np.zeros(64, F32)
    rope.rope_cache(0, p.packed(), np.zeros(0, F32), cache)
    y = x.copy()
    rope.rope_apply(y, 0, 0, 1, 64, cache, 64, False)
    np.testing.assert_array_equal(y, x)
    rope.rope_cache(123, p.packed(), np.zeros(0, F32), cache)
    rope.rope_apply(y, 0, 0, 1, 64, cache, 64, False)
    assert np.linalg.norm(y) == pytest.approx(np.linalg.norm(x), rel=1e-5)


def _cache(rng, kv_type: int, n_kv: int, hd: int, nkv: int):
    rb = attention.kv_row_bytes(kv_type, hd)
    kc = np.zeros((nkv, n_kv, rb), np.uint8)
    vc = np.zeros_like(kc)
    keys = rng.standard_normal((nkv, n_kv, hd)).astype(F32)
    vals = rng.standard_normal((nkv, n_kv, hd)).astype(F32)
    for h in range(nkv):
        for c in range(n_kv):
            attention.store_row(keys[h, c], 0, hd, kv_type, kc[h, c], 0)
            attention.store_row(vals[h, c], 0, hd, kv_type, vc[h, c], 0)
    return kc, vc


@pytest.mark.parametrize("kv_type", [KV_F16, KV_F32, KV_Q8_0], ids=["f16", "f32", "q8_0"])
@pytest.mark.parametrize("mode", [0, 1, 2], ids=["rows", "tiled", "split"])
@pytest.mark.parametrize("variant", ["", "sinks", "softcap"])
def test_attention_matches_twin(kv_type: int, mode: int, variant: str) -> None:
    """Every regime equals its numpy twin; with attention sinks (one score per head, some
    above every cell's score so that the sink rescales the accumulator, some below); with
    the scores soft-capped (gemma2's ``c * tanh(s / c)``, a cap of 1.5 that bends them: the
    result differs from the uncapped one)."""
    if mode and kv_type == KV_Q8_0:
        pytest.skip("the tiled and split paths are for f16/f32 caches (as in ggml)")
    rng = np.random.default_rng(6)
    sinks, cap = variant == "sinks", F32(1.5 if variant == "softcap" else 0.0)
    sk = np.array([-2.0, 0.5, 2.5, 4.0], F32) if sinks else np.zeros(0, F32)
    nh, nkv, hd, n_kv = 4, 2, 64, (96, 200, 600)[mode]
    # tiled: 150 rows (blocks of 16, 32 or 64 rows with a short last one; pairs and singles)
    n = (21, 150, 1)[mode]
    kc, vc = _cache(rng, kv_type, n_kv, hd, nkv)
    q = rng.standard_normal((n, nh * hd)).astype(F32)
    mask = np.zeros((n, n_kv), np.uint8)
    for t in range(n):  # a causal-looking pattern with holes
        mask[t, : n_kv - n + t + 1] = 1
        mask[t, 3::7] = 0
    nth = 2 if mode == 2 else 1
    keys = np.stack([AR.load_rows_numpy(kc[h], hd, kv_type) for h in range(nkv)])
    vals = np.stack([AR.load_rows_numpy(vc[h], hd, kv_type) for h in range(nkv)])
    want = AR.attention_numpy(
        q.reshape(n, nh, hd),
        keys,
        vals,
        mask,
        kv_type,
        kv_type,
        mode,
        nth,
        F32(0.125),
        sk if sinks else None,
        cap,
    )
    if cap:
        uncapped = AR.attention_numpy(
            q.reshape(n, nh, hd), keys, vals, mask, kv_type, kv_type, mode, nth, F32(0.125)
        )
        assert np.abs(uncapped - want).max() > 0.02
    out = np.zeros((n, nh * hd), F32)
    qv, qq, vb, res = (
        np.zeros(hd, F32),
        np.zeros(hd, np.int32),
        np.zeros(hd, F32),
        np.zeros(hd, F32),
    )
    args = (nh, nh // nkv, hd, F32(0.125), kv_type)
    rb = kc.shape[2]
    kv = (kc.reshape(-1), vc.reshape(-1), 0, n_kv * rb)  # flat caches, layer base, head stride
    if mode == 0:
        attention.attention_rows(
            0, 1, n, n_kv, *args, kv_type, rb, q, *kv, mask, NO_ORDER, out, qv, qq, vb, res, sk,
            cap,
        )  # fmt: skip
    elif mode == 1:  # softmax states for one query head at a time, the group, blocks of 16
        # to 64 rows; query rows one at a time, then in pairs (score scratch for two): the
        # same bits every way
        first = None
        for n_states in (32, 32 * (nh // nkv), 64, 128 * (nh // nkv)):
            for n_scores in (64, 128):
                attention.attention_tiled(
                    0,
                    1,
                    n,
                    n_kv,
                    *args,
                    kv_type,
                    rb,
                    q,
                    *kv,
                    mask,
                    out,
                    np.zeros((hd, 64), F32),
                    np.zeros((64, hd), F32),
                    np.zeros(n_scores, F32),
                    np.zeros(n_states, F32),
                    sk,
                    cap,
                )
                np.testing.assert_allclose(out.reshape(n, nh, hd), want, rtol=0, atol=1e-5)
                first = out.copy() if first is None else first
                np.testing.assert_array_equal(out, first)
    else:  # the two phases of the split, threads played one after the other
        pm, ps, pv = (
            np.zeros((nh, nth), F32),
            np.zeros((nh, nth), F32),
            np.zeros((nh, nth, hd), F32),
        )
        for tid in range(nth):
            attention.attention_split_partial(
                tid, nth, n_kv, *args, kv_type, rb, q, *kv, mask, NO_ORDER, qv, qq, vb, res, pm,
                ps, pv, sk, 0, cap,
            )  # fmt: skip
        for tid in range(nth):
            attention.attention_split_merge(tid, nth, nh, hd, pm, ps, pv, out, res)
    tol = 1e-5
    np.testing.assert_allclose(out.reshape(n, nh, hd), want, rtol=0, atol=tol)


@pytest.mark.parametrize("kv_type", [KV_F16, KV_F32, KV_Q8_0], ids=["f16", "f32", "q8_0"])
def test_attention_rows_in_given_order_do_not_depend_on_cell_placement(kv_type: int) -> None:
    """Rows attending the cells through ``order`` (a deterministic context's position order)
    give the same bits whatever cells hold the sequence; in plain cell order they do not."""
    rng = np.random.default_rng(11)
    nh, nkv, hd, n_kv, n = 4, 2, 64, 160, 5
    kc, vc = _cache(rng, kv_type, n_kv, hd, nkv)
    q = rng.standard_normal((n, nh * hd)).astype(F32)
    mask = np.zeros((n, n_kv), np.uint8)
    for t in range(n):
        mask[t, : n_kv - n + t + 1] = 1
    perm = rng.permutation(n_kv).astype(np.int32)  # cell perm[i] holds what cell i held
    kp, vp, mp = np.empty_like(kc), np.empty_like(vc), np.empty_like(mask)
    kp[:, perm], vp[:, perm], mp[:, perm] = kc, vc, mask
    rb = kc.shape[2]

    def scratch():
        return np.zeros(hd, F32), np.zeros(hd, np.int32), np.zeros(hd, F32), np.zeros(hd, F32)

    outs = []
    for k_, v_, m_, order in ((kc, vc, mask, NO_ORDER), (kp, vp, mp, perm),
                              (kp, vp, mp, NO_ORDER)):  # fmt: skip
        out = np.zeros((n, nh * hd), F32)
        attention.attention_rows(
            0, 1, n, n_kv, nh, nh // nkv, hd, F32(0.125), kv_type, kv_type, rb, q,
            k_.reshape(-1), v_.reshape(-1), 0, n_kv * rb, m_, order, out, *scratch(), NO_SINKS,
        )  # fmt: skip
        outs.append(out)
    np.testing.assert_array_equal(outs[1], outs[0])
    assert not np.array_equal(outs[2], outs[0])  # the order is what makes them equal


def test_hadamard_rotation_is_ggml_fwht() -> None:
    """The rotation of a quantized cache: ``H x / sqrt(n)`` chunk by chunk (H the Sylvester
    Hadamard matrix), its own inverse, the same as the numpy twin bit for bit; the sizes are
    llama.cpp's (k: the largest power of two from 64 dividing the head, v: 64; none for
    f16/f32 caches or heads that are not a multiple of 64)."""
    rng = np.random.default_rng(3)
    for n in (64, 128, 256):
        h = np.array([[1.0]])
        while len(h) < n:
            h = np.block([[h, h], [h, -h]])
        x = rng.standard_normal(3 * n).astype(F32)
        y = x.copy()
        attention.fwht(y, 0, 3 * n, n)
        want = (h @ x.reshape(3, n).T.astype(np.float64)).T.reshape(-1) / np.sqrt(n)
        np.testing.assert_allclose(y, want, rtol=0, atol=1e-5 * np.abs(want).max())
        np.testing.assert_array_equal(AR.fwht_numpy(x.reshape(3, n), n).reshape(-1), y)
        attention.fwht(y, 0, 3 * n, n)
        np.testing.assert_allclose(y, x, rtol=0, atol=1e-5 * np.abs(x).max())
    sizes = {hd: attention.k_rotation(KV_Q8_0, hd) for hd in (32, 64, 96, 128, 192, 256, 512)}
    assert sizes == {32: 0, 64: 64, 96: 0, 128: 128, 192: 64, 256: 256, 512: 512}
    assert [attention.v_rotation(KV_Q8_0, hd) for hd in (32, 64, 256)] == [0, 64, 64]
    assert attention.k_rotation(KV_F16, 256) == attention.v_rotation(KV_F32, 256) == 0
