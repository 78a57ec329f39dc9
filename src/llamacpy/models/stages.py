"""The named stages a decoder block is made of, as compiled kernels.

An architecture lists its block as stage names (``llama.py``: ``attn_norm``, ``qkv``,
``rope``, ``kv_store``, ``attention``, ``out_proj``, ``out_rows``, ``ffn_norm``,
``ffn_swiglu``, ``ffn_down``); :mod:`.compose` writes them, in that order, into the
architecture's compiled per-ubatch forward, which calls them in that order; the whole
network still runs in one parallel region of ``n_threads`` workers that meet at a spin
barrier between dependent stages. Each stage is compiled (and cached) once per set of
weight formats and shared by every architecture whose block names it, so a new block
compiles only its loop: inlining them made each architecture recompile every stage (and
the unoptimized code of one inlined forward was 20 times its optimized size), with no
gain in speed. Their helpers (``_mm``, ``_sync``, ...) are inlined into them.

A stage is ``clk = stage(c, L, clk)``: ``c`` is the worker's :class:`Ctx` (the ubatch, the
weights, the KV cache, scratch buffers, this thread's id), ``L`` the layer's row of the
layer table (:data:`LAYER_DTYPE`: matrix indices, vector offsets, activation kinds, flags),
``clk`` the profile clock (cycles per stage, see ``P_*``).

Work is split by output row groups for matmuls (each thread streams its share of every
weight once, for all tokens), by tokens for norms / rope / quantization, by (token, head)
for attention. A single-row ubatch (decode) skips the token-split stages: every thread
normalizes and quantizes the one activation row itself into a private buffer (row ``tid``
of ``XP`` / ``AP``), which saves a barrier per norm.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from ..ops.activations import geglu, mul_silu, sigmoid, silu, swiglu, swiglu_oai
from ..ops.attention import (
    attention_rows,
    attention_split_merge,
    attention_split_partial,
    attention_tiled,
    fwht,
    k_rotation,
    store_row,
    v_rotation,
)
from ..ops.delta_net import delta_rule_head, l2_norm
from ..ops.dequant import get_row_sel
from ..ops.matmul import matmul_rows_sel, matmul_sel, prepare_acts
from ..ops.moe import expert_weights, shared_gate, softmax_ggml, top_k
from ..ops.norm import head_rms_norm, head_rms_norm_plain, rms_norm
from ..ops.rope import rope_apply, rope_cache
from ..ops.ssm import conv_bias_tokens, scan_head
from ..ops.threads import barrier, split, tick, timed_barrier

MODE_ROWS, MODE_TILED, MODE_SPLIT = 0, 1, 2  # attention kernels (see engine.context)
# profile slots (cycles per thread, see Workspace.prof)
P_EMBD, P_NORM, P_QKV, P_ROPE, P_ATTN, P_OUT_PROJ, P_FFN_UP, P_FFN_DOWN, P_HEAD = range(9)

# expert_gating: softmax over all experts, then the most probable ones (GATING_SOFTMAX);
# the largest logits, then a softmax over those (GATING_SOFTMAX_WEIGHT, gpt-oss)
GATING_SOFTMAX, GATING_SOFTMAX_WEIGHT = 0, 1
# sigmoid of each logit; the experts chosen by sigmoid + ffn_exp_probs_b, weighted by the
# sigmoid alone (lfm2moe, deepseek-v3's router)
GATING_SIGMOID = 2
# expert_act: silu(g) * u; gpt-oss's clamped variant; gelu(g) * u (gemma4)
ACT_SWIGLU, ACT_SWIGLU_OAI, ACT_GEGLU = 0, 1, 2
NONE = -1  # a matrix index / vector offset of a tensor the layer does not have
# One row per layer. Matrices: index into the weight store; vectors: offset into its float
# buffer; need_*: activation kinds the matrices reading that input consume
# (ops.matmul.act_need); swa: sliding-window layer; recurrent: a recurrent layer; rope:
# keys and queries are rotated; index: the layer's number; kv_index: its layer in the
# memory of its kind (global, sliding-window or recurrent); last: 1 in the last layer.
# The model table has a row per layer: the model's sizes with the layer's own geometry
# (head size, KV heads, rope dimensions, FFN size: gemma4's local and global layers); the
# worker's context carries the row of the layer it runs (``at_layer``).
LAYER_DTYPE = np.dtype(
    [
        (name, np.int64)
        for name in (
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_output",
            "ffn_gate",
            "ffn_up",
            "ffn_down",
            "ffn_gate_inp",  # mixture of experts: the router
            "ffn_gate_exps",  # and the first expert's matrix of each kind (expert e: + e)
            "ffn_up_exps",
            "ffn_down_exps",
            "attn_qkv",  # Gated DeltaNet (qwen35): in-projections and out-projection
            "attn_gate",
            "ssm_beta",
            "ssm_alpha",
            "ssm_out",
            "ssm_in",  # Mamba-2: the in-projection z | xBC | dt
            "attn_norm",
            "ffn_norm",
            "attn_q_norm",
            "attn_k_norm",
            "post_attention_norm",
            "post_ffw_norm",
            "attn_q_bias",
            "attn_k_bias",
            "attn_v_bias",
            "ssm_conv1d",  # Gated DeltaNet: conv taps [channel, d_conv], dt bias, A, norm
            "ssm_dt_bias",
            "ssm_a",
            "ssm_norm",
            "ssm_conv1d_bias",  # Mamba-2: conv bias per channel, skip weight D per head
            "ssm_d",
            "attn_output_bias",
            "attn_sinks",  # one learned score per head added to the softmax (gpt-oss)
            "ffn_gate_inp_bias",  # mixture of experts: router bias
            "ffn_gate_exps_bias",  # and the first expert's biases (expert e: + e * rows)
            "ffn_up_exps_bias",
            "ffn_down_exps_bias",
            "ffn_gate_inp_shexp",  # a shared expert's one-row gate (qwen35moe)
            "ffn_exp_probs_b",  # sigmoid gating: bias of the experts' selection scores
            "attn_q_a",  # multi-head latent attention (deepseek2): low-rank q, its norm,
            "attn_q_b",  # q's up-projection, the compressed kv | shared rope key, its norm,
            "attn_kv_a_mqa",  # each head's absorbed key (q_nope -> latent) and value
            "attn_k_b",  # (latent -> head value) matrices (head h: + h)
            "attn_v_b",
            "attn_q_a_norm",
            "attn_kv_a_norm",
            "n_ff",  # the layer's FFN size when not the model's (deepseek2's shared experts)
            "layer_output_scale",  # gemma4: the layer's output times this one float
            "ffn_gate_inp_scale",  # gemma4's experts: the router input's scale per channel,
            "ffn_down_exps_scale",  # each expert's output scale (expert e: + e),
            "pre_ffw_norm_2",  # the experts' input norm and the output norms of the dense
            "post_ffw_norm_1",  # FFN (1) and of the experts (2)
            "post_ffw_norm_2",
            "inp_gate",  # gemma4's per-layer embeddings: the gate of the layer's input, its
            "proj",  # projection back to n_embd and that output's norm
            "post_norm",
            "need_qkv",
            "need_out",
            "need_ffn",
            "need_down",
            "need_q_b",  # multi-head latent attention: the inputs of attn_q_b, attn_k_b,
            "need_k_b",  # attn_v_b
            "need_v_b",
            "need_ple_gate",  # per-layer embeddings: the inputs of inp_gate, proj
            "need_ple_proj",
            "swa",
            "recurrent",  # a recurrent layer (state rows instead of KV cells)
            "moe",  # the layer's FFN is a mixture of experts (its router exists)
            "rope",
            "index",
            "kv_index",
            "kv_shared",  # 1: the layer attends an earlier layer's KV (at its kv_index)
            "last",
        )
    ]
)
# The model's one row: sizes, global tensors, float settings.
MODEL_DTYPE = np.dtype(
    [
        ("n_embd", np.int64),
        ("n_head", np.int64),
        ("n_head_kv", np.int64),
        ("head_dim", np.int64),
        ("n_ff", np.int64),
        ("n_vocab", np.int64),
        ("n_layer", np.int64),
        ("n_rot", np.int64),
        ("token_embd", np.int64),
        ("output", np.int64),
        ("output_norm", np.int64),
        ("need_output", np.int64),
        ("n_expert", np.int64),  # mixture of experts (0: none)
        ("n_expert_used", np.int64),  # experts per token
        ("n_ff_exp", np.int64),  # an expert's FFN size
        ("expert_norm", np.int64),  # 1: the selected experts' weights divided by their sum
        ("expert_gating", np.int64),  # GATING_*: how the router's logits become weights
        ("expert_act", np.int64),  # ACT_*: the experts' gated activation
        ("ssm_d_conv", np.int64),  # Gated DeltaNet (0: none): convolution taps
        ("ssm_d_state", np.int64),  # head size of the keys (S_k)
        ("ssm_n_group", np.int64),  # key heads (H_k)
        ("ssm_dt_rank", np.int64),  # value heads (H_v)
        ("ssm_d_inner", np.int64),  # H_v * S_v
        ("eps", np.float32),
        ("kq_scale", np.float32),  # scale of the K.Q scores
        ("q_scale", np.float32),  # scale of the roped queries (gemma3, phi3)
        ("embd_scale", np.float32),  # token embeddings are multiplied by this
        ("softcap", np.float32),  # logits -> c * tanh(logits / c) when c > 0
        ("expert_scale", np.float32),  # experts' weights are multiplied by this (0, 1: not)
        ("attn_softcap", np.float32),  # attention scores -> c * tanh(s / c) when c > 0
        ("n_expert_groups", np.int64),  # experts chosen from the best groups (0, 1: none)
        ("n_group_used", np.int64),  # ... of these many groups
        ("n_lora_q", np.int64),  # multi-head latent attention (0: none): q's rank (0: direct)
        ("n_lora_kv", np.int64),  # the latent's size (the cache row: latent | rope key)
        ("head_k_mla", np.int64),  # a head's query/key size (nope | rope) before absorption
        ("head_v_mla", np.int64),  # a head's value size after attn_v_b
        ("residual_scale", np.float32),  # a block's outputs times this before the residual
        ("logit_scale", np.float32),  # logits are multiplied by this (granite: 1 / scale)
        ("n_embd_pl", np.int64),  # gemma4's per-layer embeddings (0: none): their size,
        ("per_layer_token_embd", np.int64),  # the table of each token's (all layers'),
        ("per_layer_model_proj", np.int64),  # the projection of the token embedding,
        ("per_layer_proj_norm", np.int64),  # its norm per layer,
        ("need_ple", np.int64),  # and the activation kind of that projection's input
    ]
)
# Per worker: rows the stages work on (the last layer's FFN runs on the output rows only)
STATE_DTYPE = np.dtype([("n_rows", np.int64)] + [
    (f"_pad{i}", np.int64) for i in range(7)  # one cache line per worker
])  # fmt: skip

# What a worker's stages read. Buffers: X [n, n_embd] hidden state; XN norm / scratch rows;
# Q, KN, VN projections; ATT attention output; G, U gate / up (a row per token, or per
# token and selected expert: row t * n_expert_used + j); RL router logits / probabilities,
# SEL, WTS each token's selected experts and their weights, EO the selected experts' outputs
# (rows as G), ER per thread those rows grouped by expert; A, AP activation buffers (shared, private per thread); XP private rows; LOG
# logits; TS per-thread attention scratch; prof cycles per stage; IM the importance-matrix
# sums (the im_* stages; one row otherwise).
# The KV cache a layer kind uses (global, sliding-window): flat K and V cells, the cell of
# each token, the mask, the cells attended, the attention kernel, the bytes between heads,
# the order of the cells, the bytes of a row (each part has its own head size: gemma4).
KVPart = namedtuple("KVPart", "KC VC cells mask n_kv mode hstride order rowb")
Ctx = namedtuple(
    "Ctx",
    "fmask tid nth M W WD NF RP FF tokens pos out_idx n_tok n_out kv kv_swa k_type v_type "
    "rowb kvi X XN Q KN VN ATT G U RL SEL WTS EO ER A AP XP LOG TS prof IM bar st",
)


@intrinsic
def _borrow(typingctx, x):
    """``x`` (an array, or a tuple of arrays and tuples) with no memory-manager reference:
    the stages' reference counting on it becomes a null check instead of an atomic add on
    a cache line every thread shares (the caller keeps the arrays alive)."""

    def strip(context, builder, ty, val):
        if isinstance(ty, types.Array):
            ary = cgutils.create_struct_proxy(ty)(context, builder, value=val)
            ary.meminfo = cgutils.get_null_value(ary.meminfo.type)
            return ary._getvalue()
        if isinstance(ty, types.BaseTuple):
            for i, t in enumerate(ty):
                val = builder.insert_value(
                    val, strip(context, builder, t, builder.extract_value(val, i)), i
                )
        return val

    def codegen(context, builder, sig, args):
        return strip(context, builder, sig.args[0], args[0])

    return x(x), codegen


@njit(cache=True, inline="always")
def context(fmask, tid, nth, MA, WT, UB, KV, S, STATE, bar):
    """The worker's :class:`Ctx` (see :mod:`.compose` for the argument groups)."""
    WT, UB, KV, S = _borrow(WT), _borrow(UB), _borrow(KV), _borrow(S)
    W, WD, NF, RP, FF = WT
    tokens, pos, cells, cells_swa, mask, mask_swa, out_idx, ui, order, order_swa = UB
    KC, VC, KCs, VCs, kvi = KV
    X, XN, Q, KN, VN, ATT, G, U, RL, SEL, WTS, EO, ER, A, AP, XP, LOG, TS, prof, IM = S
    rowb, rowb_swa = kvi[2], kvi[5]
    st = STATE[tid]
    st.n_rows = ui[0]
    return Ctx(
        fmask, tid, nth, MA[0], W, WD, NF, RP, FF, tokens, pos, out_idx, ui[0], ui[3],
        KVPart(KC, VC, cells, mask, ui[1], ui[2], kvi[3] * rowb, order, rowb),
        KVPart(KCs, VCs, cells_swa, mask_swa, ui[4], ui[5], kvi[4] * rowb_swa, order_swa,
               rowb_swa),
        kvi[0], kvi[1], rowb, kvi, X, XN, Q, KN, VN, ATT, G, U, RL, SEL, WTS, EO, ER, A, AP, XP, LOG,
        TS, prof, IM, bar, st,
    )  # fmt: skip


@njit(cache=True, inline="always")
def at_layer(c, MA, il):
    """The context ``c`` with the model row of layer ``il`` (its geometry)."""
    return Ctx(
        c.fmask, c.tid, c.nth, MA[il], c.W, c.WD, c.NF, c.RP, c.FF, c.tokens, c.pos,
        c.out_idx, c.n_tok, c.n_out, c.kv, c.kv_swa, c.k_type, c.v_type, c.rowb, c.kvi, c.X,
        c.XN, c.Q, c.KN, c.VN, c.ATT, c.G, c.U, c.RL, c.SEL, c.WTS, c.EO, c.ER, c.A, c.AP,
        c.XP, c.LOG, c.TS, c.prof, c.IM, c.bar, c.st,
    )  # fmt: skip


# ----------------------------------------------------------------------------- helpers
@njit(cache=True, inline="always")
def _sync(c, clk):
    return timed_barrier(c.bar, c.nth, c.prof, c.tid, clk)


@njit(cache=True, inline="always")
def _acts(c):
    """(first row, end row, activation buffers) a matmul reads: this thread's private row
    in a single-row ubatch, else all rows of the shared buffers."""
    if c.st.n_rows == 1:
        return c.tid, c.tid + 1, c.AP
    return 0, c.st.n_rows, c.A


@njit(cache=True, inline="always")
def _mm(c, wi, out, add):
    """This thread's share of the row groups of matrix ``wi``: ``out (+)= W . act``."""
    ta, tb, AA = _acts(c)
    g0, g1 = split((c.WD[wi, 2] + 15) // 16, c.tid, c.nth)
    matmul_sel(c.fmask, c.W, c.WD[wi], AA, ta, tb, g0, g1, out, 0, add)


@njit(cache=True, inline="always")
def _norm_in(c, src, off, need, clk):
    """``rms_norm(src rows) * NF[off:]`` quantized for the matmuls that read it (``need``);
    a single row is normalized by every thread into its private row (no barrier)."""
    n_embd, tid = c.M.n_embd, c.tid
    w = c.NF[off : off + n_embd]
    if c.st.n_rows == 1:
        c.XP[tid, :n_embd] = src[0, :n_embd]
        rms_norm(c.XP, tid, tid + 1, n_embd, w, c.M.eps, c.XP)
        prepare_acts(c.XP, tid, tid + 1, n_embd, need, c.AP)
        return tick(c.prof, tid, P_NORM, clk)
    t0, t1 = split(c.st.n_rows, tid, c.nth)
    rms_norm(src, t0, t1, n_embd, w, c.M.eps, c.XN)
    prepare_acts(c.XN, t0, t1, n_embd, need, c.A)
    return _sync(c, tick(c.prof, tid, P_NORM, clk))


@njit(cache=True, inline="always")
def _quantize_in(c, src, k, need, slot, clk):
    """Rows of ``src[:, :k]`` quantized for the next matmul (private in a single row)."""
    tid = c.tid
    if c.st.n_rows == 1:
        c.XP[tid, :k] = src[0, :k]
        prepare_acts(c.XP, tid, tid + 1, k, need, c.AP)
        return clk
    t0, t1 = split(c.st.n_rows, tid, c.nth)
    prepare_acts(src, t0, t1, k, need, c.A)
    return _sync(c, tick(c.prof, tid, slot, clk))


@njit(cache=True, inline="always")
def _proj_residual(c, wi, post, slot, clk):
    """``X += W_wi . act`` -- or, with a post-norm at ``NF[post]``, ``X += rms_norm(W_wi .
    act) * post`` through the scratch rows ``XN`` (two more barriers); with a
    ``residual_scale`` other than 1 (granite), ``X = (W_wi . act) * residual_scale + X``."""
    if post < 0 and c.M.residual_scale != 1.0:
        _mm(c, wi, c.XN, False)
        n_embd, rs = c.M.n_embd, c.M.residual_scale
        g0, g1 = split((n_embd + 15) // 16, c.tid, c.nth)  # the columns this thread wrote
        for t in range(c.st.n_rows):
            for i in range(16 * g0, min(16 * g1, n_embd)):
                c.X[t, i] = c.XN[t, i] * rs + c.X[t, i]
        return _sync(c, tick(c.prof, c.tid, slot, clk))
    if post < 0:
        _mm(c, wi, c.X, True)
        return _sync(c, tick(c.prof, c.tid, slot, clk))
    _mm(c, wi, c.XN, False)
    clk = _sync(c, tick(c.prof, c.tid, slot, clk))
    n_embd = c.M.n_embd
    t0, t1 = split(c.st.n_rows, c.tid, c.nth)
    rms_norm(c.XN, t0, t1, n_embd, c.NF[post : post + n_embd], c.M.eps, c.XN)
    for t in range(t0, t1):
        for i in range(n_embd):
            c.X[t, i] += c.XN[t, i]
    return _sync(c, tick(c.prof, c.tid, P_NORM, clk))


@njit(cache=True, inline="always")
def _token_rows(c):
    return split(c.st.n_rows, c.tid, c.nth)


# ----------------------------------------------------------------------------- stages
@njit(cache=True)
def embed(c, clk):
    """``X[t] = token_embd[token t] * embd_scale`` (rows dequantized from the repacked table)."""
    M = c.M
    emb, n_embd = M.token_embd, M.n_embd
    t0, t1 = _token_rows(c)
    for t in range(t0, t1):
        get_row_sel(c.fmask, c.W, c.WD[emb, 1], c.WD[emb, 0], n_embd, c.tokens[t], c.X[t])
        if M.embd_scale != 1.0:
            for i in range(n_embd):
                c.X[t, i] *= M.embd_scale
    return _sync(c, tick(c.prof, c.tid, P_EMBD, clk))


@njit(cache=True)
def attn_norm(c, L, clk):
    """``h = rms_norm(x) * attn_norm``, quantized for q/k/v."""
    return _norm_in(c, c.X, L.attn_norm, L.need_qkv, clk)


@njit(cache=True)
def attn_in(c, L, clk):
    """``h = x`` quantized for q/k/v (a block without a pre-attention norm: olmo2)."""
    return _quantize_in(c, c.X, c.M.n_embd, L.need_qkv, P_NORM, clk)


@njit(cache=True)
def qkv(c, L, clk):
    """``q, k, v = h . attn_q, h . attn_k, h . attn_v`` (k and v only in a layer with KV of
    its own; v only when the layer has ``attn_v``: see ``v_norm``)."""
    _mm(c, L.attn_q, c.Q, False)
    if L.kv_shared == 0:
        _mm(c, L.attn_k, c.KN, False)
        if L.attn_v >= 0:
            _mm(c, L.attn_v, c.VN, False)
    return _sync(c, tick(c.prof, c.tid, P_QKV, clk))


@njit(cache=True)
def qkv_bias(c, L, clk):
    """``q += attn_q.bias`` (k, v likewise) for the biases the layer has."""
    M = c.M
    qd, kvd = M.n_head * M.head_dim, M.n_head_kv * M.head_dim
    qb, kb, vb = L.attn_q_bias, L.attn_k_bias, L.attn_v_bias
    t0, t1 = _token_rows(c)
    for t in range(t0, t1):
        if qb >= 0:
            for i in range(qd):
                c.Q[t, i] += c.NF[qb + i]
        if kb >= 0:
            for i in range(kvd):
                c.KN[t, i] += c.NF[kb + i]
        if vb >= 0:
            for i in range(kvd):
                c.VN[t, i] += c.NF[vb + i]
    return clk


@njit(cache=True)
def qk_norm(c, L, clk):
    """Per-head ``rms_norm(q_h) * attn_q_norm``, ``rms_norm(k_h) * attn_k_norm`` (k only in
    a layer with KV of its own)."""
    M = c.M
    hd, qn, kn = M.head_dim, L.attn_q_norm, L.attn_k_norm
    t0, t1 = _token_rows(c)
    for t in range(t0, t1):
        head_rms_norm(c.Q, t, 0, M.n_head, hd, c.NF[qn : qn + hd], M.eps)
        if L.kv_shared == 0:
            head_rms_norm(c.KN, t, 0, M.n_head_kv, hd, c.NF[kn : kn + hd], M.eps)
    return clk


@njit(cache=True)
def v_norm(c, L, clk):
    """Per-head ``rms_norm(v_h)`` without a weight (gemma4); a layer without ``attn_v``
    takes its values from its keys before their norm and rope (``v = h . attn_k``: runs
    before ``qk_norm``); nothing in a layer reading an earlier layer's KV."""
    M = c.M
    if L.kv_shared != 0:
        return clk
    kvd = M.n_head_kv * M.head_dim
    t0, t1 = _token_rows(c)
    for t in range(t0, t1):
        if L.attn_v < 0:
            c.VN[t, :kvd] = c.KN[t, :kvd]
        head_rms_norm_plain(c.VN, t, 0, M.n_head_kv, M.head_dim, M.eps)
    return clk


@njit(cache=True)
def qk_norm_full(c, L, clk):
    """``rms_norm(q) * attn_q_norm``, ``rms_norm(k) * attn_k_norm`` over all heads of a
    token at once (olmo2's norms of the whole projections, not per head)."""
    M = c.M
    qd, kd = M.n_head * M.head_dim, M.n_head_kv * M.head_dim
    qn, kn = L.attn_q_norm, L.attn_k_norm
    t0, t1 = _token_rows(c)
    rms_norm(c.Q, t0, t1, qd, c.NF[qn : qn + qd], M.eps, c.Q)
    rms_norm(c.KN, t0, t1, kd, c.NF[kn : kn + kd], M.eps, c.KN)
    return clk


@njit(cache=True)
def rope(c, L, clk):
    """Rotate q and k by their positions (the layer's rope: global or sliding-window row
    of ``RP``); layers with ``L.rope == 0`` (NoPE) are left as they are."""
    if L.rope == 0:
        return clk
    M = c.M
    rp = c.RP[L.swa]
    rc = c.TS[0][c.tid]
    neox = rp[7] != 0
    t0, t1 = _token_rows(c)
    for t in range(t0, t1):
        rope_cache(c.pos[t], rp, c.FF, rc)
        rope_apply(c.Q, t, 0, M.n_head, M.head_dim, rc, M.n_rot, neox)
        if L.kv_shared == 0:
            rope_apply(c.KN, t, 0, M.n_head_kv, M.head_dim, rc, M.n_rot, neox)
    return clk


@njit(cache=True)
def scale_q(c, L, clk):
    """``q *= q_scale`` (gemma3, phi3: queries are scaled after rope, the scores are not)."""
    qd = c.M.n_head * c.M.head_dim
    t0, t1 = _token_rows(c)
    for t in range(t0, t1):
        for i in range(qd):
            c.Q[t, i] *= c.M.q_scale
    return clk


@njit(cache=True)
def kv_store(c, L, clk):
    """Write k and v of each token into its cache cell (in the cache's type). A quantized
    cache holds k (and q with it) and v rotated (see :mod:`..ops.attention`). A layer
    reading an earlier layer's KV stores nothing (its q rotated like the keys it reads)."""
    M = c.M
    kv = c.kv_swa if L.swa != 0 else c.kv
    hd, base = M.head_dim, _layer_base(c, L, kv)
    rk, rv = k_rotation(c.k_type, hd), v_rotation(c.v_type, hd)
    own = L.kv_shared == 0
    t0, t1 = _token_rows(c)
    for t in range(t0, t1):
        if rk:
            fwht(c.Q[t], 0, M.n_head * hd, rk)
            if own:
                fwht(c.KN[t], 0, M.n_head_kv * hd, rk)
        if rv and own:
            fwht(c.VN[t], 0, M.n_head_kv * hd, rv)
        for h in range(M.n_head_kv if own else 0):
            o = base + h * kv.hstride + kv.cells[t] * kv.rowb
            store_row(c.KN[t], h * hd, hd, c.k_type, kv.KC, o)
            store_row(c.VN[t], h * hd, hd, c.v_type, kv.VC, o)
    return _sync(c, tick(c.prof, c.tid, P_ROPE, clk))


@njit(cache=True, inline="always")
def _layer_base(c, L, kv):
    """Byte offset of the layer's first head in the flat caches of its kind."""
    return L.kv_index * c.M.n_head_kv * kv.hstride


@njit(cache=True)
def attention(c, L, clk):
    """``att = softmax(q . K^T * kq_scale + mask) . V`` over the cached cells the layer may
    see (sliding-window layers: their own cache and mask); with ``attn_softcap`` c > 0 the
    scores are ``c * tanh(q . K^T * kq_scale / c)`` before the mask (gemma2)."""
    kv = c.kv_swa if L.swa != 0 else c.kv
    gqa = c.M.n_head // c.M.n_head_kv
    sk = L.attn_sinks
    sinks = c.NF[sk : sk + c.M.n_head] if sk >= 0 else c.NF[:0]
    _attention(c, kv, _layer_base(c, L, kv), gqa, sinks)
    clk = _sync(c, tick(c.prof, c.tid, P_ATTN, clk))
    rv = v_rotation(c.v_type, c.M.head_dim)
    if rv:  # the output of rotated values, rotated back
        t0, t1 = _token_rows(c)
        for t in range(t0, t1):
            fwht(c.ATT[t], 0, c.M.n_head * c.M.head_dim, rv)
        clk = _sync(c, tick(c.prof, c.tid, P_ATTN, clk))
    return clk


@njit(cache=True)
def out_proj(c, L, clk):
    """``x += att . attn_output``."""
    clk = _quantize_in(c, c.ATT, c.M.n_head * c.M.head_dim, L.need_out, P_OUT_PROJ, clk)
    return _proj_residual(c, L.attn_output, NONE, P_OUT_PROJ, clk)


@njit(cache=True)
def out_proj_post_norm(c, L, clk):
    """``x += rms_norm(att . attn_output) * post_attention_norm``."""
    clk = _quantize_in(c, c.ATT, c.M.n_head * c.M.head_dim, L.need_out, P_OUT_PROJ, clk)
    return _proj_residual(c, L.attn_output, L.post_attention_norm, P_OUT_PROJ, clk)


@njit(cache=True)
def out_proj_bias(c, L, clk):
    """``x += att . attn_output + attn_output.bias``."""
    M = c.M
    clk = _quantize_in(c, c.ATT, M.n_head * M.head_dim, L.need_out, P_OUT_PROJ, clk)
    _mm(c, L.attn_output, c.XN, False)
    g0, g1 = split((M.n_embd + 15) // 16, c.tid, c.nth)  # the columns this thread wrote
    for t in range(c.st.n_rows):
        _add_vec(c.XN, t, c.NF, L.attn_output_bias, 16 * g0, min(16 * g1, M.n_embd))
        for i in range(16 * g0, min(16 * g1, M.n_embd)):
            c.X[t, i] += c.XN[t, i]
    return _sync(c, tick(c.prof, c.tid, P_OUT_PROJ, clk))


@njit(cache=True, inline="always")
def _add_vec(a, r, NF, off, i0, i1):
    """``a[r, i] += NF[off + i]`` for ``i`` in ``i0..i1`` (nothing when ``off`` < 0)."""
    if off >= 0:
        for i in range(i0, i1):
            a[r, i] += NF[off + i]


@njit(cache=True, inline="always")
def _expert_vec(off, e, n):
    """Offset of expert ``e``'s row of ``n`` floats in the per-expert vectors at ``off``."""
    return off + e * n if off >= 0 else NONE


@njit(cache=True)
def out_rows(c, L, clk):
    """In the last layer only the rows whose logits are wanted go on, gathered to the front
    of ``X`` (llama.cpp's ``inp_out_ids``), so that the FFN's matmuls see as many rows as
    llama.cpp's (their numerics depend on the count)."""
    n_out, n_embd = c.n_out, c.M.n_embd
    if L.last == 0 or not 0 < n_out < c.n_tok:
        return clk
    if c.tid == 0:
        for i in range(n_out):
            c.X[i, :n_embd] = c.X[c.out_idx[i], :n_embd]
    c.st.n_rows = n_out
    return _sync(c, clk)


@njit(cache=True)
def ffn_norm(c, L, clk):
    """``h = rms_norm(x) * ffn_norm``, quantized for gate/up."""
    return _norm_in(c, c.X, L.ffn_norm, L.need_ffn, clk)


@njit(cache=True)
def ffn_in(c, L, clk):
    """``h = x`` quantized for gate/up (a block without a pre-FFN norm: olmo2)."""
    return _quantize_in(c, c.X, c.M.n_embd, L.need_ffn, P_NORM, clk)


@njit(cache=True)
def ffn_post_attn_norm(c, L, clk):
    """``h = rms_norm(x) * post_attention_norm``, quantized for the FFN (gpt-oss's pre-FFN
    norm)."""
    return _norm_in(c, c.X, L.post_attention_norm, L.need_ffn, clk)


@njit(cache=True, inline="always")
def _gate_up(c, L, act, clk):
    """``g = act(h . ffn_gate) * (h . ffn_up)`` (act 0: SiLU, 1: GELU), quantized for down
    (the layer's ``n_ff`` when it has its own, else the model's)."""
    n_ff = L.n_ff if L.n_ff > 0 else c.M.n_ff
    n = c.st.n_rows
    ta, tb, AA = _acts(c)
    g0, g1 = split((n_ff + 15) // 16, c.tid, c.nth)
    matmul_sel(c.fmask, c.W, c.WD[L.ffn_gate], AA, ta, tb, g0, g1, c.G, 0, False)
    matmul_sel(c.fmask, c.W, c.WD[L.ffn_up], AA, ta, tb, g0, g1, c.U, 0, False)
    if act == 1:
        geglu(c.G, c.U, 0, n, 16 * g0, min(16 * g1, n_ff), c.G)
    else:
        swiglu(c.G, c.U, 0, n, 16 * g0, min(16 * g1, n_ff), c.G)
    clk = _sync(c, tick(c.prof, c.tid, P_FFN_UP, clk))
    return _quantize_in(c, c.G, n_ff, L.need_down, P_FFN_DOWN, clk)


@njit(cache=True)
def ffn_swiglu(c, L, clk):
    """``g = silu(h . ffn_gate) * (h . ffn_up)``."""
    return _gate_up(c, L, 0, clk)


@njit(cache=True)
def ffn_geglu(c, L, clk):
    """``g = gelu(h . ffn_gate) * (h . ffn_up)`` (tanh approximation, as ggml's)."""
    return _gate_up(c, L, 1, clk)


@njit(cache=True)
def ffn_down(c, L, clk):
    """``x += g . ffn_down``."""
    return _proj_residual(c, L.ffn_down, NONE, P_FFN_DOWN, clk)


@njit(cache=True)
def ffn_down_post_norm(c, L, clk):
    """``x += rms_norm(g . ffn_down) * post_ffw_norm``."""
    return _proj_residual(c, L.ffn_down, L.post_ffw_norm, P_FFN_DOWN, clk)


@njit(cache=True)
def layer_scale(c, L, clk):
    """``x *= layer_output_scale`` (one float; gemma4), when the layer has it."""
    off = L.layer_output_scale
    if off < 0:
        return clk
    s, n_embd = c.NF[off], c.M.n_embd
    t0, t1 = _token_rows(c)
    for t in range(t0, t1):
        for i in range(n_embd):
            c.X[t, i] *= s
    return _sync(c, clk)


@njit(cache=True)
def ple_inputs(c, L, clk):
    """gemma4's per-layer embeddings, in the first layer: each token's inputs of every
    layer, ``(rms_norm(x . per_layer_model_proj / sqrt(n_embd)) * per_layer_proj_norm +
    per_layer_token_embd[token] * sqrt(n_pl)) / sqrt(2)`` (the norm per layer's slice of
    ``n_pl``), kept in ``X``'s columns after ``n_embd`` (layer ``l``'s at ``n_embd + l *
    n_pl``)."""
    if L.index != 0 or c.M.n_embd_pl == 0:
        return clk
    M = c.M
    e, npl, emb, pn = M.n_embd, M.n_embd_pl, M.per_layer_token_embd, M.per_layer_proj_norm
    w = M.n_layer * npl
    clk = _quantize_in(c, c.X, e, M.need_ple, P_EMBD, clk)
    _mm(c, M.per_layer_model_proj, c.XN, False)
    clk = _sync(c, tick(c.prof, c.tid, P_EMBD, clk))
    inv_e = np.float32(1.0) / np.sqrt(np.float32(e))
    s_pl = np.sqrt(np.float32(npl))
    inv_2 = np.float32(1.0) / np.sqrt(np.float32(2.0))
    t0, t1 = _token_rows(c)
    for t in range(t0, t1):
        for i in range(w):
            c.XN[t, i] *= inv_e
        head_rms_norm(c.XN, t, 0, M.n_layer, npl, c.NF[pn : pn + npl], M.eps)
        get_row_sel(c.fmask, c.W, c.WD[emb, 1], c.WD[emb, 0], w, c.tokens[t], c.U[t])
        for i in range(w):
            c.X[t, e + i] = (c.XN[t, i] + c.U[t, i] * s_pl) * inv_2
    return _sync(c, tick(c.prof, c.tid, P_EMBD, clk))


@njit(cache=True)
def ple_residual(c, L, clk):
    """gemma4's per-layer embeddings, after the FFN: ``x += rms_norm((gelu(x . inp_gate) *
    inputs of the layer) . proj) * post_norm`` (``ple_inputs``), when the layer has them."""
    if L.inp_gate < 0:
        return clk
    M = c.M
    npl, n = M.n_embd_pl, c.st.n_rows
    base = M.n_embd + L.index * npl
    clk = _quantize_in(c, c.X, M.n_embd, L.need_ple_gate, P_NORM, clk)
    _mm(c, L.inp_gate, c.G, False)
    g0, g1 = split((npl + 15) // 16, c.tid, c.nth)  # the columns this thread wrote
    c0, c1 = 16 * g0, min(16 * g1, npl)
    for t in range(n):
        for i in range(c0, c1):
            c.U[t, i] = c.X[t, base + i]
    geglu(c.G, c.U, 0, n, c0, c1, c.G)
    clk = _sync(c, tick(c.prof, c.tid, P_FFN_UP, clk))
    clk = _quantize_in(c, c.G, npl, L.need_ple_proj, P_FFN_DOWN, clk)
    return _proj_residual(c, L.proj, L.post_norm, P_FFN_DOWN, clk)


@njit(cache=True)
def ffn_router(c, L, clk):
    """Mixture of experts: ``p = softmax(h . ffn_gate_inp (+ bias))`` per token (float32,
    ggml's), its ``n_expert_used`` most probable experts (best first) and their weights
    ``p_e`` (divided by their sum with ``expert_norm``, times ``expert_scale``); with
    ``GATING_SOFTMAX_WEIGHT`` the largest logits are chosen and their softmax is the weights;
    with ``GATING_SIGMOID`` ``p = sigmoid(logits)``, the experts chosen by ``p +
    ffn_exp_probs_b``."""
    M = c.M
    ta, tb, AA = _acts(c)
    g0, g1 = split((M.n_expert + 15) // 16, c.tid, c.nth)
    matmul_sel(c.fmask, c.W, c.WD[L.ffn_gate_inp], AA, ta, tb, g0, g1, c.RL, 0, False)
    clk = _sync(c, tick(c.prof, c.tid, P_FFN_UP, clk))
    k = M.n_expert_used
    t0, t1 = _token_rows(c)
    for t in range(t0, t1):
        _add_vec(c.RL, t, c.NF, L.ffn_gate_inp_bias, 0, M.n_expert)
        if M.expert_gating == GATING_SOFTMAX_WEIGHT:
            top_k(c.RL[t], M.n_expert, k, c.SEL[t], c.WTS[t])
            softmax_ggml(c.WTS[t], k)
        elif M.expert_gating == GATING_SIGMOID:  # (U's row t: scratch until ffn_moe)
            for e in range(M.n_expert):
                c.RL[t, e] = sigmoid(c.RL[t, e])
            _select_biased(c, L, t)
        elif M.n_expert_groups > 1 or L.ffn_exp_probs_b >= 0:  # softmax, grouped or biased
            softmax_ggml(c.RL[t], M.n_expert)
            _select_biased(c, L, t)
        else:
            softmax_ggml(c.RL[t], M.n_expert)
            top_k(c.RL[t], M.n_expert, k, c.SEL[t], c.WTS[t])
        expert_weights(c.WTS[t], k, M.expert_norm, M.expert_scale)
    return _sync(c, clk)


@njit(cache=True, inline="always")
def _select_biased(c, L, t):
    """Token ``t``'s experts chosen by their probabilities ``RL[t]`` plus the selection
    bias ``ffn_exp_probs_b`` (in ``U[t]``), within the ``n_group_used`` best groups when the
    experts are grouped; weighted by the unbiased probabilities."""
    M = c.M
    k = M.n_expert_used
    for e in range(M.n_expert):
        c.U[t, e] = c.RL[t, e]
    _add_vec(c.U, t, c.NF, L.ffn_exp_probs_b, 0, M.n_expert)
    if M.n_expert_groups > 1:
        _group_mask(c, t)
    top_k(c.U[t], M.n_expert, k, c.SEL[t], c.WTS[t])
    for j in range(k):
        c.WTS[t, j] = c.RL[t, c.SEL[t, j]]


@njit(cache=True, inline="always")
def _group_mask(c, t):
    """DeepSeek-V3's group-limited routing, as ``build_moe_ffn``: a group's score is the sum
    of its two best selection scores (``U[t]``); the experts outside the ``n_group_used``
    best groups get -inf. Scratch: this thread's rows of ``TS[2]``, ``TS[3]``, ``TS[4]``
    (head-sized; the model checks that the groups fit)."""
    M = c.M
    ng, per = M.n_expert_groups, M.n_expert // M.n_expert_groups
    isel, gs, top = c.TS[2][c.tid], c.TS[3][c.tid], c.TS[4][c.tid]
    for g in range(ng):
        top_k(c.U[t, g * per :], per, 2, isel, top)
        gs[g] = top[0] + top[1]
    top_k(gs, ng, M.n_group_used, isel, top)
    for g in range(ng):
        keep = False
        for j in range(M.n_group_used):
            if isel[j] == g:
                keep = True
        if not keep:
            for e in range(g * per, (g + 1) * per):
                c.U[t, e] = -np.inf


@njit(cache=True, inline="always")
def _expert_rows(c):
    """This thread's ``ER`` row: the (token, selected expert) rows ``r = t * n_expert_used +
    j`` of a ubatch grouped by expert (a counting sort; rows ascending within an expert):
    expert ``e``'s rows are ``ER[tid, n_expert + 2 + ER[tid, e] : ... + ER[tid, e + 1]]``.
    Every thread builds its own copy (a few microseconds; no barrier)."""
    M = c.M
    ne, k = M.n_expert, M.n_expert_used
    nr = c.st.n_rows * k
    er = c.ER[c.tid]
    for e in range(ne + 2):
        er[e] = 0
    for r in range(nr):
        er[c.SEL[r // k, r % k] + 2] += 1
    for e in range(2, ne + 2):
        er[e] += er[e - 1]
    for r in range(nr):  # er[e + 1]: the next free place of expert e (then its end)
        e = c.SEL[r // k, r % k]
        er[ne + 2 + er[e + 1]] = r
        er[e + 1] += 1


@njit(cache=True, inline="always")
def _expert_out(c, L, down, ee, r, g0, g1):
    """Row ``r`` (expert ``ee``) after its matmuls on this thread's row groups: plus the
    expert's bias, and (gate/up) ``G[r] = act(G[r], U[r])`` (``expert_act``)."""
    M = c.M
    if down:
        if L.ffn_down_exps_scale >= 0:  # (before the bias, as build_lora_mm_id)
            s = c.NF[L.ffn_down_exps_scale + ee]
            for i in range(16 * g0, min(16 * g1, M.n_embd)):
                c.EO[r, i] *= s
        b = _expert_vec(L.ffn_down_exps_bias, ee, M.n_embd)
        _add_vec(c.EO, r, c.NF, b, 16 * g0, min(16 * g1, M.n_embd))
        return
    f = M.n_ff_exp
    i1 = min(16 * g1, f)
    _add_vec(c.G, r, c.NF, _expert_vec(L.ffn_gate_exps_bias, ee, f), 16 * g0, i1)
    _add_vec(c.U, r, c.NF, _expert_vec(L.ffn_up_exps_bias, ee, f), 16 * g0, i1)
    if M.expert_act == ACT_SWIGLU_OAI:
        swiglu_oai(c.G, c.U, r, r + 1, 16 * g0, i1, c.G)
    elif M.expert_act == ACT_GEGLU:
        geglu(c.G, c.U, r, r + 1, 16 * g0, i1, c.G)
    else:
        swiglu(c.G, c.U, r, r + 1, 16 * g0, i1, c.G)


@njit(cache=True, inline="always")
def _experts(c, L, down, g0, g1):
    """Each (token t, selected expert j) row ``r = t * n_expert_used + j``, this thread's row
    groups ``g0..g1`` of the expert's matrices: ``G[r] = silu(h_t . gate_e) * (h_t . up_e)``,
    or (``down``) ``EO[r] = G[r] . down_e``; each product plus the expert's bias when the
    layer has one; ``expert_act`` picks the activation. Expert by expert, as ggml_mul_mat_id:
    the expert's rows (:func:`_expert_rows`) go through each matrix together
    (:func:`~llamacpy.ops.matmul.matmul_rows_sel`: a row group's weights, once in cache,
    serve all of them), each row with the numerics of a one-token matrix x vector product,
    as ggml's per-row kernels. One token: its experts in their order."""
    M = c.M
    n, k = c.st.n_rows, M.n_expert_used
    ta, _tb, AA = _acts(c)
    if n == 1:
        for j in range(k):
            ee = c.SEL[0, j]
            if down:
                wd = c.WD[L.ffn_down_exps + ee]
                matmul_sel(c.fmask, c.W, wd, c.A, j, j + 1, g0, g1, c.EO, j, False)
            else:
                wg, wu = c.WD[L.ffn_gate_exps + ee], c.WD[L.ffn_up_exps + ee]
                matmul_sel(c.fmask, c.W, wg, AA, ta, ta + 1, g0, g1, c.G, j, False)
                matmul_sel(c.fmask, c.W, wu, AA, ta, ta + 1, g0, g1, c.U, j, False)
            _expert_out(c, L, down, ee, j, g0, g1)
        return
    ne = M.n_expert
    er = c.ER[c.tid]
    for e in range(ne):
        rows = er[ne + 2 + er[e] : ne + 2 + er[e + 1]]
        m = rows.shape[0]
        if m == 0:
            continue
        if down:
            wd = c.WD[L.ffn_down_exps + e]
            matmul_rows_sel(c.fmask, c.W, wd, c.A, rows, m, 1, 0, g0, g1, c.EO, 0, False)
        else:
            wg, wu = c.WD[L.ffn_gate_exps + e], c.WD[L.ffn_up_exps + e]
            matmul_rows_sel(c.fmask, c.W, wg, AA, rows, m, k, ta, g0, g1, c.G, 0, False)
            matmul_rows_sel(c.fmask, c.W, wu, AA, rows, m, k, ta, g0, g1, c.U, 0, False)
        for i in range(m):
            _expert_out(c, L, down, e, rows[i], g0, g1)


@njit(cache=True, inline="always")
def _moe(c, L, keep, clk):
    """The selected experts' weighted outputs ``sum_j w_j * o_j`` added in the order of the
    selection (products rounded, then added, as ``build_moe_ffn``), then to the residual
    ``X``, or (``keep``) kept in each token's first expert row ``EO[t * n_expert_used]``."""
    M = c.M
    n, k, tid, n_embd = c.st.n_rows, M.n_expert_used, c.tid, M.n_embd
    g0, g1 = split((M.n_ff_exp + 15) // 16, tid, c.nth)
    if n > 1:
        _expert_rows(c)
    _experts(c, L, False, g0, g1)
    clk = _sync(c, tick(c.prof, tid, P_FFN_UP, clk))
    r0, r1 = split(n * k, tid, c.nth)  # the expert rows quantized for down
    prepare_acts(c.G, r0, r1, M.n_ff_exp, L.need_down, c.A)
    clk = _sync(c, tick(c.prof, tid, P_FFN_DOWN, clk))
    d0, d1 = split((n_embd + 15) // 16, tid, c.nth)
    _experts(c, L, True, d0, d1)
    for t in range(n):  # this thread's columns of every expert output: no barrier
        for i in range(16 * d0, min(16 * d1, n_embd)):
            acc = c.WTS[t, 0] * c.EO[t * k, i]
            for j in range(1, k):
                acc = acc + c.WTS[t, j] * c.EO[t * k + j, i]
            if keep:
                c.EO[t * k, i] = acc
            elif M.residual_scale != 1.0:
                c.X[t, i] = acc * M.residual_scale + c.X[t, i]
            else:
                c.X[t, i] = acc + c.X[t, i]
    return _sync(c, tick(c.prof, tid, P_FFN_DOWN, clk))


@njit(cache=True)
def ffn_moe(c, L, clk):
    """``x += sum_j w_j * (silu(h . gate_e_j) * (h . up_e_j)) . down_e_j`` over each
    token's selected experts ``e_j`` (:func:`ffn_router`): the weighted outputs added in
    the order of the selection, then to the residual, as llama.cpp's ``build_moe_ffn``."""
    return _moe(c, L, False, clk)


@njit(cache=True)
def ffn_moe_keep(c, L, clk):
    """:func:`ffn_moe`'s sum kept apart (in ``EO``) for a shared expert to join it before
    the residual (qwen35moe)."""
    return _moe(c, L, True, clk)


@njit(cache=True, inline="always")
def _router_row(src, t, dst, r, n, inv, w, eps):
    """``dst[r] = rms_norm(src[t]) * inv * w`` (no norm weight; ggml's rms_norm, scale,
    mul in that order)."""
    s = 0.0
    for i in range(n):
        v = src[t, i]
        s += np.float64(v * v)
    mean = np.float32(s / n)
    scale = np.float32(1.0) / np.sqrt(mean + eps)
    for i in range(n):
        dst[r, i] = src[t, i] * scale * inv * w[i]


@njit(cache=True)
def ffn_router_in(c, L, clk):
    """gemma4's router input ``h = rms_norm(x) / sqrt(n_embd) * ffn_gate_inp.scale`` (no
    norm weight), quantized for the router (one row: every thread its private row)."""
    M = c.M
    n_embd, tid, off = M.n_embd, c.tid, L.ffn_gate_inp_scale
    w = c.NF[off : off + n_embd]
    inv = np.float32(1.0) / np.sqrt(np.float32(n_embd))
    if c.st.n_rows == 1:
        _router_row(c.X, 0, c.XP, tid, n_embd, inv, w, M.eps)
        prepare_acts(c.XP, tid, tid + 1, n_embd, L.need_ffn, c.AP)
        return tick(c.prof, tid, P_NORM, clk)
    t0, t1 = _token_rows(c)
    for t in range(t0, t1):
        _router_row(c.X, t, c.XN, t, n_embd, inv, w, M.eps)
    prepare_acts(c.XN, t0, t1, n_embd, L.need_ffn, c.A)
    return _sync(c, tick(c.prof, tid, P_NORM, clk))


@njit(cache=True)
def ffn_pre_norm_2(c, L, clk):
    """``h = rms_norm(x) * pre_ffw_norm_2``, quantized for the experts (gemma4)."""
    return _norm_in(c, c.X, L.pre_ffw_norm_2, L.need_ffn, clk)


@njit(cache=True)
def ffn_down_post_norms(c, L, clk):
    """gemma4's layer of experts: ``x += rms_norm(rms_norm(g . ffn_down) * post_ffw_norm_1
    + rms_norm(moe) * post_ffw_norm_2) * post_ffw_norm``, ``moe`` the routed experts' sum
    :func:`ffn_moe_keep` kept (``EO[t * n_expert_used]``)."""
    M = c.M
    _mm(c, L.ffn_down, c.XN, False)
    clk = _sync(c, tick(c.prof, c.tid, P_FFN_DOWN, clk))
    n_embd, k, eps, NF = M.n_embd, M.n_expert_used, M.eps, c.NF
    p1, p2, p = L.post_ffw_norm_1, L.post_ffw_norm_2, L.post_ffw_norm
    t0, t1 = _token_rows(c)
    rms_norm(c.XN, t0, t1, n_embd, NF[p1 : p1 + n_embd], eps, c.XN)
    for t in range(t0, t1):
        rms_norm(c.EO, t * k, t * k + 1, n_embd, NF[p2 : p2 + n_embd], eps, c.EO)
        for i in range(n_embd):
            c.XN[t, i] = c.XN[t, i] + c.EO[t * k, i]
    rms_norm(c.XN, t0, t1, n_embd, NF[p : p + n_embd], eps, c.XN)
    for t in range(t0, t1):
        for i in range(n_embd):
            c.X[t, i] += c.XN[t, i]
    return _sync(c, tick(c.prof, c.tid, P_NORM, clk))


@njit(cache=True)
def ffn_shexp_gate(c, L, clk):
    """A shared expert's gate ``sigmoid(h . ffn_gate_inp_shexp)`` per token (into ``RL[t,
    0]``, the router being done) from the float rows :func:`ffn_norm` left (``XN``; one row:
    the private ``XP``), and ``h`` quantized again for the shared expert (the experts'
    down projection used the activation buffer; one row: still in the private one)."""
    n_embd, gi = c.M.n_embd, L.ffn_gate_inp_shexp
    w = c.NF[max(gi, 0) :]
    one = np.float32(1.0)  # (a shared expert without a gate: deepseek2)
    if c.st.n_rows == 1:
        if c.tid == 0:  # read after the barriers of the next stages
            c.RL[0, 0] = shared_gate(c.XP[0], w, n_embd) if gi >= 0 else one
        return clk
    t0, t1 = _token_rows(c)
    for t in range(t0, t1):
        c.RL[t, 0] = shared_gate(c.XN[t], w, n_embd) if gi >= 0 else one
    prepare_acts(c.XN, t0, t1, n_embd, L.need_ffn, c.A)
    return _sync(c, tick(c.prof, c.tid, P_NORM, clk))


@njit(cache=True)
def ffn_shexp_down(c, L, clk):
    """``x += (moe + (g . ffn_down) * gate)``: the shared expert's output (its SwiGLU ``g``
    from :func:`ffn_swiglu` over the shared matrices) times its gate, added to the kept sum
    of the routed experts, then to the residual, as llama.cpp's qwen35moe."""
    M = c.M
    n, k, n_embd = c.st.n_rows, M.n_expert_used, M.n_embd
    ta, tb, AA = _acts(c)
    g0, g1 = split((n_embd + 15) // 16, c.tid, c.nth)
    matmul_sel(c.fmask, c.W, c.WD[L.ffn_down], AA, ta, tb, g0, g1, c.XN, 0, False)
    for t in range(n):  # this thread's columns: no barrier
        s = c.RL[t, 0]
        for i in range(16 * g0, min(16 * g1, n_embd)):
            c.X[t, i] = (c.EO[t * k, i] + c.XN[t, i] * s) + c.X[t, i]
    return _sync(c, tick(c.prof, c.tid, P_FFN_DOWN, clk))


# ----------------------------------------------------------------------------- latent attention
# Multi-head latent attention (deepseek2) in the absorbed form llama.cpp runs converted files
# with: a layer's cache row is one vector per token (the normed latent, then the roped shared
# key: ``head_dim`` = n_lora_kv + n_rot, one KV head); each query head is absorbed into the
# latent (its nope part through ``attn_k_b``), attends over the rows as MQA, each row serving
# as key and, its latent part, as value; the output goes back to the head's value through
# ``attn_v_b``. Buffers: the queries before absorption in ATT (head h: nope | rope), kv_a in
# KN; per-head rows head-major (row h * n + t) in flat views of XN (inputs), ATT and Q
# (outputs), their activations in the shared buffers A seen as rows of the inputs' width.
@njit(cache=True, inline="always")
def _flat(a, w):
    """``a`` (C-contiguous) seen as rows of ``w`` elements."""
    n = a.size // w
    return a.reshape(-1)[: n * w].reshape(n, w)


@njit(cache=True, inline="always")
def _acts_rows(A, w):
    """The activation buffers ``A`` seen as rows of ``w`` columns (``ops.matmul.new_acts``'s
    widths)."""
    return (
        _flat(A[0], w), _flat(A[1], max(1, w // 32)), _flat(A[2], max(1, w // 32)),
        _flat(A[3], max(1, w // 4)), _flat(A[4], w), _flat(A[5], max(1, w // 256)),
        _flat(A[6], max(1, w // 16)), _flat(A[7], w),
    )  # fmt: skip


@njit(cache=True, inline="always")
def _norm_rows_in(c, src, k, off, need, clk):
    """``rms_norm(src[:, :k]) * NF[off:]`` in place, quantized for the next matmul (one row:
    every thread normalizes its private copy, no barrier)."""
    tid = c.tid
    w = c.NF[off : off + k]
    if c.st.n_rows == 1:
        c.XP[tid, :k] = src[0, :k]
        rms_norm(c.XP, tid, tid + 1, k, w, c.M.eps, c.XP)
        prepare_acts(c.XP, tid, tid + 1, k, need, c.AP)
        return tick(c.prof, tid, P_NORM, clk)
    t0, t1 = split(c.st.n_rows, tid, c.nth)
    rms_norm(src, t0, t1, k, w, c.M.eps, src)
    prepare_acts(src, t0, t1, k, need, c.A)
    return _sync(c, tick(c.prof, tid, P_NORM, clk))


@njit(cache=True)
def mla_q(c, L, clk):
    """``kv_a = h . attn_kv_a_mqa`` (latent | rope key, into KN) and the queries into ATT:
    ``rms_norm(h . attn_q_a) * attn_q_a_norm . attn_q_b``, or ``h . attn_q`` (lite files)."""
    _mm(c, L.attn_kv_a_mqa, c.KN, False)
    if L.attn_q >= 0:
        _mm(c, L.attn_q, c.ATT, False)
        return _sync(c, tick(c.prof, c.tid, P_QKV, clk))
    _mm(c, L.attn_q_a, c.XN, False)
    clk = _sync(c, tick(c.prof, c.tid, P_QKV, clk))
    clk = _norm_rows_in(c, c.XN, c.M.n_lora_q, L.attn_q_a_norm, L.need_q_b, clk)
    _mm(c, L.attn_q_b, c.ATT, False)
    return _sync(c, tick(c.prof, c.tid, P_QKV, clk))


@njit(cache=True)
def mla_kv(c, L, clk):
    """Per token: each query head's rope part and the shared rope key rotated, the latent
    ``rms_norm(kv_a[:n_lora_kv]) * attn_kv_a_norm``, the cache row (latent | rope key)
    stored; each head's roped part moved to its absorbed query in ``Q`` (after the latent
    part), its nope part to row ``h * n + t`` of ``XN``, quantized for ``attn_k_b``."""
    M = c.M
    H, r, hk, hd, nr = M.n_head, M.n_lora_kv, M.head_k_mla, M.head_dim, M.n_rot
    nope, n, kv = hk - nr, c.st.n_rows, c.kv
    base = _layer_base(c, L, kv)
    rp, rc = c.RP[0], c.TS[0][c.tid]
    neox = rp[7] != 0
    XR, AR = _flat(c.XN, nope), _acts_rows(c.A, nope)
    w = c.NF[L.attn_kv_a_norm : L.attn_kv_a_norm + r]
    t0, t1 = _token_rows(c)
    for t in range(t0, t1):
        rope_cache(c.pos[t], rp, c.FF, rc)
        rope_apply(c.ATT, t, nope, H, hk, rc, nr, neox)
        rope_apply(c.KN, t, r, 1, hd, rc, nr, neox)
        rms_norm(c.KN, t, t + 1, r, w, M.eps, c.KN)
        store_row(c.KN[t], 0, hd, c.k_type, kv.KC, base + kv.cells[t] * kv.rowb)
        for h in range(H):
            for i in range(nr):
                c.Q[t, h * hd + r + i] = c.ATT[t, h * hk + nope + i]
            for i in range(nope):
                XR[h * n + t, i] = c.ATT[t, h * hk + i]
            prepare_acts(XR, h * n + t, h * n + t + 1, nope, L.need_k_b, AR)
    return _sync(c, tick(c.prof, c.tid, P_ROPE, clk))


@njit(cache=True)
def mla_absorb(c, L, clk):
    """Each head's absorbed query ``q_nope_h . attn_k_b_h`` (the latent part of its row in
    ``Q``): per head, its tokens' rows through the head's matrix (this thread's row groups)
    into rows ``h * n + t`` of ``ATT``, then moved to ``Q``."""
    M = c.M
    H, r, hd, n = M.n_head, M.n_lora_kv, M.head_dim, c.st.n_rows
    AR, OR = _acts_rows(c.A, M.head_k_mla - M.n_rot), _flat(c.ATT, r)
    g0, g1 = split((r + 15) // 16, c.tid, c.nth)
    for h in range(H):
        wd = c.WD[L.attn_k_b + h]
        matmul_sel(c.fmask, c.W, wd, AR, h * n, h * n + n, g0, g1, OR, h * n, False)
    clk = _sync(c, tick(c.prof, c.tid, P_QKV, clk))
    t0, t1 = _token_rows(c)
    for t in range(t0, t1):
        for h in range(H):
            for i in range(r):
                c.Q[t, h * hd + i] = OR[h * n + t, i]
    return _sync(c, clk)


@njit(cache=True)
def mla_attention(c, L, clk):
    """MQA of the absorbed queries over the layer's cache rows, each row the key and its
    first ``n_lora_kv`` values the value (the output's last ``n_rot`` are not used): the V
    cache is the K cache (the engine stores no V for this layout)."""
    kv = c.kv
    one = KVPart(kv.KC, kv.KC, kv.cells, kv.mask, kv.n_kv, kv.mode, kv.hstride, kv.order, kv.rowb)
    _attention(c, one, _layer_base(c, L, kv), c.M.n_head, c.NF[:0])
    return _sync(c, tick(c.prof, c.tid, P_ATTN, clk))


@njit(cache=True)
def mla_out(c, L, clk):
    """Each head's value ``att_h[:n_lora_kv] . attn_v_b_h`` (rows ``h * n + t``: inputs in
    XN, outputs in Q), gathered per token into ATT; then ``x += att . attn_output``."""
    M = c.M
    H, r, hd, hv, n = M.n_head, M.n_lora_kv, M.head_dim, M.head_v_mla, c.st.n_rows
    XR, AR = _flat(c.XN, r), _acts_rows(c.A, r)
    t0, t1 = _token_rows(c)
    for t in range(t0, t1):
        for h in range(H):
            for i in range(r):
                XR[h * n + t, i] = c.ATT[t, h * hd + i]
            prepare_acts(XR, h * n + t, h * n + t + 1, r, L.need_v_b, AR)
    clk = _sync(c, tick(c.prof, c.tid, P_OUT_PROJ, clk))
    OR = _flat(c.Q, hv)
    g0, g1 = split((hv + 15) // 16, c.tid, c.nth)
    for h in range(H):
        wd = c.WD[L.attn_v_b + h]
        matmul_sel(c.fmask, c.W, wd, AR, h * n, h * n + n, g0, g1, OR, h * n, False)
    clk = _sync(c, tick(c.prof, c.tid, P_OUT_PROJ, clk))
    for t in range(t0, t1):
        for h in range(H):
            for i in range(hv):
                c.ATT[t, h * hv + i] = OR[h * n + t, i]
    clk = _quantize_in(c, c.ATT, H * hv, L.need_out, P_OUT_PROJ, _sync(c, clk))
    return _proj_residual(c, L.attn_output, NONE, P_OUT_PROJ, clk)


@njit(cache=True)
def ffn_shexp_in(c, L, clk):
    """``h`` (the float rows :func:`ffn_norm` left in ``XN``) quantized again for a shared
    expert after the routed ones (their down projection used the activation buffer; one
    row: still in the private one)."""
    if c.st.n_rows == 1:
        return clk
    t0, t1 = _token_rows(c)
    prepare_acts(c.XN, t0, t1, c.M.n_embd, L.need_ffn, c.A)
    return _sync(c, tick(c.prof, c.tid, P_NORM, clk))


@njit(cache=True)
def ffn_shexp_add(c, L, clk):
    """``x = (moe + g . ffn_down) * residual_scale + x``: the shared expert's output (its
    SwiGLU ``g`` from :func:`ffn_swiglu`) added ungated to the kept sum of the routed
    experts, as llama.cpp's granite MoE with a shared expert."""
    M = c.M
    n, k, n_embd, rs = c.st.n_rows, M.n_expert_used, M.n_embd, M.residual_scale
    ta, tb, AA = _acts(c)
    g0, g1 = split((n_embd + 15) // 16, c.tid, c.nth)
    matmul_sel(c.fmask, c.W, c.WD[L.ffn_down], AA, ta, tb, g0, g1, c.XN, 0, False)
    for t in range(n):  # this thread's columns: no barrier
        for i in range(16 * g0, min(16 * g1, n_embd)):
            y = c.EO[t * k, i] + c.XN[t, i]
            c.X[t, i] = (y * rs if rs != 1.0 else y) + c.X[t, i]
    return _sync(c, tick(c.prof, c.tid, P_FFN_DOWN, clk))


# ----------------------------------------------------------------------------- gated attention
@njit(cache=True)
def q_gate(c, L, clk):
    """Gated attention (qwen35): ``attn_q`` gives each head's query followed by its output
    gate; the queries are packed to the front of ``Q``, the gates go to ``G``."""
    M = c.M
    hd = M.head_dim
    t0, t1 = _token_rows(c)
    for t in range(t0, t1):
        for h in range(M.n_head):  # head h's gate is copied before a query overwrites it
            src = 2 * h * hd
            for i in range(hd):
                c.G[t, h * hd + i] = c.Q[t, src + hd + i]
            for i in range(hd):
                c.Q[t, h * hd + i] = c.Q[t, src + i]
    return clk


@njit(cache=True)
def attn_gate(c, L, clk):
    """``att *= sigmoid(gate)`` (the gates :func:`q_gate` kept in ``G``)."""
    qd = c.M.n_head * c.M.head_dim
    t0, t1 = _token_rows(c)
    for t in range(t0, t1):
        for i in range(qd):
            c.ATT[t, i] = c.ATT[t, i] * sigmoid(c.G[t, i])
    return _sync(c, clk)


# ----------------------------------------------------------------------------- Gated DeltaNet
# A recurrent layer's buffers: the convolution's channels (keys of the queries, keys,
# values) in Q; the output gate z in U; beta in RL; alpha, then the decay g, in XN; the
# heads' outputs in ATT. Its states are the second part of the memory (``kv_swa``): the
# convolution rows in KC, the delta-rule rows in VC, each token's state row in ``cells``.
@njit(cache=True, inline="always")
def _conv_channels(M):
    return M.ssm_d_inner + 2 * M.ssm_n_group * M.ssm_d_state


@njit(cache=True, inline="always")
def _state_rows(c, L, part, size):
    """The layer's state rows, one of ``size`` floats per sequence (a float32 view)."""
    n_seq = c.kvi[7]
    base = L.kv_index * n_seq * size
    return part.view(np.float32)[base : base + n_seq * size]


@njit(cache=True)
def delta_net_in(c, L, clk):
    """In-projections of ``h``: the channels ``h . attn_qkv``, the gate ``z = h .
    attn_gate``, ``h . ssm_beta``, ``h . ssm_alpha``."""
    _mm(c, L.attn_qkv, c.Q, False)
    _mm(c, L.attn_gate, c.U, False)
    _mm(c, L.ssm_beta, c.RL, False)
    _mm(c, L.ssm_alpha, c.XN, False)
    return _sync(c, tick(c.prof, c.tid, P_QKV, clk))


@njit(cache=True)
def delta_net_in_grouped(c, L, clk):
    """qwen3next's in-projections: the channels and ``z`` from ``attn_qkv`` / ``attn_gate``,
    or from the fused ``ssm_in`` (a file of the older layout: per key head q | k | v | z,
    then put in the order of ``attn_qkv``); the fused ``h . ssm_ba`` (per key head
    its value heads' betas, then their alphas) in RL, split by
    :func:`delta_net_conv_grouped`."""
    if L.ssm_in < 0:
        _mm(c, L.attn_qkv, c.Q, False)
        _mm(c, L.attn_gate, c.U, False)
        _mm(c, L.ssm_beta, c.RL, False)
        return _sync(c, tick(c.prof, c.tid, P_QKV, clk))
    _mm(c, L.ssm_in, c.XN, False)
    _mm(c, L.ssm_beta, c.RL, False)
    clk = _sync(c, tick(c.prof, c.tid, P_QKV, clk))
    M = c.M
    sk, hk = M.ssm_d_state, M.ssm_n_group
    kd, vg = hk * sk, M.ssm_d_inner // hk  # a key head's values (and gates)
    width = 2 * sk + 2 * vg
    t0, t1 = _token_rows(c)
    for t in range(t0, t1):
        for g in range(hk):
            s = g * width
            for i in range(sk):
                c.Q[t, g * sk + i] = c.XN[t, s + i]
                c.Q[t, kd + g * sk + i] = c.XN[t, s + sk + i]
            for i in range(vg):
                c.Q[t, 2 * kd + g * vg + i] = c.XN[t, s + 2 * sk + i]
                c.U[t, g * vg + i] = c.XN[t, s + 2 * sk + vg + i]
    return _sync(c, tick(c.prof, c.tid, P_QKV, clk))


@njit(cache=True, inline="always")
def _delta_net_conv(c, L, grouped, clk):
    """The short causal convolution of each channel over its state row, then SiLU (threads
    split the channels); ``beta = sigmoid(beta)`` and the decay ``g = softplus(alpha +
    ssm_dt) * ssm_a`` per value head (threads split the tokens). ``grouped``: beta and
    alpha come fused in RL, per key head its ``r`` value heads' betas then their alphas."""
    M = c.M
    ch, taps, n = _conv_channels(M), M.ssm_d_conv, c.st.n_rows
    state = _state_rows(c, L, c.kv_swa.KC, c.kvi[8]).reshape(c.kvi[7], ch, taps - 1)
    w = c.NF[L.ssm_conv1d : L.ssm_conv1d + ch * taps].reshape(ch, taps)
    g0, g1 = split(ch // 16, c.tid, c.nth)
    conv_bias_tokens(c.Q, 0, n, c.kv_swa.cells, state, w, c.NF[:0], c.Q, 16 * g0, 16 * g1)
    silu(c.Q, 0, n, 16 * g0, 16 * g1, c.Q)
    one = np.float32(1.0)
    hv = M.ssm_dt_rank
    r = hv // M.ssm_n_group
    t0, t1 = _token_rows(c)
    for t in range(t0, t1):
        if grouped:
            for h in range(hv):
                c.XN[t, h] = c.RL[t, (h // r) * 2 * r + r + h % r]
            for h in range(hv):  # in place: the beta of head h is at or after h
                c.RL[t, h] = c.RL[t, (h // r) * 2 * r + h % r]
        for h in range(hv):
            c.RL[t, h] = sigmoid(c.RL[t, h])
            a = c.XN[t, h] + c.NF[L.ssm_dt_bias + h]
            sp = a if a > np.float32(20.0) else np.log(one + np.exp(a))
            c.XN[t, h] = sp * c.NF[L.ssm_a + h]
    return _sync(c, tick(c.prof, c.tid, P_ROPE, clk))


@njit(cache=True)
def delta_net_conv(c, L, clk):
    """:func:`_delta_net_conv` of qwen35 (beta and alpha apart)."""
    return _delta_net_conv(c, L, False, clk)


@njit(cache=True)
def delta_net_conv_grouped(c, L, clk):
    """:func:`_delta_net_conv` of qwen3next (beta and alpha fused per key head)."""
    return _delta_net_conv(c, L, True, clk)


@njit(cache=True, inline="always")
def _delta_net_rule(c, L, grouped, clk):
    """Per token and value head (threads split the heads): q and k of its key head
    L2-normed, the gated delta rule on the head's state row, then the gated norm
    ``rms_norm(o) * ssm_norm * silu(z)`` of the head's output. Value head ``h`` reads key
    head ``h % H_k`` (tiled, qwen35) or, ``grouped``, ``h // (H_v / H_k)`` (qwen3next)."""
    M = c.M
    hk, sk, hv = M.ssm_n_group, M.ssm_d_state, M.ssm_dt_rank
    sv, kd = M.ssm_d_inner // hv, M.ssm_n_group * M.ssm_d_state
    r = hv // hk
    S = _state_rows(c, L, c.kv_swa.VC, c.kvi[9]).reshape(c.kvi[7], hv, sv, sk)
    qn, kn = c.TS[1][c.tid], c.TS[3][c.tid]
    w = c.NF[L.ssm_norm : L.ssm_norm + sv]
    h0, h1 = split(hv, c.tid, c.nth)
    for t in range(c.st.n_rows):
        rw = c.kv_swa.cells[t]
        for h in range(h0, h1):
            kh = h // r if grouped else h % hk
            l2_norm(c.Q[t], kh * sk, sk, M.eps, qn)
            l2_norm(c.Q[t], kd + kh * sk, sk, M.eps, kn)
            o = h * sv
            delta_rule_head(
                S[rw, h], qn, kn, c.Q[t], 2 * kd + o, c.XN[t, h], c.RL[t, h], c.ATT[t], o
            )
            head_rms_norm(c.ATT, t, h, h + 1, sv, w, M.eps)
            mul_silu(c.U, t, t + 1, o, o + sv, c.ATT)
    return _sync(c, tick(c.prof, c.tid, P_ATTN, clk))


@njit(cache=True)
def delta_net_rule(c, L, clk):
    """:func:`_delta_net_rule` with the key heads tiled over the value heads (qwen35)."""
    return _delta_net_rule(c, L, False, clk)


@njit(cache=True)
def delta_net_rule_grouped(c, L, clk):
    """:func:`_delta_net_rule` with each key head's value heads together (qwen3next)."""
    return _delta_net_rule(c, L, True, clk)


@njit(cache=True)
def delta_net_out(c, L, clk):
    """``x += o . ssm_out``."""
    clk = _quantize_in(c, c.ATT, c.M.ssm_d_inner, L.need_out, P_OUT_PROJ, clk)
    return _proj_residual(c, L.ssm_out, NONE, P_OUT_PROJ, clk)


# ----------------------------------------------------------------------------- short convolution
# LFM2's convolution layers: b | c | x in Q, b * x then its convolution in XN, y in ATT; the
# state rows are the second memory part's KC (``kv_swa``), each token's row in ``cells``.
@njit(cache=True)
def shortconv_in(c, L, clk):
    """``b | c | x = h . shortconv.in_proj``."""
    _mm(c, L.attn_qkv, c.Q, False)
    return _sync(c, tick(c.prof, c.tid, P_QKV, clk))


@njit(cache=True)
def shortconv_conv(c, L, clk):
    """``y = c * conv(b * x)``: the causal convolution of each channel over its state row
    (threads split the channels)."""
    M = c.M
    e, taps, n = M.n_embd, M.ssm_d_conv, c.st.n_rows
    state = _state_rows(c, L, c.kv_swa.KC, c.kvi[8]).reshape(c.kvi[7], e, taps - 1)
    w = c.NF[L.ssm_conv1d : L.ssm_conv1d + e * taps].reshape(e, taps)
    g0, g1 = split(e // 16, c.tid, c.nth)
    c0, c1 = 16 * g0, 16 * g1
    for t in range(n):
        for i in range(c0, c1):
            c.XN[t, i] = c.Q[t, i] * c.Q[t, 2 * e + i]
    conv_bias_tokens(c.XN, 0, n, c.kv_swa.cells, state, w, c.NF[:0], c.XN, c0, c1)
    for t in range(n):
        for i in range(c0, c1):
            c.ATT[t, i] = c.Q[t, e + i] * c.XN[t, i]
    return _sync(c, tick(c.prof, c.tid, P_ROPE, clk))


@njit(cache=True)
def shortconv_out(c, L, clk):
    """``x += y . shortconv.out_proj``."""
    clk = _quantize_in(c, c.ATT, c.M.n_embd, L.need_out, P_OUT_PROJ, clk)
    return _proj_residual(c, L.ssm_out, NONE, P_OUT_PROJ, clk)


# ----------------------------------------------------------------------------- Mamba-2
# z | xBC | dt in Q; the convolved xBC (x | B | C) in XN; y in ATT. The states are the second
# memory part (``kv_swa``): the convolution rows in KC, the scan rows in VC, each token's
# state row in ``cells``.
@njit(cache=True)
def mamba2_in(c, L, clk):
    """``z | xBC | dt = h . ssm_in``."""
    _mm(c, L.ssm_in, c.Q, False)
    return _sync(c, tick(c.prof, c.tid, P_QKV, clk))


@njit(cache=True)
def mamba2_conv(c, L, clk):
    """``xBC = silu(conv(xBC) + ssm_conv1d.bias)``: the causal convolution of each channel
    over its state row (threads split the channels; granitehybrid's bias is optional)."""
    M = c.M
    ch, taps, n = _conv_channels(M), M.ssm_d_conv, c.st.n_rows
    state = _state_rows(c, L, c.kv_swa.KC, c.kvi[8]).reshape(c.kvi[7], ch, taps - 1)
    w = c.NF[L.ssm_conv1d : L.ssm_conv1d + ch * taps].reshape(ch, taps)
    b = c.NF[L.ssm_conv1d_bias : L.ssm_conv1d_bias + ch] if L.ssm_conv1d_bias >= 0 else c.NF[:0]
    g0, g1 = split(ch // 16, c.tid, c.nth)
    cells = c.kv_swa.cells
    conv_bias_tokens(c.Q, M.ssm_d_inner, n, cells, state, w, b, c.XN, 16 * g0, 16 * g1)
    silu(c.XN, 0, n, 16 * g0, 16 * g1, c.XN)
    return _sync(c, tick(c.prof, c.tid, P_ROPE, clk))


@njit(cache=True)
def mamba2_scan(c, L, clk):
    """Per token and head (threads split the heads): the selective scan on the head's state
    row with ``dt + ssm_dt.bias``, ``ssm_a``, ``ssm_d``, then ``y *= silu(z)``."""
    M = c.M
    ds, nh, ng, inner = M.ssm_d_state, M.ssm_dt_rank, M.ssm_n_group, M.ssm_d_inner
    hd = inner // nh
    S = _state_rows(c, L, c.kv_swa.VC, c.kvi[9]).reshape(c.kvi[7], inner * ds)
    dt0 = 2 * inner + 2 * ng * ds  # dt's column in Q
    h0, h1 = split(nh, c.tid, c.nth)
    for t in range(c.st.n_rows):
        r, xr = c.kv_swa.cells[t], c.XN[t]
        for h in range(h0, h1):
            g = h // (nh // ng)
            dt = c.Q[t, dt0 + h] + c.NF[L.ssm_dt_bias + h]
            a, d, o = c.NF[L.ssm_a + h], c.NF[L.ssm_d + h], h * hd
            boff = inner + g * ds
            scan_head(
                S[r, o * ds :], xr, o, hd, xr, boff, boff + ng * ds, ds, dt, a, d, c.ATT[t], o
            )
            mul_silu(c.Q, t, t + 1, o, o + hd, c.ATT)
    return _sync(c, tick(c.prof, c.tid, P_ATTN, clk))


@njit(cache=True)
def mamba2_out(c, L, clk):
    """``x += group_rms_norm(y) * ssm_norm . ssm_out`` (each of the ``ssm_n_group`` slices of
    ``y`` normalized apart)."""
    M = c.M
    inner, tid = M.ssm_d_inner, c.tid
    gs = inner // M.ssm_n_group
    w = c.NF[L.ssm_norm : L.ssm_norm + inner]
    if c.st.n_rows == 1:
        c.XP[tid, :inner] = c.ATT[0, :inner]
        for g in range(M.ssm_n_group):
            head_rms_norm(c.XP, tid, g, g + 1, gs, w[g * gs :], M.eps)
        prepare_acts(c.XP, tid, tid + 1, inner, L.need_out, c.AP)
    else:
        t0, t1 = _token_rows(c)
        for t in range(t0, t1):
            for g in range(M.ssm_n_group):
                head_rms_norm(c.ATT, t, g, g + 1, gs, w[g * gs :], M.eps)
        prepare_acts(c.ATT, t0, t1, inner, L.need_out, c.A)
        clk = _sync(c, tick(c.prof, tid, P_NORM, clk))
    return _proj_residual(c, L.ssm_out, NONE, P_OUT_PROJ, clk)


# ----------------------------------------------------------------------------- imatrix
# The im_* stages add the squares of a matmul input to the importance-matrix sums (row
# ``IM_SLOTS * layer + slot`` of ``IM``; the model's output is the row after the layers'),
# as llama-imatrix does for every matmul of 16 rows or more: token by token, in float32.
IM_QKV, IM_OUT, IM_FFN, IM_DOWN = range(4)
IM_SLOTS = 4
IM_MIN_ROWS = 16


@njit(cache=True, inline="always")
def _collect(c, src, k, row, clk):
    """``IM[row, j] += src[t, j]^2`` for the ubatch rows ``t`` in order (threads split the
    columns ``j < k``)."""
    n = c.st.n_rows
    if n < IM_MIN_ROWS:
        return clk
    j0, j1 = split(k, c.tid, c.nth)
    acc = c.IM[row]
    for t in range(n):
        for j in range(j0, j1):
            x = src[t, j]
            acc[j] += x * x
    return _sync(c, clk)


@njit(cache=True)
def im_qkv_in(c, L, clk):
    """imatrix: the input of attn_q/k/v (the normed rows, after attn_norm)."""
    return _collect(c, c.XN, c.M.n_embd, IM_SLOTS * L.index + IM_QKV, clk)


@njit(cache=True)
def im_qkv_x(c, L, clk):
    """imatrix: the input of attn_q/k/v in a block without a pre-attention norm (x)."""
    return _collect(c, c.X, c.M.n_embd, IM_SLOTS * L.index + IM_QKV, clk)


@njit(cache=True)
def im_out_in(c, L, clk):
    """imatrix: the input of attn_output (the attention's output rows)."""
    k = c.M.n_head * c.M.head_dim
    return _collect(c, c.ATT, k, IM_SLOTS * L.index + IM_OUT, clk)


@njit(cache=True)
def im_ffn_in(c, L, clk):
    """imatrix: the input of ffn_gate/ffn_up (the normed rows, after ffn_norm)."""
    return _collect(c, c.XN, c.M.n_embd, IM_SLOTS * L.index + IM_FFN, clk)


@njit(cache=True)
def im_ffn_x(c, L, clk):
    """imatrix: the input of ffn_gate/ffn_up in a block without a pre-FFN norm (x)."""
    return _collect(c, c.X, c.M.n_embd, IM_SLOTS * L.index + IM_FFN, clk)


@njit(cache=True)
def im_moe(c, L, clk):
    """imatrix, after a mixture of experts (any number of rows, as llama-imatrix collects
    every ``mul_mat_id``): for each selection slot ``j``, then each token ``t``, the input
    row of ``t`` (still in ``XN``) added to expert ``SEL[t, j]``'s sums of gate/up, and
    the expert's activation row ``G[t * k + j]`` to its sums of down; the last column of
    each expert row counts its rows. Expert rows follow the dense ones: layer ``i``'s
    gate/up rows at ``IM_SLOTS * n_layer + 1 + 2 * n_expert * i + e``, its down rows
    ``n_expert`` further."""
    M = c.M
    n, k, ne = c.st.n_rows, M.n_expert_used, M.n_expert
    base = IM_SLOTS * M.n_layer + 1 + 2 * ne * L.index
    cnt = c.IM.shape[1] - 1
    for part in range(2):
        w = M.n_embd if part == 0 else M.n_ff_exp
        j0, j1 = split(w, c.tid, c.nth)
        for j in range(k):
            for t in range(n):
                acc = c.IM[base + part * ne + c.SEL[t, j]]
                if part == 0:  # (a single row was normed into this thread's private row)
                    src, row = (c.XP, c.tid) if n == 1 else (c.XN, t)
                    for i in range(j0, j1):
                        acc[i] += src[row, i] * src[row, i]
                else:
                    r = t * k + j
                    for i in range(j0, j1):
                        acc[i] += c.G[r, i] * c.G[r, i]
                if c.tid == 0:
                    acc[cnt] += np.float32(1.0)
    return _sync(c, clk)


@njit(cache=True)
def im_down_in(c, L, clk):
    """imatrix: the input of ffn_down (the gated activation)."""
    n_ff = L.n_ff if L.n_ff > 0 else c.M.n_ff
    return _collect(c, c.G, n_ff, IM_SLOTS * L.index + IM_DOWN, clk)


@njit(cache=True)
def head(c, clk):
    """Logits of the output rows: ``rms_norm(x) * output_norm . output`` (soft-capped;
    times ``logit_scale``)."""
    M = c.M
    n_out, n_embd, tid = c.n_out, M.n_embd, c.tid
    if n_out == 0:
        return clk
    gathered = c.st.n_rows != c.n_tok  # out_rows moved the output rows to the front
    onorm = c.NF[M.output_norm : M.output_norm + n_embd]
    if n_out == 1:
        c.XP[tid, :n_embd] = c.X[0 if gathered else c.out_idx[0], :n_embd]
        rms_norm(c.XP, tid, tid + 1, n_embd, onorm, M.eps, c.XP)
        prepare_acts(c.XP, tid, tid + 1, n_embd, M.need_output, c.AP)
        ha, hb, AH = tid, tid + 1, c.AP
    else:
        o0, o1 = split(n_out, tid, c.nth)
        for i in range(o0, o1):
            c.XN[i, :n_embd] = c.X[i if gathered else c.out_idx[i], :n_embd]
        rms_norm(c.XN, o0, o1, n_embd, onorm, M.eps, c.XN)
        prepare_acts(c.XN, o0, o1, n_embd, M.need_output, c.A)
        clk = _sync(c, tick(c.prof, tid, P_HEAD, clk))
        if c.IM.shape[0] > IM_SLOTS * M.n_layer and n_out >= IM_MIN_ROWS:  # imatrix
            j0, j1 = split(n_embd, tid, c.nth)
            acc = c.IM[IM_SLOTS * M.n_layer]
            for t in range(n_out):
                for j in range(j0, j1):
                    acc[j] += c.XN[t, j] * c.XN[t, j]
        ha, hb, AH = 0, n_out, c.A
    g0, g1 = split((c.WD[M.output, 2] + 15) // 16, tid, c.nth)
    matmul_sel(c.fmask, c.W, c.WD[M.output], AH, ha, hb, g0, g1, c.LOG, 0, False)
    if M.softcap != 0.0:  # each thread caps the row groups it wrote
        for i in range(n_out):
            for j in range(16 * g0, min(16 * g1, M.n_vocab)):
                c.LOG[i, j] = np.tanh(c.LOG[i, j] * (np.float32(1.0) / M.softcap)) * M.softcap
    if M.logit_scale != 1.0:  # (granite) likewise
        for i in range(n_out):
            for j in range(16 * g0, min(16 * g1, M.n_vocab)):
                c.LOG[i, j] = c.LOG[i, j] * M.logit_scale
    return tick(c.prof, tid, P_HEAD, clk)


@njit(cache=True, inline="always")
def _attention(c, kv, lbase, gqa, sinks):
    M = c.M
    tid, nth = c.tid, c.nth
    _rc, qv, qq, vbuf, res, kt, vt, pt, st, pm, ps, pv, tmp = c.TS
    hd, kq, cap = M.head_dim, M.kq_scale, M.attn_softcap
    if kv.mode == MODE_SPLIT:  # decode over a long cache: one chunk of cells per thread
        # (several rows: each as its own one-token decode, the verification of proposed
        # tokens with single-token numerics)
        for t in range(c.n_tok):
            if t > 0:
                barrier(c.bar, nth)  # the partials of row t - 1 are merged
            attention_split_partial(
                tid, nth, kv.n_kv, M.n_head, gqa, hd, kq, c.k_type, c.v_type, kv.rowb, c.Q,
                kv.KC, kv.VC, lbase, kv.hstride, kv.mask, kv.order, qv[tid], qq[tid],
                vbuf[tid], res[tid], pm, ps, pv, sinks, t, cap,
            )  # fmt: skip
            barrier(c.bar, nth)
            attention_split_merge(tid, nth, M.n_head, hd, pm, ps, pv, c.ATT, tmp[tid], t)
    elif kv.mode == MODE_ROWS:
        attention_rows(
            tid, nth, c.n_tok, kv.n_kv, M.n_head, gqa, hd, kq, c.k_type, c.v_type, kv.rowb,
            c.Q, kv.KC, kv.VC, lbase, kv.hstride, kv.mask, kv.order, c.ATT, qv[tid], qq[tid],
            vbuf[tid], res[tid], sinks, cap,
        )  # fmt: skip
    else:
        attention_tiled(
            tid, nth, c.n_tok, kv.n_kv, M.n_head, gqa, hd, kq, c.k_type, c.v_type, kv.rowb, c.Q,
            kv.KC, kv.VC, lbase, kv.hstride, kv.mask, c.ATT, kt[tid], vt[tid], pt[tid], st[tid],
            sinks, cap,
        )  # fmt: skip
