"""The llama forward pass of one ubatch as a single compiled call.

``forward(fmask, n_threads, ...)`` opens one parallel region of ``n_threads`` workers
(``prange`` over thread ids) that run the whole network, meeting at a spin barrier between
dependent stages; Python is entered once per ubatch. Work is split by output row groups for
matmuls (each thread streams its share of every weight once, for all tokens), by tokens for
norms / rope / quantization, by (token, head) for attention. A single-token ubatch (decode)
skips the token-split stages: every thread normalizes and quantizes the one activation row
itself into a private buffer, which saves four barriers per layer.

Argument groups (tuples of arrays; see :class:`llamacpy.models.llama.Workspace`):

* ``WT = (W, WD, NF)``: repacked matrices, their descriptors, float vectors;
* ``LT = (LW, LN, LNEED, LKIND)``: per layer the matrix indices (q, k, v, o, gate, up,
  down), vector offsets (norms: attn, ffn, q, k, attn post, ffn post; q, k, v biases; -1
  when the layer has none),
  activation kinds needed (attn in, o in, ffn in, down in) and attention kind (0 global,
  1 sliding window: picks the rope row and the mask);
* ``GT``: token_embd index, output index, output_norm offset, output activation kinds;
* ``HP``: n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_layer, n_rot, ffn
  activation (0 SwiGLU, 1 GEGLU);
* ``FP``: rms eps, kq scale, embedding scale, final logit soft-cap (0: none), query scale;
  ``RP`` ``[2, 8]`` (global, sliding-window) / ``FF``: rope (see :mod:`llamacpy.ops.rope`);
* ``UB = (tokens, pos, cells, mask, mask_swa, out_idx, info)``, ``info`` = n_tokens, n_kv,
  attention mode (0 rows, 1 tiled, 2 decode split), n_out;

Post-norms (gemma3) send the attention and FFN outputs through a scratch row and an RMSNorm
before the residual add; the optional steps cost nothing to models without them.
* ``KV = (k_cache, v_cache, info)`` with caches ``[n_layer, n_head_kv, n_ctx, row_bytes]``
  and ``info`` = k type, v type, row bytes;
* ``S``: scratch (see ``Workspace``).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..ops.activations import ACT_GEGLU, geglu, swiglu
from ..ops.attention import (
    attention_rows,
    attention_split_merge,
    attention_split_partial,
    attention_tiled,
    store_row,
)
from ..ops.dequant import get_row
from ..ops.matmul import matmul_sel, prepare_acts
from ..ops.norm import head_rms_norm, rms_norm
from ..ops.rope import rope_apply, rope_cache
from ..ops.threads import barrier, split, tick, timed_barrier
from ..simd import cycles

MODE_ROWS, MODE_TILED, MODE_SPLIT = 0, 1, 2


@njit(cache=True, parallel=True)
def forward(fmask, n_threads, WT, LT, GT, HP, FP, RP, FF, UB, KV, S, bar):
    """Run the ubatch; logits of the output tokens land in ``S`` (``LOG`` rows)."""
    # numba's parallel loop accepts arrays and scalars, not tuples: unpack here, repack inside
    W, WD, NF = WT
    LW, LN, LNEED, LKIND = LT
    tokens, pos, cells, mask, mask_swa, out_idx, ui = UB
    KC, VC, kvi = KV
    X, XN, Q, KN, VN, ATT, G, U, A, AP, XP, LOG, TS, prof = S
    a0, a1, a2, a3, a4, a5, a6, a7 = A
    p0, p1, p2, p3, p4, p5, p6, p7 = AP
    s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12 = TS
    for tid in prange(n_threads):
        # (the parfor index is unsigned; mixing it with signed ints would give floats)
        _worker(
            fmask,
            np.int64(tid),
            n_threads,
            (W, WD, NF),
            (LW, LN, LNEED, LKIND),
            GT,
            HP,
            FP,
            RP,
            FF,
            (tokens, pos, cells, mask, mask_swa, out_idx, ui),
            (KC, VC, kvi),
            (
                X,
                XN,
                Q,
                KN,
                VN,
                ATT,
                G,
                U,
                (a0, a1, a2, a3, a4, a5, a6, a7),
                (p0, p1, p2, p3, p4, p5, p6, p7),
                XP,
                LOG,
                (s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12),
                prof,
            ),
            bar,
        )


@njit(cache=True, inline="always")
def _mm(fmask, W, WD, wi, A, t0, t1, out, ot, add, tid, nth):
    """This thread's share of the row groups of matrix ``wi``."""
    g0, g1 = split((WD[wi, 2] + 15) // 16, tid, nth)
    matmul_sel(fmask, W, WD[wi], A, t0, t1, g0, g1, out, ot, add)


@njit(cache=True, inline="always")
def _norm_quant(src, t0, t1, n, w, eps, dst, need, A):
    rms_norm(src, t0, t1, n, w, eps, dst)
    prepare_acts(dst, t0, t1, n, need, A)


@njit(cache=True, inline="always")
def _ffn(fmask, W, WD, NF, ffw, ln, need, n_tok, HP, eps, tid, nth, SS, bar, prof, clk):
    """Feed-forward of rows ``0..n_tok`` of ``X``: norm, gate/up, SwiGLU or GEGLU, down
    (+ post-norm) + residual. ``ffw`` = (gate, up, down) matrix indices, ``ln``/``need`` the
    layer's rows of ``LN``/``LNEED``."""
    X, XN, G, U, A, AP, XP = SS
    wg, wu, wd = ffw
    n_embd, n_ff, act = HP[0], HP[4], HP[8]
    ffn_norm = NF[ln[1] : ln[1] + n_embd]
    single = n_tok == 1
    t0, t1 = split(n_tok, tid, nth)
    ta, tb, AA = (tid, tid + 1, AP) if single else (0, n_tok, A)
    if single:
        XP[tid, :n_embd] = X[0, :n_embd]
        _norm_quant(XP, tid, tid + 1, n_embd, ffn_norm, eps, XP, need[2], AP)
        clk = tick(prof, tid, P_NORM, clk)
    else:
        _norm_quant(X, t0, t1, n_embd, ffn_norm, eps, XN, need[2], A)
        clk = tick(prof, tid, P_NORM, clk)
        clk = timed_barrier(bar, nth, prof, tid, clk)
    g0, g1 = split((n_ff + 15) // 16, tid, nth)
    matmul_sel(fmask, W, WD[wg], AA, ta, tb, g0, g1, G, 0, False)
    matmul_sel(fmask, W, WD[wu], AA, ta, tb, g0, g1, U, 0, False)
    if act == ACT_GEGLU:
        geglu(G, U, 0, n_tok, 16 * g0, min(16 * g1, n_ff), G)
    else:
        swiglu(G, U, 0, n_tok, 16 * g0, min(16 * g1, n_ff), G)
    clk = tick(prof, tid, P_FFN_UP, clk)
    clk = timed_barrier(bar, nth, prof, tid, clk)
    if single:
        XP[tid, :n_ff] = G[0, :n_ff]
        prepare_acts(XP, tid, tid + 1, n_ff, need[3], AP)
    else:
        prepare_acts(G, t0, t1, n_ff, need[3], A)
        clk = tick(prof, tid, P_FFN_DOWN, clk)
        clk = timed_barrier(bar, nth, prof, tid, clk)
    clk = _proj_residual(
        fmask,
        W,
        WD,
        NF,
        wd,
        AA,
        ta,
        tb,
        X,
        XN,
        ln[5],
        n_embd,
        eps,
        tid,
        nth,
        t0,
        t1,
        bar,
        prof,
        clk,
        P_FFN_DOWN,
    )
    return clk


# profile slots (cycles per thread, see Workspace.prof)
P_EMBD, P_NORM, P_QKV, P_ROPE, P_ATTN, P_OUT_PROJ, P_FFN_UP, P_FFN_DOWN, P_HEAD = range(9)


@njit(cache=True)
def _worker(fmask, tid, nth, WT, LT, GT, HP, FP, RP, FF, UB, KV, S, bar):
    W, WD, NF = WT
    LW, LN, LNEED, LKIND = LT
    tokens, pos, cells, mask, mask_swa, out_idx, ui = UB
    n_tok, n_kv, mode, n_out = ui[0], ui[1], ui[2], ui[3]
    n_embd, n_head, n_head_kv, hd = HP[0], HP[1], HP[2], HP[3]
    n_layer, n_rot = HP[6], HP[7]
    eps, kq_scale, embd_scale, softcap, q_scale = FP[0], FP[1], FP[2], FP[3], FP[4]
    KC, VC, kvi = KV
    k_type, v_type, rowb, n_ctx = kvi[0], kvi[1], kvi[2], kvi[3]
    hstride = n_ctx * rowb  # bytes between the KV heads of a layer in the flat caches
    X, XN, Q, KN, VN, ATT, G, U, A, AP, XP, LOG, TS, prof = S
    rc, qv, qq, vbuf, res, kt, vt, pt, st, pm, ps, pv, tmp = TS
    single = n_tok == 1
    gqa = n_head // n_head_kv
    qdim = n_head * hd
    t0, t1 = split(n_tok, tid, nth)
    # single-token ubatches: each thread prepares the activation row itself (row ``tid`` of
    # the private buffers), so no barrier is needed between a norm and its matmuls
    ta, tb, AA = (tid, tid + 1, AP) if single else (0, n_tok, A)
    gathered = False  # the last layer moved the output rows to the front of X
    clk = cycles()

    # token embeddings (dequantized rows of the repacked table), scaled (gemma)
    emb = GT[0]
    for t in range(t0, t1):
        get_row(W, WD[emb, 1], WD[emb, 0], n_embd, tokens[t], X[t])
        if embd_scale != 1.0:
            for i in range(n_embd):
                X[t, i] *= embd_scale
    clk = tick(prof, tid, P_EMBD, clk)
    clk = timed_barrier(bar, nth, prof, tid, clk)

    for il in range(n_layer):
        wq, wk, wv, wo = LW[il, 0], LW[il, 1], LW[il, 2], LW[il, 3]
        attn_norm = NF[LN[il, 0] : LN[il, 0] + n_embd]
        kind = LKIND[il]
        rp = RP[kind]
        lmask = mask_swa if kind != 0 else mask

        # ---- attention: norm, q/k/v
        if single:
            XP[tid, :n_embd] = X[0, :n_embd]
            _norm_quant(XP, tid, tid + 1, n_embd, attn_norm, eps, XP, LNEED[il, 0], AP)
            clk = tick(prof, tid, P_NORM, clk)
        else:
            _norm_quant(X, t0, t1, n_embd, attn_norm, eps, XN, LNEED[il, 0], A)
            clk = tick(prof, tid, P_NORM, clk)
            clk = timed_barrier(bar, nth, prof, tid, clk)
        _mm(fmask, W, WD, wq, AA, ta, tb, Q, 0, False, tid, nth)
        _mm(fmask, W, WD, wk, AA, ta, tb, KN, 0, False, tid, nth)
        _mm(fmask, W, WD, wv, AA, ta, tb, VN, 0, False, tid, nth)
        clk = tick(prof, tid, P_QKV, clk)
        clk = timed_barrier(bar, nth, prof, tid, clk)

        # ---- q/k/v biases (qwen2), per-head q/k norms, rope, query scale, cache write
        lbase = il * n_head_kv * hstride
        qn, kn = LN[il, 2], LN[il, 3]
        qb, kb, vb = LN[il, 6], LN[il, 7], LN[il, 8]
        for t in range(t0, t1):
            if qb >= 0:
                for i in range(qdim):
                    Q[t, i] += NF[qb + i]
            if kb >= 0:
                for i in range(n_head_kv * hd):
                    KN[t, i] += NF[kb + i]
            if vb >= 0:
                for i in range(n_head_kv * hd):
                    VN[t, i] += NF[vb + i]
            if qn >= 0:
                head_rms_norm(Q, t, n_head, hd, NF[qn : qn + hd], eps)
            if kn >= 0:
                head_rms_norm(KN, t, n_head_kv, hd, NF[kn : kn + hd], eps)
            rope_cache(pos[t], rp, FF, rc[tid])
            rope_apply(Q, t, 0, n_head, hd, rc[tid], n_rot, rp[7] != 0)
            rope_apply(KN, t, 0, n_head_kv, hd, rc[tid], n_rot, rp[7] != 0)
            if q_scale != 1.0:
                for i in range(qdim):
                    Q[t, i] *= q_scale
            for h in range(n_head_kv):
                o = lbase + h * hstride + cells[t] * rowb
                store_row(KN[t], h * hd, hd, k_type, KC, o)
                store_row(VN[t], h * hd, hd, v_type, VC, o)
        clk = tick(prof, tid, P_ROPE, clk)
        clk = timed_barrier(bar, nth, prof, tid, clk)

        # ---- attention
        _attention(
            tid,
            nth,
            mode,
            n_tok,
            n_kv,
            n_head,
            gqa,
            hd,
            kq_scale,
            k_type,
            v_type,
            rowb,
            Q,
            KC,
            VC,
            lbase,
            hstride,
            lmask,
            ATT,
            qv[tid],
            qq[tid],
            vbuf[tid],
            res[tid],
            kt[tid],
            vt[tid],
            pt[tid],
            st[tid],
            pm,
            ps,
            pv,
            tmp[tid],
            bar,
        )
        clk = tick(prof, tid, P_ATTN, clk)
        clk = timed_barrier(bar, nth, prof, tid, clk)

        # ---- output projection (+ post-norm) + residual
        if single:
            XP[tid, :qdim] = ATT[0, :qdim]
            prepare_acts(XP, tid, tid + 1, qdim, LNEED[il, 1], AP)
        else:
            prepare_acts(ATT, t0, t1, qdim, LNEED[il, 1], A)
            clk = tick(prof, tid, P_OUT_PROJ, clk)
            clk = timed_barrier(bar, nth, prof, tid, clk)
        clk = _proj_residual(
            fmask,
            W,
            WD,
            NF,
            wo,
            AA,
            ta,
            tb,
            X,
            XN,
            LN[il, 4],
            n_embd,
            eps,
            tid,
            nth,
            t0,
            t1,
            bar,
            prof,
            clk,
            P_OUT_PROJ,
        )

        # ---- feed-forward. In the last layer only the rows whose logits are wanted go on,
        # gathered to the front (llama.cpp's inp_out_ids), so that its matmuls see as many
        # tokens as llama.cpp's do (their numerics depend on the count)
        n_rows = n_tok
        if il == n_layer - 1 and 0 < n_out < n_tok:
            if tid == 0:
                for i in range(n_out):
                    X[i, :n_embd] = X[out_idx[i], :n_embd]
            clk = timed_barrier(bar, nth, prof, tid, clk)
            n_rows = n_out
            gathered = True
        clk = _ffn(
            fmask,
            W,
            WD,
            NF,
            (LW[il, 4], LW[il, 5], LW[il, 6]),
            LN[il],
            LNEED[il],
            n_rows,
            HP,
            eps,
            tid,
            nth,
            (X, XN, G, U, A, AP, XP),
            bar,
            prof,
            clk,
        )

    # ---- output head for the requested tokens
    if n_out > 0:
        onorm = NF[GT[2] : GT[2] + n_embd]
        if n_out == 1:
            XP[tid, :n_embd] = X[0 if gathered else out_idx[0], :n_embd]
            _norm_quant(XP, tid, tid + 1, n_embd, onorm, eps, XP, GT[3], AP)
            ha, hb, AH = tid, tid + 1, AP
        else:
            o0, o1 = split(n_out, tid, nth)
            for i in range(o0, o1):
                XN[i, :n_embd] = X[i if gathered else out_idx[i], :n_embd]
            _norm_quant(XN, o0, o1, n_embd, onorm, eps, XN, GT[3], A)
            clk = tick(prof, tid, P_HEAD, clk)
            clk = timed_barrier(bar, nth, prof, tid, clk)
            ha, hb, AH = 0, n_out, A
        g0, g1 = split((WD[GT[1], 2] + 15) // 16, tid, nth)
        matmul_sel(fmask, W, WD[GT[1]], AH, ha, hb, g0, g1, LOG, 0, False)
        if softcap != 0.0:  # each thread caps the rows groups it wrote
            n_vocab = HP[5]
            for i in range(n_out):
                for c in range(16 * g0, min(16 * g1, n_vocab)):
                    LOG[i, c] = np.tanh(LOG[i, c] * (np.float32(1.0) / softcap)) * softcap
        clk = tick(prof, tid, P_HEAD, clk)


@njit(cache=True, inline="always")
def _proj_residual(
    fmask,
    W,
    WD,
    NF,
    wi,
    AA,
    ta,
    tb,
    X,
    XN,
    post,
    n_embd,
    eps,
    tid,
    nth,
    t0,
    t1,
    bar,
    prof,
    clk,
    slot,
):
    """``X += W_wi . act`` -- or, with a post-norm at ``NF[post]``, ``X += rms_norm(W_wi .
    act) * post`` through the scratch rows ``XN`` (two more barriers)."""
    if post < 0:
        _mm(fmask, W, WD, wi, AA, ta, tb, X, 0, True, tid, nth)
        clk = tick(prof, tid, slot, clk)
        return timed_barrier(bar, nth, prof, tid, clk)
    _mm(fmask, W, WD, wi, AA, ta, tb, XN, 0, False, tid, nth)
    clk = tick(prof, tid, slot, clk)
    clk = timed_barrier(bar, nth, prof, tid, clk)
    rms_norm(XN, t0, t1, n_embd, NF[post : post + n_embd], eps, XN)
    for t in range(t0, t1):
        for i in range(n_embd):
            X[t, i] += XN[t, i]
    clk = tick(prof, tid, P_NORM, clk)
    return timed_barrier(bar, nth, prof, tid, clk)


@njit(cache=True)
def _attention(
    tid,
    nth,
    mode,
    n_tok,
    n_kv,
    n_head,
    gqa,
    hd,
    kq_scale,
    k_type,
    v_type,
    rowb,
    Q,
    kc,
    vc,
    lbase,
    hstride,
    mask,
    ATT,
    qv,
    qq,
    vbuf,
    res,
    kt,
    vt,
    pt,
    st,
    pm,
    ps,
    pv,
    tmp,
    bar,
):
    if mode == MODE_SPLIT:  # decode over a long cache: one chunk of cells per thread, merged
        attention_split_partial(
            tid,
            nth,
            n_kv,
            n_head,
            gqa,
            hd,
            kq_scale,
            k_type,
            v_type,
            rowb,
            Q,
            kc,
            vc,
            lbase,
            hstride,
            mask,
            qv,
            qq,
            vbuf,
            res,
            pm,
            ps,
            pv,
        )
        barrier(bar, nth)
        attention_split_merge(tid, nth, n_head, hd, pm, ps, pv, ATT, tmp)
    elif mode == MODE_ROWS:
        attention_rows(
            tid,
            nth,
            n_tok,
            n_kv,
            n_head,
            gqa,
            hd,
            kq_scale,
            k_type,
            v_type,
            rowb,
            Q,
            kc,
            vc,
            lbase,
            hstride,
            mask,
            ATT,
            qv,
            qq,
            vbuf,
            res,
        )
    else:
        attention_tiled(
            tid,
            nth,
            n_tok,
            n_kv,
            n_head,
            gqa,
            hd,
            kq_scale,
            k_type,
            rowb,
            Q,
            kc,
            vc,
            lbase,
            hstride,
            mask,
            ATT,
            kt,
            vt,
            pt,
            st,
        )
