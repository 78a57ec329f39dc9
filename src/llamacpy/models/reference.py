"""The executable specification of the decoder forward: a numpy function per stage name of
:mod:`.stages`, run in the order of the architecture's ``block``.

``Reference(model).forward(ub, kv, n_threads)`` walks ``type(model).block`` (the
declaration :mod:`.compose` builds the compiled forward from) and calls :data:`STAGES` of
each name on every layer. It reads what the compiled forward reads: the layer table and the
model row by field name, the repacked weights, the model's rope settings and the context's
rope factors, the same KV cache arrays; and follows the same numerics: q8 / q8_K
activations (``matmul_numpy``), f16 / q8_0 cache rows, ggml's flash-attention regimes,
ggml's SwiGLU and GEGLU. Slow and single-threaded: the tests compare the compiled forward of
every architecture with it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..ops.activations import geglu_numpy, silu_numpy, swiglu_numpy, swiglu_oai_numpy
from ..ops.attention_ref import (
    attention_numpy,
    fwht_numpy,
    load_rows_numpy,
    rotations,
    store_row_numpy,
)
from ..ops.dequant import dequantize_repacked_numpy
from ..ops.matmul import block_mins, matmul_numpy
from ..ops.moe import route_numpy, shared_gate_numpy, softmax_ggml_numpy
from ..ops.norm import rms_norm_numpy
from ..ops.rope import rope_numpy
from .common import UBatchArrays
from .decoder import Decoder
from .delta_net_ref import (
    conv1d_step,
    delta_rule_step,
    l2_norm_numpy,
    sigmoid_numpy,
    softplus_numpy,
)
from .mamba2_ref import conv_bias_step, scan_step
from .spec import Branch, stage_names
from .stages import ACT_GEGLU, ACT_SWIGLU_OAI, GATING_SIGMOID, GATING_SOFTMAX_WEIGHT

_F32 = np.float32


@dataclass
class Part:
    """The KV cache of one layer kind (global, sliding-window) as a ubatch sees it."""

    kc: np.ndarray  # K cache [layers of the kind, n_head_kv, cells, row bytes]
    vc: np.ndarray  # V cache, likewise
    cells: np.ndarray  # the cell of each token
    mask: np.ndarray  # [n, n_kv]
    n_kv: int
    mode: int  # attention regime (stages.MODE_*)
    order: np.ndarray | None = None  # cells in the order the rows attend them (None: cell order)


@dataclass
class Pass:
    """The state of one ubatch going through the network (what the stages read and write)."""

    ub: UBatchArrays
    n_threads: int  # chunks of the decode-split attention
    parts: tuple[Part, Part]  # global, sliding-window
    k_type: int
    v_type: int
    factors: np.ndarray  # rope frequency factors of the context (empty: none)
    x: np.ndarray  # [rows, n_embd] residual stream
    h: np.ndarray | None = None  # normalized input of the next matmuls
    q: np.ndarray | None = None  # [n, n_head * head_dim]
    k: np.ndarray | None = None  # [n, n_head_kv * head_dim]
    v: np.ndarray | None = None
    att: np.ndarray | None = None  # [n, n_head * head_dim]
    g: np.ndarray | None = None  # [rows, n_ff] gated FFN activation
    sel: np.ndarray | None = None  # [rows, n_expert_used] experts of each row, best first
    moe_act: np.ndarray | None = None  # [rows, n_expert_used, n_ff_exp] experts' activations
    wts: np.ndarray | None = None  # [rows, n_expert_used] their weights
    moe: np.ndarray | None = None  # [rows, n_embd] the routed experts' sum, kept apart
    shexp_gate: np.ndarray | None = None  # [rows] a shared expert's gate
    gate: np.ndarray | None = None  # [n, ...] an output gate (attention's; DeltaNet's z)
    # Gated DeltaNet: beta and decay [n, H_v]; the recurrent part of a hybrid memory (conv
    # rows [layers, sequences, floats], delta-rule rows likewise) and each token's row
    beta: np.ndarray | None = None
    decay: np.ndarray | None = None
    states: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    ple: np.ndarray | None = None  # [n, n_layer * n_pl] per-layer inputs (gemma4)


class Reference:
    """A model's numpy forward; dequantized weights are kept for repeated passes."""

    def __init__(self, model: Decoder) -> None:
        self.stages = stage_functions(model.block)  # (the collecting block, when switched)
        self.model = model
        self.M = model.model_row[0]
        st = model.store
        self._buf, self._desc, self._f = st.buf, st.desc, st.fbuf
        self._w: dict[int, np.ndarray] = {}
        self._mins: dict[int, np.ndarray | None] = {}

    # ------------------------------------------------------------------ weights
    def _matrix(self, index: int) -> tuple[int, int, int, int]:
        if index < 0:
            raise ValueError("a stage reads a matrix the layer does not have")
        t, off, nrows, ncols = (int(v) for v in self._desc[index])
        return t, off, nrows, ncols

    def w(self, index: int) -> np.ndarray:
        """Matrix ``index`` of the store, dequantized ``[nrows, ncols]``."""
        if index not in self._w:
            t, off, nrows, ncols = self._matrix(index)
            self._w[index] = dequantize_repacked_numpy(self._buf[off:], t, nrows, ncols)
        return self._w[index]

    def mm(self, index: int, x: np.ndarray) -> np.ndarray:
        """``x . W^T`` with ``x`` quantized as the weight's format consumes it."""
        t, off, nrows, ncols = self._matrix(index)
        if index not in self._mins:
            self._mins[index] = block_mins(self._buf[off:], t, nrows, ncols)
        return matmul_numpy(None, t, nrows, ncols, x, self.w(index), self._mins[index])

    def vec(self, offset: int, n: int) -> np.ndarray:
        """``n`` floats of the vector at ``offset`` of the float buffer."""
        if offset < 0:
            raise ValueError("a stage reads a vector the layer does not have")
        return self._f[offset : offset + n]

    def bias(self, offset: int, n: int, e: int = 0) -> np.ndarray:
        """Row ``e`` of ``n`` floats of the vector at ``offset`` (0 when the layer has none)."""
        if offset < 0:
            return np.zeros(n, _F32)
        return self._f[offset + n * int(e) : offset + n * (int(e) + 1)]

    def norm(self, x: np.ndarray, offset: int) -> np.ndarray:
        """``rms_norm(x) * w`` over the last axis, ``w`` the vector at ``offset``."""
        return rms_norm_numpy(x, self.vec(offset, x.shape[-1]), self.M["eps"])

    # ------------------------------------------------------------------ forward
    def forward(self, ub: UBatchArrays, kv: tuple, n_threads: int = 2) -> np.ndarray:
        """Logits ``[n_out, n_vocab]`` of the ubatch; writes the ubatch's K/V into ``kv``."""
        M, model = self.M, self.model
        kc, vc, kcs, vcs, info = kv
        k_type, v_type, rowb, n_ctx, n_ctx_swa, rowb_swa = (int(v) for v in info[:6])
        # flat caches -> [layer, head, cell] (each part with its own KV heads)
        (hk, _), (hk_swa, _) = getattr(model, "kv_geometry", ((int(M["n_head_kv"]), 0),) * 2)
        glob = Part(_cells(kc, hk, n_ctx, rowb), _cells(vc, hk, n_ctx, rowb),
                    ub.cells, ub.mask, ub.n_kv, ub.mode, ub.order)  # fmt: skip
        win, states = glob, None
        if ub.rows is not None:  # a hybrid memory: the second pair holds the states
            n_rec, n_seq, conv_size, ssm_size = (int(v) for v in info[6:10])
            states = (kcs.view(_F32).reshape(n_rec, n_seq, conv_size),
                      vcs.view(_F32).reshape(n_rec, n_seq, ssm_size), ub.rows)  # fmt: skip
        elif ub.cells_swa is not None:
            win = Part(_cells(kcs, hk_swa, n_ctx_swa, rowb_swa),
                       _cells(vcs, hk_swa, n_ctx_swa, rowb_swa), ub.cells_swa, ub.mask_swa,
                       ub.n_kv_swa, ub.mode_swa, ub.order_swa)  # fmt: skip
        p = Pass(
            ub, n_threads, (glob, win), k_type, v_type,
            np.asarray(model.rope_factors(n_ctx), _F32), embed(self, ub.tokens),
            states=states,
        )  # fmt: skip
        for L in model.layer_table[: M["n_layer"]]:
            self.M = model.model_row[int(L["index"])]  # (the layer's geometry)
            for fn in self.stages:
                fn(self, p, L)
        return head(self, p)


def _cells(flat: np.ndarray, hk: int, n_ctx: int, rowb: int) -> np.ndarray:
    """A flat cache as ``[layer, head, cell, row bytes]`` (empty: a model without attention)."""
    if flat.size == 0:
        return flat.reshape(0, hk, n_ctx, rowb)
    return flat.reshape(-1, hk, n_ctx, rowb)


def stage_functions(block: tuple) -> list[Callable]:
    """The reference function of each element of ``block`` (a :class:`.spec.Branch`: one
    function running its ``then`` or ``otherwise`` stages by the layer's flag)."""
    unknown = [name for name in stage_names(block) if name not in STAGES]
    if unknown:
        raise ValueError(
            f"unknown stage {unknown[0]!r}: the numpy reference has no function for it "
            f"(known: {', '.join(sorted(STAGES))})"
        )
    return [_branch(el) if isinstance(el, Branch) else STAGES[el] for el in block]


def _branch(el: Branch) -> Callable:
    then, otherwise = [STAGES[n] for n in el.then], [STAGES[n] for n in el.otherwise]

    def run(r: Reference, p: Pass, L) -> None:
        for fn in then if L[el.flag] != 0 else otherwise:
            fn(r, p, L)

    return run


def _residual(r: Reference, x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``x + out``, or ``out * residual_scale + x`` (granite)."""
    rs = r.M["residual_scale"]
    if rs != 1.0:
        out = (out * rs).astype(_F32)
    return (out + x).astype(_F32)


def _heads(a: np.ndarray, d: int) -> np.ndarray:
    """``[n, heads * d]`` -> ``[n, heads, d]``."""
    return a.reshape(len(a), -1, d)


# ----------------------------------------------------------------------------- around the blocks
def embed(r: Reference, tokens: np.ndarray) -> np.ndarray:
    """``x[t] = token_embd[token t] * embd_scale``."""
    x = r.w(int(r.M["token_embd"]))[tokens].copy()
    if r.M["embd_scale"] != 1.0:
        x *= r.M["embd_scale"]
    return x


def head(r: Reference, p: Pass) -> np.ndarray:
    """Logits of the output rows: ``rms_norm(x) * output_norm . output`` (soft-capped)."""
    M, out_idx = r.M, p.ub.out_idx
    if len(out_idx) == 0:
        return np.zeros((0, int(M["n_vocab"])), _F32)
    gathered = len(p.x) != len(p.ub.tokens)  # out_rows kept the output rows only
    rows = p.x[: len(out_idx)] if gathered else p.x[out_idx]
    logits = r.mm(int(M["output"]), r.norm(rows, int(M["output_norm"])))
    c = M["softcap"]
    if c != 0.0:
        logits = np.tanh(logits * (_F32(1.0) / c)) * c
    if M["logit_scale"] != 1.0:
        logits = (logits * M["logit_scale"]).astype(_F32)
    return logits


# ----------------------------------------------------------------------------- stages
def attn_norm(r: Reference, p: Pass, L) -> None:
    """``h = rms_norm(x) * attn_norm``."""
    p.h = r.norm(p.x, L["attn_norm"])


def attn_in(r: Reference, p: Pass, L) -> None:
    """``h = x`` (no pre-attention norm)."""
    p.h = p.x


def qkv(r: Reference, p: Pass, L) -> None:
    """``q, k, v = h . attn_q, h . attn_k, h . attn_v`` (k, v only in a layer with KV of its
    own, v only with ``attn_v``)."""
    p.q = r.mm(L["attn_q"], p.h)
    if L["kv_shared"] == 0:
        p.k = r.mm(L["attn_k"], p.h)
        p.v = r.mm(L["attn_v"], p.h) if L["attn_v"] >= 0 else None


def qkv_bias(r: Reference, p: Pass, L) -> None:
    """``q += attn_q.bias`` (k, v likewise) for the biases the layer has."""
    for field, name in (("q", "attn_q_bias"), ("k", "attn_k_bias"), ("v", "attn_v_bias")):
        if L[name] >= 0:
            a = getattr(p, field)
            setattr(p, field, a + r.vec(L[name], a.shape[1]))


def qk_norm(r: Reference, p: Pass, L) -> None:
    """Per-head ``rms_norm(q_h) * attn_q_norm``, ``rms_norm(k_h) * attn_k_norm``."""
    d = int(r.M["head_dim"])
    p.q = r.norm(_heads(p.q, d), L["attn_q_norm"]).reshape(p.q.shape)
    if L["kv_shared"] == 0:
        p.k = r.norm(_heads(p.k, d), L["attn_k_norm"]).reshape(p.k.shape)


def v_norm(r: Reference, p: Pass, L) -> None:
    """Per-head ``rms_norm(v_h)``, no weight (without ``attn_v``: of the keys before their
    norm and rope); nothing in a layer reading an earlier layer's KV."""
    if L["kv_shared"] != 0:
        return
    if L["attn_v"] < 0:
        p.v = p.k.copy()
    d = int(r.M["head_dim"])
    p.v = rms_norm_numpy(_heads(p.v, d), np.ones(d, _F32), r.M["eps"]).reshape(p.v.shape)


def layer_scale(r: Reference, p: Pass, L) -> None:
    """``x *= layer_output_scale`` when the layer has it."""
    if L["layer_output_scale"] >= 0:
        p.x = (p.x * r.vec(L["layer_output_scale"], 1)[0]).astype(_F32)


def qk_norm_full(r: Reference, p: Pass, L) -> None:
    """``rms_norm(q) * attn_q_norm``, ``rms_norm(k) * attn_k_norm`` over whole rows."""
    p.q, p.k = r.norm(p.q, L["attn_q_norm"]), r.norm(p.k, L["attn_k_norm"])


def rope(r: Reference, p: Pass, L) -> None:
    """Rotate q and k by position with the layer's rope (global or sliding-window); NoPE
    layers (``rope`` 0) are left as they are."""
    if L["rope"] == 0:
        return
    d, model = int(r.M["head_dim"]), r.model
    params = model.rope_swa if L["swa"] != 0 else model.rope
    for field in ("q", "k") if L["kv_shared"] == 0 else ("q",):
        a = getattr(p, field)
        setattr(p, field, rope_numpy(_heads(a, d), p.ub.pos, params, p.factors).reshape(a.shape))


def scale_q(r: Reference, p: Pass, L) -> None:
    """``q *= q_scale``."""
    p.q = p.q * r.M["q_scale"]


def kv_store(r: Reference, p: Pass, L) -> None:
    """Write k and v of each token into its cache cell (in the cache's type; the layer's
    kind's cache; a quantized cache holds q, k and v rotated)."""
    d, li, part = int(r.M["head_dim"]), int(L["kv_index"]), p.parts[int(L["swa"] != 0)]
    rk, rv = rotations(p.k_type, p.v_type, d)
    if L["kv_shared"] != 0:  # (an earlier layer's KV: nothing stored, q rotated alike)
        p.q = fwht_numpy(p.q, rk) if rk else p.q
        return
    if rk:
        p.q, p.k = fwht_numpy(p.q, rk), fwht_numpy(p.k, rk)
    if rv:
        p.v = fwht_numpy(p.v, rv)
    k, v = _heads(p.k, d), _heads(p.v, d)
    for t, cell in enumerate(part.cells):
        for hk in range(k.shape[1]):
            store_row_numpy(part.kc[li, hk, cell], k[t, hk], p.k_type)
            store_row_numpy(part.vc[li, hk, cell], v[t, hk], p.v_type)


def attention(r: Reference, p: Pass, L) -> None:
    """``att = softmax(q . K^T * kq_scale + mask) . V`` over the cached cells (SWA layers:
    their own cache and sliding-window mask)."""
    d, li, part = int(r.M["head_dim"]), int(L["kv_index"]), p.parts[int(L["swa"] != 0)]
    keys, vals = (
        np.stack([load_rows_numpy(rows[: part.n_kv], d, t) for rows in cache[li]])
        for cache, t in ((part.kc, p.k_type), (part.vc, p.v_type))
    )
    mask = part.mask[:, : part.n_kv]
    if part.order is not None:  # a deterministic context: cells in order of position
        keys, vals, mask = keys[:, part.order], vals[:, part.order], mask[:, part.order]
    sinks = r.vec(L["attn_sinks"], int(r.M["n_head"])) if L["attn_sinks"] >= 0 else None
    att = attention_numpy(
        _heads(p.q, d), keys, vals, mask, p.k_type, p.v_type, part.mode, p.n_threads,
        r.M["kq_scale"], sinks, r.M["attn_softcap"],
    )  # fmt: skip
    p.att = att.reshape(len(att), -1)
    rv = rotations(p.k_type, p.v_type, d)[1]
    if rv:  # rotated values: the output rotated back
        p.att = fwht_numpy(p.att, rv)


def out_proj(r: Reference, p: Pass, L) -> None:
    """``x += att . attn_output`` (times ``residual_scale``)."""
    p.x = _residual(r, p.x, r.mm(L["attn_output"], p.att))


def out_proj_post_norm(r: Reference, p: Pass, L) -> None:
    """``x += rms_norm(att . attn_output) * post_attention_norm``."""
    p.x = p.x + r.norm(r.mm(L["attn_output"], p.att), L["post_attention_norm"])


def out_proj_bias(r: Reference, p: Pass, L) -> None:
    """``x += att . attn_output + attn_output.bias``."""
    o = r.mm(L["attn_output"], p.att)
    p.x = p.x + (o + r.bias(L["attn_output_bias"], o.shape[1]))


def ple_inputs(r: Reference, p: Pass, L) -> None:
    """First layer: the per-layer inputs ``(rms_norm(x . per_layer_model_proj / sqrt(n_embd))
    * per_layer_proj_norm + per_layer_token_embd[token] * sqrt(n_pl)) / sqrt(2)``."""
    M = r.M
    npl, nl, e = int(M["n_embd_pl"]), int(M["n_layer"]), int(M["n_embd"])
    if L["index"] != 0 or npl == 0:
        return
    proj = r.mm(int(M["per_layer_model_proj"]), p.x) * (_F32(1.0) / np.sqrt(_F32(e)))
    normed = rms_norm_numpy(_heads(proj, npl), r.vec(int(M["per_layer_proj_norm"]), npl), M["eps"])
    tok = r.w(int(M["per_layer_token_embd"]))[p.ub.tokens] * np.sqrt(_F32(npl))
    inv_2 = _F32(1.0) / np.sqrt(_F32(2.0))
    p.ple = ((normed.reshape(len(proj), nl * npl) + tok) * inv_2).astype(_F32)


def ple_residual(r: Reference, p: Pass, L) -> None:
    """``x += rms_norm((gelu(x . inp_gate) * the layer's inputs) . proj) * post_norm``."""
    if L["inp_gate"] < 0:
        return
    npl, il = int(r.M["n_embd_pl"]), int(L["index"])
    g = geglu_numpy(r.mm(L["inp_gate"], p.x), p.ple[:, il * npl : (il + 1) * npl])
    p.x = p.x + r.norm(r.mm(L["proj"], g), L["post_norm"])


def out_rows(r: Reference, p: Pass, L) -> None:
    """In the last layer only the rows whose logits are wanted go on (when some are not)."""
    n_out = len(p.ub.out_idx)
    if L["last"] != 0 and 0 < n_out < len(p.ub.tokens):
        p.x = p.x[p.ub.out_idx]


def ffn_norm(r: Reference, p: Pass, L) -> None:
    """``h = rms_norm(x) * ffn_norm``."""
    p.h = r.norm(p.x, L["ffn_norm"])


def ffn_in(r: Reference, p: Pass, L) -> None:
    """``h = x`` (no pre-FFN norm)."""
    p.h = p.x


def ffn_post_attn_norm(r: Reference, p: Pass, L) -> None:
    """``h = rms_norm(x) * post_attention_norm``."""
    p.h = r.norm(p.x, L["post_attention_norm"])


def ffn_swiglu(r: Reference, p: Pass, L) -> None:
    """``g = silu(h . ffn_gate) * (h . ffn_up)``."""
    p.g = swiglu_numpy(r.mm(L["ffn_gate"], p.h), r.mm(L["ffn_up"], p.h))


def ffn_geglu(r: Reference, p: Pass, L) -> None:
    """``g = gelu(h . ffn_gate) * (h . ffn_up)`` (tanh approximation, ggml's f16 table)."""
    p.g = geglu_numpy(r.mm(L["ffn_gate"], p.h), r.mm(L["ffn_up"], p.h))


def ffn_down(r: Reference, p: Pass, L) -> None:
    """``x += g . ffn_down`` (times ``residual_scale``)."""
    p.x = _residual(r, p.x, r.mm(L["ffn_down"], p.g))


def ffn_down_post_norm(r: Reference, p: Pass, L) -> None:
    """``x += rms_norm(g . ffn_down) * post_ffw_norm``."""
    p.x = p.x + r.norm(r.mm(L["ffn_down"], p.g), L["post_ffw_norm"])


def ffn_router(r: Reference, p: Pass, L) -> None:
    """Per row: ``softmax(h . ffn_gate_inp)`` (float32, ggml's), the ``n_expert_used``
    most probable experts, best first, and their weights (normalized, scaled)."""
    M = r.M
    logits = r.mm(L["ffn_gate_inp"], p.h)
    logits = logits + r.bias(L["ffn_gate_inp_bias"], logits.shape[1])
    k, norm, scale = int(M["n_expert_used"]), bool(M["expert_norm"]), float(M["expert_scale"])
    if M["expert_gating"] == GATING_SOFTMAX_WEIGHT:  # the largest logits, their softmax
        p.sel, w = route_numpy(logits, k, False, 0.0)
        _, p.wts = route_numpy(softmax_ggml_numpy(w), k, norm, scale)  # w keeps its order
        return
    grouped = int(M["n_expert_groups"]) > 1
    if M["expert_gating"] == GATING_SIGMOID or grouped or L["ffn_exp_probs_b"] >= 0:
        # chosen by the probabilities + bias (within the best groups), weighted by them
        sig = M["expert_gating"] == GATING_SIGMOID
        probs = sigmoid_numpy(logits) if sig else softmax_ggml_numpy(logits)
        biased = (probs + r.bias(L["ffn_exp_probs_b"], probs.shape[1])).astype(_F32)
        if grouped:
            biased = group_mask_numpy(biased, int(M["n_expert_groups"]), int(M["n_group_used"]))
        p.sel, _ = route_numpy(biased, k, False, 0.0)
        _, p.wts = route_numpy(np.take_along_axis(probs, p.sel, -1), k, norm, scale)
        return
    p.sel, p.wts = route_numpy(softmax_ggml_numpy(logits), k, norm, scale)


def group_mask_numpy(sel: np.ndarray, n_groups: int, n_used: int) -> np.ndarray:
    """Selection scores ``[n, n_expert]`` with the experts outside each row's ``n_used``
    best groups at -inf (a group scored by the sum of its two best)."""
    g = sel.reshape(len(sel), n_groups, -1)
    top2 = -np.sort(-g, axis=-1, kind="stable")[..., :2]
    score = (top2[..., 0] + top2[..., 1]).astype(_F32)
    best = np.argsort(-score, axis=-1, kind="stable")[:, :n_used]
    keep = np.zeros(score.shape, bool)
    np.put_along_axis(keep, best, True, -1)
    return np.where(keep[..., None], g, _F32(-np.inf)).reshape(sel.shape).astype(_F32)


def _moe(r: Reference, p: Pass, L) -> np.ndarray:
    """``sum_j w_j * (silu(h . gate_e_j) * (h . up_e_j)) . down_e_j``: each expert's output
    times its weight, added in the order of the selection."""
    n, k = p.sel.shape
    n_embd, f = int(r.M["n_embd"]), int(r.M["n_ff_exp"])
    act = {ACT_SWIGLU_OAI: swiglu_oai_numpy, ACT_GEGLU: geglu_numpy}.get(
        int(r.M["expert_act"]), swiglu_numpy
    )
    out = np.zeros((n, k, n_embd), _F32)
    p.moe_act = np.zeros((n, k, f), _F32)
    for e in np.unique(p.sel):
        t, j = np.nonzero(p.sel == e)
        h = p.h[t]
        g = r.mm(L["ffn_gate_exps"] + e, h) + r.bias(L["ffn_gate_exps_bias"], f, e)
        u = r.mm(L["ffn_up_exps"] + e, h) + r.bias(L["ffn_up_exps_bias"], f, e)
        p.moe_act[t, j] = act(g, u)
        d = r.mm(L["ffn_down_exps"] + e, p.moe_act[t, j])
        if L["ffn_down_exps_scale"] >= 0:  # the expert's output scale (gemma4)
            d = (d * r.vec(L["ffn_down_exps_scale"] + int(e), 1)[0]).astype(_F32)
        out[t, j] = d + r.bias(L["ffn_down_exps_bias"], n_embd, e)
    acc = out[:, 0] * p.wts[:, :1]
    for j in range(1, k):
        acc = (acc + out[:, j] * p.wts[:, j : j + 1]).astype(_F32)
    return acc.astype(_F32)


def ffn_moe(r: Reference, p: Pass, L) -> None:
    """``x += sum_j w_j * (silu(h . gate_e_j) * (h . up_e_j)) . down_e_j``: each expert's
    output times its weight, added in the order of the selection, then to ``x`` (times
    ``residual_scale``)."""
    p.x = _residual(r, p.x, _moe(r, p, L))


def ffn_moe_keep(r: Reference, p: Pass, L) -> None:
    """The routed experts' sum of :func:`ffn_moe`, kept for a shared expert."""
    p.moe = _moe(r, p, L)


def ffn_router_in(r: Reference, p: Pass, L) -> None:
    """gemma4's router input ``rms_norm(x) / sqrt(n_embd) * ffn_gate_inp.scale``."""
    n = int(r.M["n_embd"])
    inv = _F32(1.0) / np.sqrt(_F32(n))
    h = rms_norm_numpy(p.x, np.ones(n, _F32), r.M["eps"]) * inv
    p.h = (h * r.vec(L["ffn_gate_inp_scale"], n)).astype(_F32)


def ffn_pre_norm_2(r: Reference, p: Pass, L) -> None:
    """``h = rms_norm(x) * pre_ffw_norm_2``."""
    p.h = r.norm(p.x, L["pre_ffw_norm_2"])


def ffn_down_post_norms(r: Reference, p: Pass, L) -> None:
    """``x += rms_norm(rms_norm(g . ffn_down) * post_ffw_norm_1 + rms_norm(moe) *
    post_ffw_norm_2) * post_ffw_norm``."""
    mlp = r.norm(r.mm(L["ffn_down"], p.g), L["post_ffw_norm_1"])
    both = (mlp + r.norm(p.moe, L["post_ffw_norm_2"])).astype(_F32)
    p.x = (p.x + r.norm(both, L["post_ffw_norm"])).astype(_F32)


def ffn_shexp_gate(r: Reference, p: Pass, L) -> None:
    """A shared expert's gate ``sigmoid(h . ffn_gate_inp_shexp)`` per row."""
    if L["ffn_gate_inp_shexp"] < 0:  # a shared expert without a gate (deepseek2)
        p.shexp_gate = np.ones(len(p.h), _F32)
        return
    w = r.vec(L["ffn_gate_inp_shexp"], int(r.M["n_embd"]))
    p.shexp_gate = shared_gate_numpy(p.h, w)


def ffn_shexp_down(r: Reference, p: Pass, L) -> None:
    """``x += (moe + (g . ffn_down) * gate)``: the shared expert's output times its gate,
    added to the routed experts' sum, then to the residual."""
    shared = (r.mm(L["ffn_down"], p.g) * p.shexp_gate[:, None]).astype(_F32)
    p.x = ((p.moe + shared).astype(_F32) + p.x).astype(_F32)


# ----------------------------------------------------------------------------- latent attention
def _mla(r: Reference) -> tuple[int, int, int, int, int, int]:
    """(heads, latent size, query head size, its nope part, value head size, cache row)."""
    M = r.M
    hk, nr = int(M["head_k_mla"]), int(M["n_rot"])
    return (
        int(M["n_head"]),
        int(M["n_lora_kv"]),
        hk,
        hk - nr,
        int(M["head_v_mla"]),
        int(M["head_dim"]),
    )


def mla_q(r: Reference, p: Pass, L) -> None:
    """``kv_a = h . attn_kv_a_mqa`` (in ``k``); the queries ``rms_norm(h . attn_q_a) *
    attn_q_a_norm . attn_q_b``, or ``h . attn_q``."""
    p.k = r.mm(L["attn_kv_a_mqa"], p.h)
    if L["attn_q"] >= 0:
        p.q = r.mm(L["attn_q"], p.h)
    else:
        p.q = r.mm(L["attn_q_b"], r.norm(r.mm(L["attn_q_a"], p.h), L["attn_q_a_norm"]))


def mla_kv(r: Reference, p: Pass, L) -> None:
    """The rope parts of the queries and of the shared key rotated, the latent normed, the
    cache row (latent | rope key) stored (``k``: the rows, ``q``: the heads before
    absorption)."""
    _H, lr, hk, nope, _hv, _d = _mla(r)
    n, part = len(p.q), p.parts[0]
    q = _heads(p.q, hk).copy()
    q[:, :, nope:] = rope_numpy(q[:, :, nope:], p.ub.pos, r.model.rope, p.factors)
    pe = rope_numpy(p.k[:, None, lr:], p.ub.pos, r.model.rope, p.factors)[:, 0]
    p.q, p.k = q, np.concatenate([r.norm(p.k[:, :lr], L["attn_kv_a_norm"]), pe], axis=1)
    for t, cell in enumerate(part.cells[:n]):
        store_row_numpy(part.kc[int(L["kv_index"]), 0, cell], p.k[t], p.k_type)


def mla_absorb(r: Reference, p: Pass, L) -> None:
    """Each head's query in the latent: ``q_nope_h . attn_k_b_h`` | its rope part."""
    H, lr, _hk, nope, _hv, d = _mla(r)
    q = np.zeros((len(p.q), H, d), _F32)
    for h in range(H):
        q[:, h, :lr] = r.mm(L["attn_k_b"] + h, np.ascontiguousarray(p.q[:, h, :nope]))
    q[:, :, lr:] = p.q[:, :, nope:]
    p.q = q.reshape(len(q), -1)


def mla_attention(r: Reference, p: Pass, L) -> None:
    """MQA over the cache rows, each the key and the value (the latent part is used)."""
    d, li, part = int(r.M["head_dim"]), int(L["kv_index"]), p.parts[0]
    keys = load_rows_numpy(part.kc[li, 0, : part.n_kv], d, p.k_type)[None]
    mask = part.mask[:, : part.n_kv]
    if part.order is not None:
        keys, mask = keys[:, part.order], mask[:, part.order]
    att = attention_numpy(
        _heads(p.q, d), keys, keys, mask, p.k_type, p.k_type, part.mode, p.n_threads,
        r.M["kq_scale"],
    )  # fmt: skip
    p.att = att.reshape(len(att), -1)


def mla_out(r: Reference, p: Pass, L) -> None:
    """Each head's value ``att_h[:latent] . attn_v_b_h``, then ``x += att . attn_output``."""
    H, lr, _hk, _nope, _hv, d = _mla(r)
    att = _heads(p.att, d)
    o = np.concatenate(
        [r.mm(L["attn_v_b"] + h, np.ascontiguousarray(att[:, h, :lr])) for h in range(H)], axis=1
    )
    p.x = p.x + r.mm(L["attn_output"], o)


def ffn_shexp_in(r: Reference, p: Pass, L) -> None:
    """(The compiled forward quantizes ``h`` again; here ``h`` is kept.)"""


def ffn_shexp_add(r: Reference, p: Pass, L) -> None:
    """``x = (moe + g . ffn_down) * residual_scale + x``."""
    p.x = _residual(r, p.x, (p.moe + r.mm(L["ffn_down"], p.g)).astype(_F32))


# ----------------------------------------------------------------------------- gated attention
def q_gate(r: Reference, p: Pass, L) -> None:
    """``attn_q``'s rows per head are the query, then its output gate: apart."""
    d = int(r.M["head_dim"])
    qg = p.q.reshape(len(p.q), -1, 2 * d)
    p.q, p.gate = (qg[:, :, :d].reshape(len(p.q), -1), qg[:, :, d:].reshape(len(p.q), -1))


def attn_gate(r: Reference, p: Pass, L) -> None:
    """``att *= sigmoid(gate)``."""
    p.att = (p.att * sigmoid_numpy(p.gate)).astype(_F32)


# ----------------------------------------------------------------------------- Gated DeltaNet
def _ssm(r: Reference) -> tuple[int, int, int, int, int, int]:
    """(conv taps, key head size, key heads, value heads, value head size, channels)."""
    M = r.M
    d_conv, sk, hk, hv = (int(M[k]) for k in ("ssm_d_conv", "ssm_d_state", "ssm_n_group",
                                               "ssm_dt_rank"))  # fmt: skip
    sv = int(M["ssm_d_inner"]) // hv
    return d_conv, sk, hk, hv, sv, hv * sv + 2 * hk * sk


def delta_net_in(r: Reference, p: Pass, L) -> None:
    """The channels ``h . attn_qkv`` (in ``q``), ``z = h . attn_gate``, ``h . ssm_beta``,
    ``h . ssm_alpha`` (in ``decay`` until the next stage)."""
    p.q, p.gate = r.mm(L["attn_qkv"], p.h), r.mm(L["attn_gate"], p.h)
    p.beta, p.decay = r.mm(L["ssm_beta"], p.h), r.mm(L["ssm_alpha"], p.h)


def delta_net_conv(r: Reference, p: Pass, L) -> None:
    """Causal convolution over each token's state row, SiLU; ``beta = sigmoid(beta)``,
    ``g = softplus(alpha + ssm_dt) * ssm_a``."""
    d_conv, _sk, _hk, hv, _sv, ch = _ssm(r)
    conv, _ssm_rows, rows = p.states
    w = r.vec(L["ssm_conv1d"], ch * d_conv).reshape(ch, d_conv)
    out = np.zeros((len(p.q), ch), _F32)
    for t, row in enumerate(rows):
        state = conv[int(L["kv_index"]), row].reshape(ch, d_conv - 1)
        out[t] = conv1d_step(state, p.q[t, :ch], w)
    p.q = silu_numpy(out)
    p.beta = sigmoid_numpy(p.beta)
    alpha = p.decay + r.vec(L["ssm_dt_bias"], hv)
    p.decay = (softplus_numpy(alpha) * r.vec(L["ssm_a"], hv)).astype(_F32)


def delta_net_rule(r: Reference, p: Pass, L, grouped: bool = False) -> None:
    """Per token: q, k L2-normed per key head, the gated delta rule on the token's state
    row, then ``rms_norm(o) * ssm_norm * silu(z)`` per value head."""
    _d, sk, hk, hv, sv, _ch = _ssm(r)
    _conv, ssm, rows = p.states
    eps, kd = r.M["eps"], hk * sk
    out = np.zeros((len(p.q), hv, sv), _F32)
    for t, row in enumerate(rows):
        c = p.q[t]
        q = l2_norm_numpy(c[:kd].reshape(hk, sk), eps)
        k = l2_norm_numpy(c[kd : 2 * kd].reshape(hk, sk), eps)
        S = ssm[int(L["kv_index"]), row].reshape(hv, sv, sk)
        v = c[2 * kd :].reshape(hv, sv)
        out[t] = delta_rule_step(S, q, k, v, p.decay[t], p.beta[t], grouped)
    o = r.norm(out, L["ssm_norm"]) * silu_numpy(p.gate.reshape(len(p.q), hv, sv))
    p.att = o.reshape(len(p.q), -1).astype(_F32)


def delta_net_in_grouped(r: Reference, p: Pass, L) -> None:
    """qwen3next: the channels and ``z`` from ``attn_qkv`` / ``attn_gate`` or from the fused
    ``ssm_in`` (per key head q | k | v | z, put in ``attn_qkv``'s order); the fused ``h .
    ssm_ba`` kept whole (in ``beta``) for the next stage."""
    if L["ssm_in"] < 0:
        p.q, p.gate = r.mm(L["attn_qkv"], p.h), r.mm(L["attn_gate"], p.h)
    else:
        _d, sk, hk, _hv, _sv, _ch = _ssm(r)
        vg = int(r.M["ssm_d_inner"]) // hk
        y = r.mm(L["ssm_in"], p.h).reshape(len(p.h), hk, 2 * sk + 2 * vg)
        q, k, v, z = np.split(y, np.cumsum([sk, sk, vg]), axis=2)
        p.q = np.concatenate([a.reshape(len(p.h), -1) for a in (q, k, v)], axis=1)
        p.gate = z.reshape(len(p.h), -1)
    p.beta = r.mm(L["ssm_beta"], p.h)


def delta_net_conv_grouped(r: Reference, p: Pass, L) -> None:
    """The fused betas | alphas apart (per key head: its value heads' betas, then their
    alphas), then :func:`delta_net_conv`."""
    _d, _sk, hk, hv, _sv, _ch = _ssm(r)
    ba = p.beta.reshape(len(p.beta), hk, 2, hv // hk)
    p.beta, p.decay = ba[:, :, 0].reshape(len(ba), hv), ba[:, :, 1].reshape(len(ba), hv)
    delta_net_conv(r, p, L)


def delta_net_rule_grouped(r: Reference, p: Pass, L) -> None:
    """:func:`delta_net_rule` with each key head's value heads together (qwen3next)."""
    delta_net_rule(r, p, L, grouped=True)


def delta_net_out(r: Reference, p: Pass, L) -> None:
    """``x += o . ssm_out``."""
    p.x = p.x + r.mm(L["ssm_out"], p.att)


# ----------------------------------------------------------------------------- short convolution
def shortconv_in(r: Reference, p: Pass, L) -> None:
    """``b | c | x = h . shortconv.in_proj`` (in ``q``)."""
    p.q = r.mm(L["attn_qkv"], p.h)


def shortconv_conv(r: Reference, p: Pass, L) -> None:
    """``y = c * conv(b * x)`` over each token's state row (in ``att``)."""
    e, taps = int(r.M["n_embd"]), int(r.M["ssm_d_conv"])
    conv, _rows2, rows = p.states
    w = r.vec(L["ssm_conv1d"], e * taps).reshape(e, taps)
    b, gate, x = p.q[:, :e], p.q[:, e : 2 * e], p.q[:, 2 * e : 3 * e]
    bx = (b * x).astype(_F32)
    out = np.zeros((len(p.q), e), _F32)
    for t, row in enumerate(rows):
        state = conv[int(L["kv_index"]), row].reshape(e, taps - 1)
        out[t] = conv1d_step(state, bx[t], w)
    p.att = (gate * out).astype(_F32)


def shortconv_out(r: Reference, p: Pass, L) -> None:
    """``x += y . shortconv.out_proj``."""
    p.x = (p.x + r.mm(L["ssm_out"], p.att)).astype(_F32)


# ----------------------------------------------------------------------------- Mamba-2
def _mamba2(r: Reference) -> tuple[int, int, int, int, int, int]:
    """(conv taps, state size, groups, heads, inner size, channels of the convolution)."""
    M = r.M
    d_conv, ds, ng, nh, inner = (int(M[k]) for k in ("ssm_d_conv", "ssm_d_state",
                                                      "ssm_n_group", "ssm_dt_rank",
                                                      "ssm_d_inner"))  # fmt: skip
    return d_conv, ds, ng, nh, inner, inner + 2 * ng * ds


def mamba2_in(r: Reference, p: Pass, L) -> None:
    """``z | xBC | dt = h . ssm_in`` (in ``q``)."""
    p.q = r.mm(L["ssm_in"], p.h)


def mamba2_conv(r: Reference, p: Pass, L) -> None:
    """``xBC = silu(conv(xBC) + ssm_conv1d.bias)`` over each token's state row (in ``k``)."""
    d_conv, _ds, _ng, _nh, inner, ch = _mamba2(r)
    conv, _ssm_rows, rows = p.states
    w = r.vec(L["ssm_conv1d"], ch * d_conv).reshape(ch, d_conv)
    b = r.bias(L["ssm_conv1d_bias"], ch)  # (granitehybrid: optional)
    out = np.zeros((len(p.q), ch), _F32)
    for t, row in enumerate(rows):
        state = conv[int(L["kv_index"]), row].reshape(ch, d_conv - 1)
        out[t] = conv_bias_step(state, p.q[t, inner : inner + ch], w, b)
    p.k = silu_numpy(out)


def mamba2_scan(r: Reference, p: Pass, L) -> None:
    """Per token: the selective scan on the token's state row, then ``y *= silu(z)``."""
    _d, ds, ng, nh, inner, ch = _mamba2(r)
    _conv, ssm, rows = p.states
    hd = inner // nh
    dt_b, a, d = (r.vec(L[k], nh) for k in ("ssm_dt_bias", "ssm_a", "ssm_d"))
    y = np.zeros((len(p.q), inner), _F32)
    for t, row in enumerate(rows):
        xbc = p.k[t]
        S = ssm[int(L["kv_index"]), row].reshape(nh, hd, ds)
        dt = (p.q[t, inner + ch : inner + ch + nh] + dt_b).astype(_F32)
        bc = xbc[inner:].reshape(2, ng, ds)
        y[t] = scan_step(S, xbc[:inner].reshape(nh, hd), dt, a, bc[0], bc[1], d).reshape(-1)
    p.att = (y * silu_numpy(p.q[:, :inner])).astype(_F32)


def mamba2_out(r: Reference, p: Pass, L) -> None:
    """``x += group_rms_norm(y) * ssm_norm . ssm_out``."""
    _d, _ds, ng, _nh, inner, _ch = _mamba2(r)
    y = p.att.reshape(len(p.att), ng, inner // ng)
    w = r.vec(L["ssm_norm"], inner).reshape(ng, inner // ng)
    normed = rms_norm_numpy(y, np.ones(inner // ng, _F32), r.M["eps"]) * w
    p.x = _residual(r, p.x, r.mm(L["ssm_out"], normed.reshape(len(p.att), inner).astype(_F32)))


def _collect(r: Reference, a: np.ndarray, L, slot: int) -> None:
    """imatrix: the squares of the input rows ``a`` added, row by row in float32, to row
    ``IM_SLOTS * layer + slot`` of ``r.imatrix`` (when the reference has such sums;
    llama-imatrix skips matmuls of under 16 rows)."""
    from .stages import IM_MIN_ROWS, IM_SLOTS

    im = getattr(r, "imatrix", None)
    if im is None or len(a) < IM_MIN_ROWS:
        return
    acc = im[IM_SLOTS * int(L["index"]) + slot, : a.shape[1]]
    for row in np.asarray(a, _F32):
        acc += row * row


def im_qkv_in(r: Reference, p: Pass, L) -> None:
    """imatrix: the input of attn_q/k/v."""
    _collect(r, p.h, L, 0)


def im_qkv_x(r: Reference, p: Pass, L) -> None:
    """imatrix: the input of attn_q/k/v (no pre-attention norm: x itself)."""
    _collect(r, p.h, L, 0)


def im_out_in(r: Reference, p: Pass, L) -> None:
    """imatrix: the input of attn_output."""
    _collect(r, p.att, L, 1)


def im_ffn_in(r: Reference, p: Pass, L) -> None:
    """imatrix: the input of ffn_gate/ffn_up."""
    _collect(r, p.h, L, 2)


def im_ffn_x(r: Reference, p: Pass, L) -> None:
    """imatrix: the input of ffn_gate/ffn_up (no pre-FFN norm: x itself)."""
    _collect(r, p.h, L, 2)


def im_moe(r: Reference, p: Pass, L) -> None:
    """imatrix: the experts' inputs (``stages.im_moe``'s rows and order)."""
    from .stages import IM_SLOTS

    im = getattr(r, "imatrix", None)
    if im is None:
        return
    M = r.M
    ne, k = int(M["n_expert"]), int(M["n_expert_used"])
    base = IM_SLOTS * int(M["n_layer"]) + 1 + 2 * ne * int(L["index"])
    g = p.moe_act
    for j in range(k):
        for t in range(len(p.h)):
            e = int(p.sel[t, j])
            for part, row in ((0, p.h[t]), (1, g[t, j])):
                acc = im[base + part * ne + e]
                acc[: len(row)] += np.asarray(row, _F32) * np.asarray(row, _F32)
                acc[-1] += _F32(1)


def im_down_in(r: Reference, p: Pass, L) -> None:
    """imatrix: the input of ffn_down."""
    _collect(r, p.g, L, 3)


Stage = Callable[[Reference, Pass, np.void], None]
# stage name (as in an architecture's block) -> its numpy function
STAGES: dict[str, Stage] = {
    fn.__name__: fn
    for fn in (
        attn_norm,
        attn_in,
        qkv,
        qkv_bias,
        qk_norm,
        qk_norm_full,
        v_norm,
        rope,
        scale_q,
        kv_store,
        attention,
        out_proj,
        out_proj_post_norm,
        out_proj_bias,
        out_rows,
        ffn_norm,
        ffn_in,
        ffn_post_attn_norm,
        ffn_swiglu,
        ffn_geglu,
        ffn_down,
        ffn_down_post_norm,
        ffn_router,
        ffn_moe,
        ffn_moe_keep,
        ffn_shexp_gate,
        ffn_shexp_down,
        mla_q,
        mla_kv,
        mla_absorb,
        mla_attention,
        mla_out,
        ffn_shexp_in,
        ffn_shexp_add,
        q_gate,
        attn_gate,
        delta_net_in,
        delta_net_conv,
        delta_net_rule,
        delta_net_in_grouped,
        delta_net_conv_grouped,
        delta_net_rule_grouped,
        delta_net_out,
        shortconv_in,
        shortconv_conv,
        shortconv_out,
        mamba2_in,
        mamba2_conv,
        mamba2_scan,
        mamba2_out,
        layer_scale,
        ple_inputs,
        ple_residual,
        ffn_router_in,
        ffn_pre_norm_2,
        ffn_down_post_norms,
        im_qkv_in,
        im_qkv_x,
        im_out_in,
        im_ffn_in,
        im_ffn_x,
        im_down_in,
        im_moe,
    )
}
