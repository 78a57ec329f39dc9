"""The ``bert`` architecture (BERT, MiniLM, bge ...): an encoder for embeddings.

As llama.cpp's ``llm_build_bert``: input = token embedding + token-type row 0 + absolute
position embedding, LayerNorm'd; each block is non-causal multi-head attention within the
token's sequence (Q/K/V/output with biases) then ``x = LN(x + attn)``, and a GELU feed-forward
``x = LN(x + down(gelu(up(x))))``. The result (no final norm) is the per-token embedding.

The model keeps no KV cache: :meth:`BertModel.encode` takes all tokens of the sequences at
once (llama.cpp requires ``n_ubatch >= n_tokens`` for non-causal models).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ModelError
from ..gguf import GGUFModelFile
from ..hparams import HParams
from ..ops import traits
from ..ops.attention import TILE
from ..ops.gelu import GELU_TABLE, gelu
from ..ops.matmul import act_need, format_mask, new_acts, prepare_acts
from ..ops.norm import layer_norm
from ..ops.rope import RopeParams
from ..quants import dequantize
from . import bert_kernel
from .backend import CPU, Backend, backend
from .common import RopeOverrides
from .rank_head import RankHead, load_rank_head
from .weights import Matrix, TensorSource, Vector, WeightStore

_F32 = np.float32


@dataclass(frozen=True)
class BertBlock:
    attn_q: Matrix
    attn_q_b: Vector
    attn_k: Matrix
    attn_k_b: Vector
    attn_v: Matrix
    attn_v_b: Vector
    attn_output: Matrix
    attn_output_b: Vector
    attn_output_norm: Vector
    attn_output_norm_b: Vector
    ffn_up: Matrix
    ffn_up_b: Vector
    ffn_down: Matrix
    ffn_down_b: Vector
    layer_output_norm: Vector
    layer_output_norm_b: Vector


def _pad16(n: int) -> int:
    return -(-n // 16) * 16


class BertWorkspace:
    """Scratch buffers of one context, grown to the largest batch seen."""

    def __init__(self, model: BertModel, n_tokens: int, n_threads: int) -> None:
        self.model = model
        self.n_threads = n_threads
        self.acts_private: tuple = ()
        d, nt, tile = model.hparams.n_embd_head_k, n_threads, TILE
        z = np.zeros
        self.thread = (
            z((nt, d), _F32),  # query in the K dot type
            z((nt, d), np.int32),  # (query quantized: unused with an f16 K)
            z((nt, d), _F32),  # V row
            z((nt, d), _F32),  # accumulator
            z((nt, d, tile), _F32),  # K tile (transposed)
            z((nt, tile, d), _F32),  # V tile
            z((nt, 2 * tile), _F32),  # tile scores of two query rows
            z((nt, 128), _F32),  # softmax states of a block (64 tokens)
        )
        self._alloc(n_tokens)

    def _alloc(self, n: int) -> None:
        hp = self.model.hparams
        e, f = hp.n_embd, hp.n_ff
        kmax = max(e, f)
        self.n_tokens = n
        self.x = np.zeros((n, _pad16(e)), _F32)
        self.h = np.zeros((n, _pad16(e)), _F32)
        self.q = np.zeros((n, _pad16(e)), _F32)
        self.k = np.zeros((n, _pad16(e)), _F32)
        self.v = np.zeros((n, _pad16(e)), _F32)
        self.ff = np.zeros((n, _pad16(f)), _F32)
        self.acts = new_acts(n, kmax)

    def ensure(self, n: int) -> None:
        if n > self.n_tokens:
            self._alloc(n)


class BertModel:
    """A loaded bert encoder; see the module docstring."""

    arch = "bert"
    causal = False

    def __init__(
        self,
        hparams: HParams,
        norm_eps: float,
        pooling_type: int | None,
        store: WeightStore,
        token_embd: Matrix,
        pos_embd: np.ndarray,
        type_embd: np.ndarray | None,
        tok_norm: tuple[Vector, Vector],
        blk: list[BertBlock],
    ) -> None:
        self.hparams = hparams
        self.norm_eps = norm_eps
        self.pooling_type = pooling_type
        self.store = store
        self.token_embd = token_embd
        self.pos_embd = pos_embd  # float32 [n_ctx_train, n_embd]
        self.type_embd = type_embd  # float32 [n_token_types, n_embd] or None
        self.tok_norm = tok_norm
        self.blk = blk
        self.rank_head: RankHead | None = None  # a reranker's classifier (rank pooling)
        # a rope the engine's cache shifts can be given (unused: no positions are rotated)
        d = hparams.n_embd_head_k
        self.rope = RopeParams(n_rot=d, n_ctx_orig=hparams.n_ctx_train)
        self.freqs_arr = np.zeros(0, _F32)
        self.fmask = format_mask(store.types)
        self.backend: Backend = CPU

    # ------------------------------------------------------------------ loading
    @classmethod
    def load(
        cls,
        mf: GGUFModelFile,
        source: TensorSource,
        rope: RopeOverrides | None = None,
        on: Backend | str | None = None,
    ) -> BertModel:
        """Check and read a bert file; its matrices are placed on backend ``on`` (the
        encoder itself runs op by op on the CPU)."""
        be = backend(on)
        hp, eps, pooling = _hparams(mf)
        t = _tensor_getter(mf)
        if mf.has_tensor("blk.0.attn_qkv.weight"):
            raise ModelError(
                "tensor 'blk.0.attn_qkv.weight': fused QKV bert files are not supported"
            )
        n_embd = hp.n_embd
        store = WeightStore()
        token_embd = store.matrix(t("token_embd.weight", (n_embd, hp.n_vocab)))
        info = t("position_embd.weight", (n_embd, hp.n_ctx_train))
        pos_embd = np.ascontiguousarray(
            dequantize(source.raw(info), info.type, info.np_shape), _F32
        )
        type_embd = None
        if mf.has_tensor("token_types.weight"):
            info = mf.tensor("token_types.weight")
            if len(info.shape) != 2 or info.shape[0] != n_embd:
                raise ModelError(f"tensor 'token_types.weight' has shape {tuple(info.shape)}")
            type_embd = np.ascontiguousarray(
                dequantize(source.raw(info), info.type, info.np_shape), _F32
            )
        tok_norm = (
            store.vector(t("token_embd_norm.weight", (n_embd,))),
            store.vector(t("token_embd_norm.bias", (n_embd,))),
        )
        blk = [_block(store, t, f"blk.{i}.", n_embd, hp.n_ff) for i in range(hp.n_layer)]
        be.place_weights(store, source)
        model = cls(hp, eps, pooling, store, token_embd, pos_embd, type_embd, tok_norm, blk)
        model.rank_head = load_rank_head(mf, source, "bert", n_embd)
        model.backend = be
        return model

    def use_all_kernels(self) -> None:
        self.fmask = format_mask(traits.supported_types())

    # ------------------------------------------------------------------ running
    def workspace(self, n_tokens: int, n_threads: int) -> BertWorkspace:
        return self.backend.workspace(BertWorkspace, self, n_tokens, n_threads)

    def forward(self, *args, **kwargs):
        raise ModelError(
            "bert is an encoder: it produces embeddings, not logits "
            "(create the context with embeddings=True)"
        )

    def _v(self, v: Vector) -> np.ndarray:
        return self.store.fbuf[v.offset : v.offset + v.size]

    def _linear(self, ws: BertWorkspace, x: np.ndarray, n: int, m: Matrix, b: Vector, out, nth):
        st = self.store
        prepare_acts(x, 0, n, m.ncols, act_need([m.type]), ws.acts)
        bert_kernel.linear(self.fmask, nth, st.buf, st.desc[m.index], ws.acts, n, out)
        out[:n, : m.nrows] += self._v(b)

    def encode(
        self,
        ws: BertWorkspace,
        tokens: np.ndarray,
        pos: np.ndarray,
        seq: np.ndarray,
        n_threads: int,
    ) -> np.ndarray:
        """Per-token output embeddings ``[n, n_embd]`` (a view into ``ws``); a token attends
        to every token with the same ``seq`` id."""
        hp = self.hparams
        n, e, f = len(tokens), hp.n_embd, hp.n_ff
        H, d = hp.n_head, hp.n_embd_head_k
        if n == 0:
            return np.zeros((0, e), _F32)
        if int(pos.min()) < 0 or int(pos.max()) >= hp.n_ctx_train:
            raise ModelError(
                f"bert positions must be in 0..{hp.n_ctx_train - 1} (the model's context_length)"
            )
        ws.ensure(n)
        eps = _F32(self.norm_eps)
        x, h, q, k, v, ff = ws.x, ws.h, ws.q, ws.k, ws.v, ws.ff
        st, te = self.store, self.token_embd
        bert_kernel.gather_rows(
            st.buf, st.desc[te.index, 1], st.desc[te.index, 0], e, tokens.astype(np.int64), h
        )
        # token types are "sentence A" (llama.cpp); ggml adds the type row, then positions
        if self.type_embd is not None:
            h[:n, :e] += self.type_embd[0]
        h[:n, :e] = self.pos_embd[pos] + h[:n, :e]
        layer_norm(h, 0, n, e, self._v(self.tok_norm[0]), self._v(self.tok_norm[1]), eps, x)
        # sequences attend only within themselves
        seq = np.asarray(seq)
        mask = np.ascontiguousarray(seq[:, None] == seq[None, :], np.uint8)  # [n, n_kv = n]
        kc = np.empty(H * n * 2 * d, np.uint8)  # K and V of this batch in f16, [head, cell]
        vc = np.empty(H * n * 2 * d, np.uint8)
        scale = _F32(1.0) / np.sqrt(_F32(d))
        for b in self.blk:
            self._linear(ws, x, n, b.attn_q, b.attn_q_b, q, n_threads)
            self._linear(ws, x, n, b.attn_k, b.attn_k_b, k, n_threads)
            self._linear(ws, x, n, b.attn_v, b.attn_v_b, v, n_threads)
            bert_kernel.attention(n_threads, n, H, d, scale, q, k, v, mask, h, kc, vc, ws.thread)
            self._linear(ws, h, n, b.attn_output, b.attn_output_b, q, n_threads)
            q[:n, :e] += x[:n, :e]
            layer_norm(
                q, 0, n, e, self._v(b.attn_output_norm), self._v(b.attn_output_norm_b), eps, h
            )
            self._linear(ws, h, n, b.ffn_up, b.ffn_up_b, ff, n_threads)
            gelu(ff, 0, n, f, GELU_TABLE, ff)
            self._linear(ws, ff, n, b.ffn_down, b.ffn_down_b, q, n_threads)
            q[:n, :e] += h[:n, :e]
            layer_norm(
                q, 0, n, e, self._v(b.layer_output_norm), self._v(b.layer_output_norm_b), eps, x
            )
        return x[:n, :e]


MODEL = BertModel


def _hparams(mf: GGUFModelFile) -> tuple[HParams, float, int | None]:
    """(hyper-parameters, layer-norm epsilon, pooling type) of a bert file, checked."""
    md, a = mf.metadata, "bert"

    def key_int(name: str, default: int | None = None) -> int:
        v = md.get(f"{a}.{name}", default)
        if not isinstance(v, int | np.integer) or isinstance(v, bool) or v < 1:
            raise ModelError(f"metadata key '{a}.{name}' must be a positive integer, got {v!r}")
        return int(v)

    n_embd = key_int("embedding_length")
    n_head = key_int("attention.head_count")
    n_layer = key_int("block_count")
    n_ff = key_int("feed_forward_length")
    n_ctx_train = key_int("context_length")
    if md.get(f"{a}.attention.head_count_kv", n_head) != n_head:
        raise ModelError(
            f"bert needs head_count_kv == head_count (key {a}.attention.head_count_kv)"
        )
    if n_embd % n_head:
        raise ModelError(f"embedding_length ({n_embd}) is not a multiple of head_count ({n_head})")
    eps = md.get(f"{a}.attention.layer_norm_epsilon")
    if not isinstance(eps, float | int) or eps < 0:
        raise ModelError(f"metadata key '{a}.attention.layer_norm_epsilon' is missing or invalid")
    if not mf.has_tensor("token_embd.weight"):
        raise ModelError("tensor 'token_embd.weight' is missing (required by bert)")
    d = n_embd // n_head
    if d % 16:
        raise ModelError(f"unsupported shape: head size {d} must be a multiple of 16")
    if n_embd % 32 or n_ff % 32:
        raise ModelError(
            f"unsupported shape: n_embd ({n_embd}) and n_ff ({n_ff}) must be multiples of 32"
        )
    hp = HParams(
        arch=a,
        n_vocab=int(mf.tensor("token_embd.weight").shape[1]),
        n_ctx_train=n_ctx_train,
        n_embd=n_embd,
        n_layer=n_layer,
        n_ff=n_ff,
        n_head=n_head,
        n_head_kv=n_head,
        n_embd_head_k=d,
        n_embd_head_v=d,
        n_rot=d,
        rope_freq_base=10000.0,
        rope_freq_scale=1.0,
        norm_rms_eps=float(eps),
        n_swa=0,
    )
    pooling = md.get(f"{a}.pooling_type")
    return hp, float(eps), int(pooling) if isinstance(pooling, int | np.integer) else None


def _tensor_getter(mf: GGUFModelFile):
    """``t(name, shape)``: the tensor's info, or a :class:`ModelError` if it is missing or
    has another shape."""

    def t(name: str, shape: tuple[int, ...]):
        if not mf.has_tensor(name):
            raise ModelError(f"tensor {name!r} is missing (required by bert)")
        info = mf.tensor(name)
        if tuple(info.shape) != shape:
            raise ModelError(f"tensor {name!r} has shape {tuple(info.shape)}, expected {shape}")
        return info

    return t


def _block(store: WeightStore, t, p: str, e: int, f: int) -> BertBlock:
    """The tensors of the layer whose names start with ``p`` (``blk.N.``)."""

    def mat(n: str, shape: tuple[int, int]) -> Matrix:
        return store.matrix(t(p + n + ".weight", shape))

    def bias(n: str, size: int, kind: str = ".bias") -> Vector:
        return store.vector(t(p + n + kind, (size,)))

    return BertBlock(
        attn_q=mat("attn_q", (e, e)),
        attn_q_b=bias("attn_q", e),
        attn_k=mat("attn_k", (e, e)),
        attn_k_b=bias("attn_k", e),
        attn_v=mat("attn_v", (e, e)),
        attn_v_b=bias("attn_v", e),
        attn_output=mat("attn_output", (e, e)),
        attn_output_b=bias("attn_output", e),
        attn_output_norm=bias("attn_output_norm", e, ".weight"),
        attn_output_norm_b=bias("attn_output_norm", e),
        ffn_up=mat("ffn_up", (e, f)),
        ffn_up_b=bias("ffn_up", f),
        ffn_down=mat("ffn_down", (f, e)),
        ffn_down_b=bias("ffn_down", e),
        layer_output_norm=bias("layer_output_norm", e, ".weight"),
        layer_output_norm_b=bias("layer_output_norm", e),
    )
