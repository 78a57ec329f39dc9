"""The numpy specification of Qwen3.5's Gated DeltaNet layer and of the ``qwen35`` forward
(llama.cpp's ``src/models/qwen35.cpp`` and ``delta-net-base.cpp`` with ggml's CPU ops).

A Gated DeltaNet layer, per token ``t`` of sequence state row ``r``:

* in-projections of the normed input: ``qkv = h . attn_qkv`` (the convolution's channels:
  keys of the queries, keys, values), the output gate ``z = h . attn_gate``,
  ``beta = sigmoid(h . ssm_beta)`` and the decay ``g = softplus(h . ssm_alpha + ssm_dt) *
  ssm_a`` (``ssm_a`` = -exp(A_log)), one per value head;
* the short causal convolution over the last ``d_conv`` inputs of each channel (the
  previous ``d_conv - 1`` held in the conv state row ``[channel, tap]``), then SiLU;
* q and k L2-normed per head (ggml: ``rms_norm(x, eps / n) / sqrt(n)``);
* the gated delta rule on the state ``S`` of each value head (``[S_v, S_k]``, key heads
  broadcast tiled: value head ``h`` reads key head ``h % H_k`` as ggml does):
  ``S *= exp(g)``, ``d = (v - S k) * beta``, ``S += d k^T``, ``o = S q / sqrt(S_v)``;
* the gated RMS norm ``rms_norm(o) * ssm_norm * silu(z)`` per head and ``ssm_out``.

Every fourth layer is full attention whose ``attn_q`` rows give, per head, the query and
an output gate: Q/K RMS norms, neox rope over the first ``n_rot`` dimensions (qwen35's
interleaved multi-section rope with one position for every section), attention over the
KV cache, ``att * sigmoid(gate)``, ``attn_output``. Every layer then adds the post-attention
normed SwiGLU FFN. States and the KV cache are the arrays of the engine's hybrid memory
(``forward_arrays``), so the forward continues sequences as the engine keeps them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ModelError
from ..gguf import GGUFReader
from ..ops.activations import silu_numpy, swiglu_numpy
from ..ops.attention_ref import attention_numpy, load_rows_numpy, store_row_numpy
from ..ops.matmul import matmul_numpy
from ..ops.norm import rms_norm_numpy
from ..ops.rope import RopeParams, rope_numpy
from ..quants import dequantize

_F32 = np.float32
ARCH = "qwen35"


def sigmoid_numpy(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, _F32)
    return (_F32(1.0) / (_F32(1.0) + np.exp(-x))).astype(_F32)


def softplus_numpy(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, _F32)
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20)))).astype(_F32)


def l2_norm_numpy(x: np.ndarray, eps: float) -> np.ndarray:
    """ggml's ``rms_norm(x, eps / n) * (1 / sqrt(n))`` over the last axis."""
    n = x.shape[-1]
    y = rms_norm_numpy(x, np.ones(n, _F32), _F32(eps) / _F32(n))
    return (y * (_F32(1.0) / np.sqrt(_F32(n)))).astype(_F32)


def conv1d_step(state: np.ndarray, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """One token through the causal convolution: ``state`` [channels, d_conv - 1] (updated
    in place), ``x`` [channels], ``w`` [channels, d_conv]; returns the channels' sums."""
    window = np.concatenate([state, x[:, None]], axis=1).astype(_F32)
    out = np.zeros(len(x), _F32)
    for i in range(w.shape[1]):  # ggml sums the taps in order, in float
        out = (out + window[:, i] * w[:, i]).astype(_F32)
    state[:] = window[:, 1:]
    return out


def delta_rule_step(S, q, k, v, g, beta) -> np.ndarray:
    """One token of the gated delta rule on the states ``S`` [H_v, S_v, S_k] (updated in
    place): ``q``/``k`` [H_k, S_k], ``v`` [H_v, S_v], ``g``/``beta`` [H_v]; returns the
    output [H_v, S_v]."""
    h_v, s_v, _ = S.shape
    kh = np.arange(h_v) % q.shape[0]  # tiled broadcast of the key heads
    qq, kk = q[kh], k[kh]
    S *= np.exp(g.astype(_F32))[:, None, None]
    d = (v - np.einsum("hji,hi->hj", S, kk, dtype=_F32)) * beta[:, None]
    S += d[:, :, None] * kk[:, None, :]
    scale = _F32(1.0) / np.sqrt(_F32(s_v))
    return (np.einsum("hji,hi->hj", S, qq, dtype=_F32) * scale).astype(_F32)


@dataclass
class Shape:
    """The hyper-parameters the forward uses (``{arch}.*`` keys, named in errors)."""

    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_rot: int
    eps: float
    freq_base: float
    d_conv: int
    d_state: int
    n_group: int
    dt_rank: int
    d_inner: int
    interval: int

    @classmethod
    def from_metadata(cls, md: dict) -> Shape:
        def key(name: str, default=None):
            v = md.get(f"{ARCH}.{name}", default)
            if v is None:
                raise ModelError(f"{ARCH}: missing hyper-parameter {ARCH}.{name}")
            return v

        n_embd, n_head = int(key("embedding_length")), int(key("attention.head_count"))
        return cls(
            n_embd, int(key("block_count")), n_head, int(key("attention.head_count_kv")),
            int(key("attention.key_length", n_embd // n_head)),
            int(key("rope.dimension_count")), float(key("attention.layer_norm_rms_epsilon")),
            float(key("rope.freq_base", 10000.0)), int(key("ssm.conv_kernel")),
            int(key("ssm.state_size")), int(key("ssm.group_count")),
            int(key("ssm.time_step_rank")), int(key("ssm.inner_size")),
            int(key("full_attention_interval", 4)),
        )  # fmt: skip

    def recurrent(self, il: int) -> bool:
        return (il + 1) % self.interval != 0

    @property
    def conv_channels(self) -> int:
        return self.d_inner + 2 * self.n_group * self.d_state

    @property
    def conv_size(self) -> int:
        """Floats of one layer's conv state row."""
        return (self.d_conv - 1) * self.conv_channels

    @property
    def ssm_size(self) -> int:
        """Floats of one layer's delta-rule state row."""
        return self.dt_rank * (self.d_inner // self.dt_rank) * self.d_state


class Qwen35Reference:
    """The numpy forward of a ``qwen35`` file (see the module docstring); weights are
    dequantized once, activations quantized as each weight's format consumes them."""

    def __init__(self, path) -> None:
        self.reader = GGUFReader(path)
        md = self.reader.metadata
        if md.get("general.architecture") != ARCH:
            raise ModelError(f"not a {ARCH} file: {md.get('general.architecture')!r}")
        self.s = Shape.from_metadata(md)
        self._w: dict[str, tuple[int, np.ndarray]] = {}
        self.rope = RopeParams(
            n_rot=self.s.n_rot, neox=True, freq_base=self.s.freq_base,
            n_ctx_orig=int(md.get(f"{ARCH}.context_length", 0)),
        )  # fmt: skip

    def t(self, name: str) -> tuple[int, np.ndarray]:
        """Tensor ``name``: its ggml type and its values ``[rows, cols]`` (a vector 1-D)."""
        if name not in self._w:
            try:
                ti = self.reader.tensor(name)
            except KeyError:
                raise ModelError(f"{ARCH}: missing tensor {name}") from None
            self._w[name] = (int(ti.type), dequantize(ti, shape=ti.np_shape))
        return self._w[name]

    def vec(self, name: str) -> np.ndarray:
        return self.t(name)[1].reshape(-1)

    def mm(self, name: str, x: np.ndarray) -> np.ndarray:
        typ, w = self.t(name)
        return matmul_numpy(None, typ, w.shape[0], w.shape[1], x, w)

    def norm(self, x: np.ndarray, name: str) -> np.ndarray:
        return rms_norm_numpy(x, self.vec(name), self.s.eps)

    # ------------------------------------------------------------------ layers
    def delta_net(self, p: str, h, rows, conv_state, ssm_state) -> np.ndarray:
        """A Gated DeltaNet layer on ``h`` [n, n_embd]; ``conv_state`` [seqs, conv_size] and
        ``ssm_state`` [seqs, ssm_size] are this layer's rows (updated in place)."""
        s = self.s
        kd, hv, sv = s.n_group * s.d_state, s.dt_rank, s.d_inner // s.dt_rank
        qkv, z = self.mm(p + "attn_qkv.weight", h), self.mm(p + "attn_gate.weight", h)
        beta = sigmoid_numpy(self.mm(p + "ssm_beta.weight", h))
        alpha = self.mm(p + "ssm_alpha.weight", h) + self.vec(p + "ssm_dt.bias")
        g = (softplus_numpy(alpha) * self.vec(p + "ssm_a")).astype(_F32)
        w = self.t(p + "ssm_conv1d.weight")[1].reshape(s.conv_channels, s.d_conv)
        out = np.zeros((len(h), hv, sv), _F32)
        for t, r in enumerate(rows):
            cs = conv_state[r].reshape(s.conv_channels, s.d_conv - 1)
            c = silu_numpy(conv1d_step(cs, qkv[t], w))
            q = l2_norm_numpy(c[:kd].reshape(s.n_group, s.d_state), s.eps)
            k = l2_norm_numpy(c[kd : 2 * kd].reshape(s.n_group, s.d_state), s.eps)
            S = ssm_state[r].reshape(hv, sv, s.d_state)
            out[t] = delta_rule_step(S, q, k, c[2 * kd :].reshape(hv, sv), g[t], beta[t])
        o = rms_norm_numpy(out, self.vec(p + "ssm_norm.weight"), s.eps)
        o = o * silu_numpy(z.reshape(len(h), hv, sv))
        return self.mm(p + "ssm_out.weight", o.reshape(len(h), -1).astype(_F32))

    def attention(self, p: str, h, pos, cells, mask, kc, vc, kv_types) -> np.ndarray:
        """A gated full-attention layer; ``kc``/``vc`` [n_head_kv, cells, row bytes] are this
        layer's cache (the ubatch's keys and values are stored at ``cells``)."""
        s, n = self.s, len(h)
        hd = s.head_dim
        qg = self.mm(p + "attn_q.weight", h).reshape(n, s.n_head, 2 * hd)
        q = rms_norm_numpy(qg[:, :, :hd], self.vec(p + "attn_q_norm.weight"), s.eps)
        gate = qg[:, :, hd:].reshape(n, -1)
        k = self.mm(p + "attn_k.weight", h).reshape(n, s.n_head_kv, hd)
        k = rms_norm_numpy(k, self.vec(p + "attn_k_norm.weight"), s.eps)
        v = self.mm(p + "attn_v.weight", h).reshape(n, s.n_head_kv, hd)
        q, k = rope_numpy(q, pos, self.rope), rope_numpy(k, pos, self.rope)
        kt, vt = kv_types
        for t, c in enumerate(cells):
            for j in range(s.n_head_kv):
                store_row_numpy(kc[j, c], k[t, j], kt)
                store_row_numpy(vc[j, c], v[t, j], vt)
        n_kv = mask.shape[1]
        keys = np.stack([load_rows_numpy(kc[j, :n_kv], hd, kt) for j in range(s.n_head_kv)])
        vals = np.stack([load_rows_numpy(vc[j, :n_kv], hd, vt) for j in range(s.n_head_kv)])
        scale = _F32(1.0) / np.sqrt(_F32(hd))
        att = attention_numpy(q, keys, vals, mask, kt, vt, 0, 1, scale).reshape(n, -1)
        return self.mm(p + "attn_output.weight", (att * sigmoid_numpy(gate)).astype(_F32))

    # ------------------------------------------------------------------ forward
    def forward(self, tokens, pos, rows, cells, mask, out_idx, arrays) -> np.ndarray:
        """Logits ``[len(out_idx), n_vocab]`` of one ubatch: ``rows`` each token's state row,
        ``cells``/``mask`` its KV cells and attention mask, ``arrays`` the hybrid memory's
        ``forward_arrays()`` (updated: K/V rows stored, states advanced)."""
        s = self.s
        k, v, conv, ssm, info = arrays
        kt, vt, rowb, n_ctx, _, n_rec, n_seq, conv_size, ssm_size = (int(x) for x in info)
        if (conv_size, ssm_size) != (s.conv_size, s.ssm_size):
            raise ModelError(
                f"{ARCH}: the memory's state rows ({conv_size}, {ssm_size}) do not match the "
                f"model's ({s.conv_size}, {s.ssm_size})"
            )
        kc, vc = (a.reshape(-1, s.n_head_kv, n_ctx, rowb) for a in (k, v))
        conv = conv.view(_F32).reshape(n_rec, n_seq, conv_size)
        ssm = ssm.view(_F32).reshape(n_rec, n_seq, ssm_size)
        x = self.t("token_embd.weight")[1][np.asarray(tokens)].astype(_F32)
        i_rec = i_att = 0
        for il in range(s.n_layer):
            p = f"blk.{il}."
            h = self.norm(x, p + "attn_norm.weight")
            if s.recurrent(il):
                y = self.delta_net(p, h, rows, conv[i_rec], ssm[i_rec])
                i_rec += 1
            else:
                y = self.attention(p, h, pos, cells, mask, kc[i_att], vc[i_att], (kt, vt))
                i_att += 1
            x = (x + y).astype(_F32)
            h = self.norm(x, p + "post_attention_norm.weight")
            g = swiglu_numpy(self.mm(p + "ffn_gate.weight", h), self.mm(p + "ffn_up.weight", h))
            x = (x + self.mm(p + "ffn_down.weight", g)).astype(_F32)
        x = self.norm(x[np.asarray(out_idx)], "output_norm.weight")
        return self.mm("output.weight", x)
