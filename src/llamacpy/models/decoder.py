"""The decoder every llama-like architecture module declares itself as.

An architecture is a :class:`Decoder` subclass that reads as the model (see ``llama.py``,
``qwen3.py``): its tensors (:mod:`.spec` declarations), its extra hyper-parameters, its
block as a tuple of stage names (:mod:`.stages`), its rope kind and a few numeric choices
(attention scales, embedding scale, which layers use a sliding window or no rope). This
module turns the declarations into a loaded model: it checks the file against them, reads
and repacks the weights into the layer table the compiled forward reads by field name, and
runs the forward :mod:`.compose` builds from the block.

The model owns no sequence state: :meth:`Decoder.forward` gets the ubatch, the attention
plan (which cache cells each token writes and may see) and the KV cache from the engine, and
a :class:`Workspace` of scratch buffers it allocated with :meth:`Decoder.workspace`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from ..errors import ModelError
from ..gguf import GGMLType, GGUFModelFile, TensorInfo
from ..hparams import HParams
from ..ops import traits
from ..ops.attention import TILE
from ..ops.matmul import FormatSet, act_need, format_mask, new_acts
from ..ops.rope import RopeParams
from ..ops.threads import new_barrier
from . import stages
from .backend import Backend, backend
from .common import RopeOverrides, UBatchArrays, lazy_zeros, rope_params
from .imatrix import ImatrixSums, collecting_block
from .rank_head import load_rank_head
from .spec import Fused, Param, Tensor, check_tensors, read_hparams, shape_of
from .weights import Experts, Matrix, TensorSource, Vector, WeightStore, row_slice

# The tensors of a llama block, and of the model around the blocks.
LLAMA_TENSORS: tuple[Tensor | Fused, ...] = (
    Tensor("token_embd.weight", ("n_embd", "n_vocab")),
    Tensor("output_norm.weight", ("n_embd",)),
    Tensor("output.weight", ("n_embd", "n_vocab"), optional=True),  # absent: tied to token_embd
    Tensor("rope_freqs.weight", ("n_rot/2",), optional=True, raw=True),  # llama3 rope factors
    Tensor("blk.{i}.attn_norm.weight", ("n_embd",)),
    Tensor("blk.{i}.attn_q.weight", ("n_embd", "n_embd_q")),
    Tensor("blk.{i}.attn_k.weight", ("n_embd", "n_embd_k_gqa")),
    Tensor("blk.{i}.attn_v.weight", ("n_embd", "n_embd_v_gqa")),
    Tensor("blk.{i}.attn_output.weight", ("n_embd_o", "n_embd")),
    Tensor("blk.{i}.ffn_norm.weight", ("n_embd",)),
    Tensor("blk.{i}.ffn_gate.weight", ("n_embd", "n_ff")),
    Tensor("blk.{i}.ffn_up.weight", ("n_embd", "n_ff")),
    Tensor("blk.{i}.ffn_down.weight", ("n_ff", "n_embd")),
)
QK_NORM_TENSORS = (
    Tensor("blk.{i}.attn_q_norm.weight", ("n_embd_head_k",)),
    Tensor("blk.{i}.attn_k_norm.weight", ("n_embd_head_k",)),
)
# The llama block: pre-norm attention and a SwiGLU feed-forward, each added to the residual.
LLAMA_BLOCK = (
    "attn_norm",  # h = rms_norm(x) * attn_norm
    "qkv",  # q, k, v = h . attn_q, attn_k, attn_v
    "rope",  # rotate q, k by position
    "kv_store",  # k, v -> the cache cells of the tokens
    "attention",  # att = softmax(q . K^T * scale + mask) . V
    "out_proj",  # x += att . attn_output
    "out_rows",  # last layer: keep the rows whose logits are wanted
    "ffn_norm",  # h = rms_norm(x) * ffn_norm
    "ffn_swiglu",  # g = silu(h . ffn_gate) * (h . ffn_up)
    "ffn_down",  # x += g . ffn_down
)


# Tensors of llama-like variants that a plain llama block does not run.
BIASES = ("attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias")


def after(block: tuple[str, ...], stage: str, *new: str) -> tuple[str, ...]:
    """``block`` with the stages ``new`` inserted right after ``stage``."""
    i = block.index(stage) + 1
    return block[:i] + new + block[i:]


class Layer:
    """One block's weights: an attribute per declared tensor (None when absent)."""

    def __init__(self, fields: Mapping[str, Any]) -> None:
        self.__dict__.update(fields)

    def __getattr__(self, name: str) -> None:  # undeclared tensors: absent
        if name.startswith("__"):
            raise AttributeError(name)
        return None


class Decoder:
    """A loaded llama-like model; subclasses declare an architecture (class attributes)."""

    arch: ClassVar[str] = ""
    tensors: ClassVar[tuple[Tensor | Fused, ...]] = LLAMA_TENSORS
    params: ClassVar[tuple[Param, ...]] = ()
    unsupported: ClassVar[tuple[str, ...]] = ()  # tensor name endings of variants refused
    rank_softmax: ClassVar[bool] = False  # a reranker's scores go through a softmax
    block: ClassVar[tuple[str, ...]] = LLAMA_BLOCK
    rope_neox: ClassVar[bool] = False
    partial_rope: ClassVar[bool] = False  # rope may rotate only the first n_rot dimensions
    # mixture of experts (models/moe.py): the selected experts' router probabilities are
    # divided by their sum (llama.cpp's norm_w), then multiplied by the scale (0: none)
    expert_weights_norm: ClassVar[bool] = False
    expert_weights_scale: ClassVar[float] = 0.0
    expert_gating: ClassVar[int] = stages.GATING_SOFTMAX  # router logits -> weights
    expert_act: ClassVar[int] = stages.ACT_SWIGLU  # the experts' activation
    # attention.head_count_kv may give 0 for the layers without attention (hybrids)
    per_layer_kv_heads: ClassVar[bool] = False
    # attention layers may have KV head counts, FFN sizes of their own (gemma4; see
    # layer_hparams)
    varying_kv_heads: ClassVar[bool] = False
    per_layer_ff: ClassVar[bool] = False
    # False: no attention at all (mamba2: attention.head_count 0, the attention sizes 0)
    has_attention: ClassVar[bool] = True

    # ------------------------------------------------------------------ numeric choices
    def attention_scales(self) -> tuple[float, float]:
        """(scale of the K.Q scores, scale applied to the roped queries by ``scale_q``)."""
        return float(np.float32(1.0) / np.sqrt(np.float32(self.hparams.n_embd_head_k))), 1.0

    def embd_scale(self) -> float:
        """Token embeddings are multiplied by this."""
        return 1.0

    def residual_scale(self) -> float:
        """A block's outputs are multiplied by this before they join the residual (granite)."""
        return 1.0

    def logit_scale(self) -> float:
        """Logits are multiplied by this (granite: 1 / its logit scale)."""
        return 1.0

    def logit_softcap(self) -> float:
        """Logits -> c * tanh(logits / c) when c > 0."""
        return 0.0

    def attn_logit_softcap(self) -> float:
        """Attention scores -> c * tanh(scores / c) when c > 0."""
        return 0.0

    def swa_layers(self, md: Mapping[str, Any]) -> tuple[bool, ...]:
        """Per layer: attends through the sliding window (``n_swa``)."""
        return (False,) * self.hparams.n_layer

    def layer_recurrent(self, il: int) -> bool:
        """Whether layer ``il`` is recurrent (a state per sequence instead of KV cells)."""
        return False

    def layer_rope(self, il: int) -> bool:
        """Whether layer ``il`` rotates its queries and keys."""
        return True

    def rope_swa_params(self, md: Mapping[str, Any], rope: RopeParams) -> RopeParams:
        """The rope of the sliding-window layers."""
        return rope

    def rope_factors(self, n_ctx: int) -> np.ndarray:
        """The rope frequency factors of a context of ``n_ctx`` cells (empty: none)."""
        return self.freqs_arr

    def kv_source(self, il: int) -> int:
        """The layer whose KV cache layer ``il`` attends (itself, unless it reuses an earlier
        layer's keys and values: gemma4's shared KV layers)."""
        return il

    @classmethod
    def layer_hparams(cls, hp: HParams, il: int) -> HParams:
        """The hyper-parameters of layer ``il`` (its head sizes, KV heads, rope dimensions,
        FFN size), when they are not the model's (gemma4's local and global layers): the
        shapes of its tensors and the geometry its stages run with (its row of the model
        table)."""
        return hp

    # ------------------------------------------------------------------ loading
    @classmethod
    def variant(cls, md: Mapping[str, Any]) -> type[Decoder]:
        """The class that runs a file of this architecture (a module may declare variants
        chosen by the file's keys: ``llama`` files with experts run as Mixtral)."""
        return cls

    @classmethod
    def derived(cls, hp: HParams) -> HParams:
        """The hyper-parameters with those the architecture derives from the file's."""
        return hp

    @classmethod
    def with_layers(cls, md: Mapping[str, Any], hp: HParams) -> HParams:
        """The hyper-parameters with what :meth:`layer_hparams` reads from the file's
        per-layer keys (gemma4: which layers are local)."""
        return hp

    @classmethod
    def check(cls, md: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]]) -> HParams:
        """The file's hyper-parameters, after checking its tensors against the declarations
        (before any weight is read)."""
        if cls.variant(md) is not cls:
            return cls.variant(md).check(md, shapes)
        hp = cls.derived(read_hparams(cls.arch, md, shapes, cls.params, cls.has_attention))
        hp = cls.with_layers(md, hp)
        per_layer = hp.extra.get("kv_heads_per_layer")
        varying = per_layer is not None and len({h for h in per_layer if h}) > 1
        if (per_layer is not None and not cls.per_layer_kv_heads) or (
            varying and not cls.varying_kv_heads
        ):
            raise ModelError(
                f"per-layer values {sorted(set(per_layer))} are not supported (key "
                f"'{cls.arch}.attention.head_count_kv')"
            )
        if "ff_per_layer" in hp.extra and not cls.per_layer_ff:
            raise ModelError(
                f"per-layer values {sorted(set(hp.extra['ff_per_layer']))} are not supported "
                f"(key '{cls.arch}.feed_forward_length')"
            )
        if "ff_per_layer" in hp.extra and len(hp.extra["ff_per_layer"]) != hp.n_layer:
            raise ModelError(
                f"'{cls.arch}.feed_forward_length' has {len(hp.extra['ff_per_layer'])} entries "
                f"for {hp.n_layer} layers"
            )
        if per_layer is not None and len(per_layer) != hp.n_layer:
            raise ModelError(
                f"'{cls.arch}.attention.head_count_kv' has {len(per_layer)} entries for "
                f"{hp.n_layer} layers"
            )
        check_tensors(
            cls.arch, hp, cls.tensors, shapes, cls.unsupported, lambda i: cls.layer_hparams(hp, i)
        )
        for lhp in {hp, *(cls.layer_hparams(hp, il) for il in range(hp.n_layer))}:
            cls.check_heads(lhp)
        return hp

    @classmethod
    def check_heads(cls, hp: HParams) -> None:
        """The head sizes the attention stages support."""
        d = hp.n_embd_head_k
        if cls.partial_rope:
            rot_ok, rule = 0 < hp.n_rot <= d and hp.n_rot % 2 == 0, ">= rope dims (even)"
        else:
            rot_ok, rule = hp.n_rot == d, "== rope dims"
        if d != hp.n_embd_head_v or not rot_ok:
            raise ModelError(
                f"{cls.arch} needs head size == value size {rule}, got {d}, "
                f"{hp.n_embd_head_v}, {hp.n_rot}"
            )
        if d % 16 or hp.n_embd % 16 or hp.n_ff % 16:
            raise ModelError(
                f"unsupported shape: head size ({d}), n_embd ({hp.n_embd}) and n_ff "
                f"({hp.n_ff}) must be multiples of 16"
            )

    @classmethod
    def load(
        cls,
        mf: GGUFModelFile,
        source: TensorSource,
        rope: RopeOverrides | None = None,
        on: Backend | str | None = None,
    ) -> Decoder:
        """Check, read and place a model's tensors on backend ``on`` (default: the CPU; see
        :mod:`.weights`, :mod:`.backend`)."""
        if cls.variant(mf.metadata) is not cls:
            return cls.variant(mf.metadata).load(mf, source, rope, on)
        be = backend(on)
        md = mf.metadata
        hp = cls.check(md, {t.name: t.shape for t in mf.tensors})
        store = WeightStore()
        glob = _read(cls.tensors, mf, store, source, hp, None)
        blk = [
            Layer(_read(cls.tensors, mf, store, source, cls.layer_hparams(hp, i), i))
            for i in range(hp.n_layer)
        ]
        for m, _ in store.matrices:
            qk = traits.get(m.type, tensor=m.name).qk
            if m.ncols % qk:
                raise ModelError(
                    f"tensor {m.name!r}: {m.ncols} columns are not a multiple of the "
                    f"{m.type.name} block size {qk}"
                )
        be.place_weights(store, source)
        rp = cls.rope_params(md, hp, rope)
        model = cls(hp, rp, store, glob, blk, md, be)
        # a causal reranker (Qwen3-Reranker): its last token's hidden state to cls.output
        model.rank_head = load_rank_head(mf, source, cls.arch, hp.n_embd, cls.rank_softmax)
        return model

    @classmethod
    def rope_params(
        cls, md: Mapping[str, Any], hp: HParams, ov: RopeOverrides | None
    ) -> RopeParams:
        """The rope of a model + context (llama.cpp's hparams and cparams)."""
        return rope_params(md, cls.arch, hp.n_rot, hp.n_ctx_train, cls.rope_neox, ov)

    def __init__(
        self,
        hparams: HParams,
        rope: RopeParams,
        store: WeightStore,
        glob: Mapping[str, Any],
        blk: list[Layer],
        md: Mapping[str, Any],
        on: Backend | None = None,
    ) -> None:
        be = backend(on)
        self.hparams = hparams
        self.rope = rope
        self.store = store
        self.blk = blk
        self.token_embd: Matrix = glob["token_embd"]
        self.output_norm: Vector = glob["output_norm"]
        self.output: Matrix = glob.get("output") or self.token_embd
        self.rope_freqs: np.ndarray | None = glob.get("rope_freqs")
        self.glob = glob
        swa = self.swa_layers(md)
        self.n_swa = hparams.n_swa if any(swa) else 0
        self.layer_swa = swa
        self.layer_rec = tuple(self.layer_recurrent(il) for il in range(hparams.n_layer))
        # the layers with KV cache rows of their own (the others attend an earlier one's)
        self.kv_layers = tuple(il for il in range(hparams.n_layer) if self.kv_source(il) == il)
        self.kv_layer_swa = tuple(swa[il] for il in self.kv_layers)
        # (KV heads, head size) of the cache of the global layers and of the local ones
        self.kv_geometry = tuple(self._geometry(local) for local in (False, True))
        self.rope_swa = self.rope_swa_params(md, rope)
        self.backend = be
        self.forward_kernel = be.forward_kernel(self.block)
        self.imatrix: ImatrixSums | None = None  # see collect_imatrix
        self._pack()

    def _pack(self) -> None:
        """The tables the compiled forward reads by field name."""
        hp = self.hparams
        self.fmask = format_mask(self.store.types)
        self.fmask_invariant = FormatSet(self.store.types, invariant=True)
        lt = np.full(hp.n_layer, stages.NONE, stages.LAYER_DTYPE)
        for il, b in enumerate(self.blk):
            row = lt[il]
            for name, v in vars(b).items():
                if v is not None and name in stages.LAYER_DTYPE.names:
                    row[name] = v.index if isinstance(v, Matrix | Experts) else v.offset
            for need, fields in NEEDS.items():
                row[need] = _need(b, fields)
            row["swa"] = int(self.layer_swa[il])
            row["recurrent"] = int(self.layer_rec[il])
            row["moe"] = int(getattr(b, "ffn_gate_inp", None) is not None)
            row["rope"] = int(self.layer_rope(il))
            row["index"] = il
            # the layer's place among the layers of its kind: its layer in the memory that
            # holds that kind (engine.iswa: global and sliding-window layers apart;
            # engine.recurrent: attention and recurrent layers apart); a layer reading an
            # earlier layer's KV has that layer's place
            kinds = list(zip(self.layer_swa, self.layer_rec, strict=True))
            src = self.kv_source(il)
            row["kv_index"] = [kinds[j] for j in self.kv_layers if j < src].count(kinds[src])
            row["kv_shared"] = int(src != il)
            row["last"] = int(il == hp.n_layer - 1)
        self.layer_table = lt
        # one row per layer: the model's sizes with the layer's own geometry
        m = np.zeros(max(1, hp.n_layer), stages.MODEL_DTYPE)
        for il in range(len(m)):
            m[il] = self._model_row(self.layer_hparams(hp, il) if hp.n_layer else hp)
        self.model_row = m
        self.rope_arr = np.stack([self.rope.packed(), self.rope_swa.packed()])
        self.freqs_arr = (
            np.zeros(0, np.float32)
            if self.rope_freqs is None
            else np.ascontiguousarray(self.rope_freqs, np.float32)
        )

    def _geometry(self, local: bool) -> tuple[int, int]:
        """(KV heads, head size) of the first layer of that kind with a cache of its own
        (the model's when none)."""
        hp = self.hparams
        il = next((j for j in self.kv_layers if self.layer_swa[j] == local), None)
        lhp = hp if il is None else self.layer_hparams(hp, il)
        return lhp.n_head_kv, lhp.n_embd_head_k

    def _model_row(self, hp: HParams) -> tuple:
        """A row of the model table (``stages.MODEL_DTYPE``) for a layer of geometry ``hp``."""
        kq_scale, q_scale = self.attention_scales()
        return (
            hp.n_embd, hp.n_head, hp.n_head_kv, hp.n_embd_head_k, hp.n_ff, hp.n_vocab,
            hp.n_layer, hp.n_rot, self.token_embd.index, self.output.index,
            self.output_norm.offset, act_need([self.output.type]), hp.extra.get("n_expert", 0),
            hp.extra.get("n_expert_used", 0), hp.extra.get("n_ff_exp", 0),
            int(self.expert_weights_norm), self.expert_gating, self.expert_act,
            *(hp.extra.get(k, 0) for k in SSM_KEYS), hp.norm_rms_eps, kq_scale, q_scale,
            self.embd_scale(), self.logit_softcap(), self.expert_weights_scale,
            self.attn_logit_softcap(), *(hp.extra.get(k, 0) for k in MLA_KEYS),
            self.residual_scale(), self.logit_scale(), *self.model_extra(),
        )  # fmt: skip

    def model_extra(self) -> tuple:
        """The model table's last fields: the per-layer embeddings' sizes and global tensors
        (gemma4; zeros and NONE: none)."""
        return (0, stages.NONE, stages.NONE, stages.NONE, 0)

    @property
    def rope_layers(self) -> list[RopeParams]:
        """The rope of each layer with KV cache rows of its own (what a K-shift re-ropes the
        layer's keys with; a NoPE layer's keys are not moved)."""
        return [
            (self.rope_swa if self.layer_swa[il] else self.rope) if self.layer_rope(il) else None
            for il in self.kv_layers
        ]

    def use_all_kernels(self) -> None:
        """Link every format's matmul kernel into the compiled forward pass (one compiled
        forward for all models, instead of one per set of weight formats)."""
        self.fmask = format_mask(traits.supported_types())
        self.fmask_invariant = FormatSet(traits.supported_types(), invariant=True)

    def collect_imatrix(self) -> ImatrixSums:
        """From now on every forward also adds the squares of each matmul input to the
        returned sums (llama-imatrix's statistics; :mod:`.imatrix`). :class:`ModelError`
        for a block whose matmuls are not all collected."""
        block = collecting_block(self.block, self.arch)
        hp = self.hparams
        n_ff = max(hp.n_ff, int(self.layer_table["n_ff"].max()))  # (layers' own sizes)
        width = max(hp.n_embd, hp.n_head * hp.n_embd_head_k, n_ff)
        n_expert = hp.extra.get("n_expert", 0)
        width = max(width, hp.extra.get("n_ff_exp", 0))
        self.imatrix = ImatrixSums.new(hp.n_layer, width, n_expert)
        self.block = block  # (this model's from now on)
        self.forward_kernel = self.backend.forward_kernel(block)
        return self.imatrix

    # ------------------------------------------------------------------ running
    def workspace(self, n_tokens: int, n_threads: int) -> Workspace:
        return self.backend.workspace(Workspace, self.hparams, n_tokens, n_threads)

    def forward(
        self,
        ws: Workspace,
        ub: UBatchArrays,
        kv_arrays: tuple,
        n_threads: int,
        deterministic: bool = False,
    ) -> np.ndarray:
        """Run one ubatch; returns the logits ``[n_out, n_vocab]`` (a view into ``ws``).
        ``deterministic``: matmul kernels whose arithmetic for a token does not depend on
        the ubatch (with ``ub``'s rows-attention mode and cell order, a batch-invariant
        forward)."""
        n_out = len(ub.out_idx)
        ws.ensure_outputs(n_out)
        win = ub.cells_swa is not None
        cells_swa = ub.cells_swa if win else ub.cells
        mask_swa = ub.mask_swa if win else ub.mask
        n_kv_swa, mode_swa = (ub.n_kv_swa, ub.mode_swa) if win else (ub.n_kv, ub.mode)
        if ub.rows is not None:  # a hybrid memory: the second part holds the states, by row
            cells_swa = ub.rows
        info = np.array([len(ub.tokens), ub.n_kv, ub.mode, n_out, n_kv_swa, mode_swa], np.int64)
        order = _NO_ORDER if ub.order is None else ub.order
        order_swa = order if not win else _NO_ORDER if ub.order_swa is None else ub.order_swa
        ubt = (ub.tokens, ub.pos, ub.cells, cells_swa, ub.mask, mask_swa, ub.out_idx, info)
        ubt = (*ubt, order, order_swa)
        st = self.store
        W, WD, NF = st.arrays_unchecked()
        args = (
            self.fmask_invariant if deterministic else self.fmask,
            n_threads,
            self.model_row,
            self.layer_table,
            (W, WD, NF, self.rope_arr, self.rope_factors(int(kv_arrays[-1][3]))),
            ubt,
            kv_arrays,
            (*ws.scratch(), _NO_IMATRIX if self.imatrix is None else self.imatrix.sums),
            ws.state,
            ws.barrier,
        )
        self.backend.run(self.forward_kernel, args, st, n_threads)
        if self.imatrix is not None:
            self.imatrix.count(len(ub.tokens), n_out)
        return ws.logits[:n_out, : self.hparams.n_vocab]


_NO_ORDER = np.zeros(0, np.int32)  # attend cells in cell order
_NO_IMATRIX = np.zeros((1, 1), np.float32)  # the forward's sums when none are collected
# The Gated DeltaNet sizes of the model row (hp.extra; 0: no recurrent layers)
SSM_KEYS = ("ssm_d_conv", "ssm_d_state", "ssm_n_group", "ssm_dt_rank", "ssm_d_inner")
# The expert groups and latent attention sizes of the model row (hp.extra; 0: none)
MLA_KEYS = ("n_expert_groups", "n_group_used", "n_lora_q", "n_lora_kv", "head_k_mla", "head_v_mla")

# The activation kinds each input of a layer is quantized to: those of the matrices that
# read it (the layer table's need_* fields).
NEEDS = {
    "need_qkv": (
        "attn_q",
        "attn_k",
        "attn_v",
        "attn_qkv",
        "attn_gate",
        "ssm_beta",
        "ssm_alpha",
        "attn_q_a",
        "attn_kv_a_mqa",
        "ssm_in",
    ),
    "need_q_b": ("attn_q_b",),
    "need_k_b": ("attn_k_b",),
    "need_v_b": ("attn_v_b",),
    "need_out": ("attn_output", "ssm_out"),
    "need_ffn": ("ffn_gate", "ffn_up", "ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps"),
    "need_down": ("ffn_down", "ffn_down_exps"),
    "need_ple_gate": ("inp_gate",),
    "need_ple_proj": ("proj",),
}


def _need(b: Layer, fields: tuple[str, ...]) -> int:
    types = [m.type for f in fields if (m := getattr(b, f)) is not None]
    try:
        return act_need(types)
    except ValueError as e:
        raise ModelError(f"{', '.join(fields)}: {e}") from None


def _read(decls, mf: GGUFModelFile, store: WeightStore, source: TensorSource, hp, i):
    """The fields of the global tensors (``i`` None) or of layer ``i``: matrices and vectors
    registered with the store (fused tensors split by rows), raw arrays read."""
    out: dict[str, Any] = {}
    for d in decls:
        if d.per_layer != (i is not None) or not isinstance(d, Fused):
            continue
        name = d.name.format(i=i)
        if mf.has_tensor(name):
            info = mf.tensor(name)
            parts = [next(t for t in decls if isinstance(t, Tensor) and t.field == f)
                     for f in d.into]  # fmt: skip
            r0 = 0
            for f, t in zip(d.into, parts, strict=True):
                n = shape_of(hp, t)[1]
                if len(info.shape) == 3:  # experts: each expert's rows split alike
                    out[f] = store.experts(info, r0, n)
                else:
                    out[f] = store.matrix(row_slice(info, r0, n))
                r0 += n
    for d in decls:
        if d.per_layer != (i is not None) or not isinstance(d, Tensor):
            continue
        if out.get(d.field) is not None:  # (two declarations of a field: the first present)
            continue
        name = d.name.format(i=i)
        if not mf.has_tensor(name):
            out[d.field] = None
            continue
        info = mf.tensor(name)
        if d.raw:
            out[d.field] = _raw_f32(source, info, shape_of(hp, d))
        elif len(d.shape) == 1 or d.flat or d.name.endswith(".bias"):  # (experts' biases:
            out[d.field] = store.vector(info)  # one row each)
        elif len(d.shape) == 3:
            out[d.field] = store.experts(info)
        else:
            out[d.field] = store.matrix(info)
    return out


def _raw_f32(source: TensorSource, info: TensorInfo, shape: tuple[int, ...]) -> np.ndarray:
    if info.type != GGMLType.F32 or info.shape != shape:
        raise ModelError(f"tensor {info.name!r} must be F32 of {shape[0]} elements")
    return np.array(source.raw(info).view(np.float32))


class Workspace:
    """Scratch buffers of one context (sized for ``n_tokens`` per ubatch, grown on demand for
    outputs). Zero-filled lazily by the OS: untouched pages cost no memory."""

    def __init__(self, hp: HParams, n_tokens: int, n_threads: int) -> None:
        x = hp.extra
        # (gemma4: the local layers' head size may be the larger; per-layer inputs of
        # n_layer * n_pl kept after n_embd in X, computed in XN and U)
        e, d = hp.n_embd, max(hp.n_embd_head_k, x.get("head_k_swa", 0))
        ple = hp.n_layer * x.get("n_embd_per_layer", 0)
        f = max(hp.n_ff, x.get("n_ff_exp", 0), x.get("n_ff_shexp", 0), x.get("n_expert", 0))
        f = max(f, ple)
        qd, kvd = hp.n_head * d, hp.n_head_kv * d
        # latent attention: q's low-rank rows; group scores (thread rows of head size)
        f = max(f, x.get("n_lora_q", 0))
        d = max(d, x.get("n_expert_groups", 0) + 2)
        # gated attention (qwen35): attn_q gives a gate per query (kept in G); Gated
        # DeltaNet layers: channels in Q, the gate z in U, outputs in ATT (stages.delta_net_*)
        gate = qd if hp.extra.get("attn_output_gate") else 0
        inner = hp.extra.get("ssm_d_inner", 0)
        channels = inner + 2 * hp.extra.get("ssm_n_group", 0) * hp.extra.get("ssm_d_state", 0)
        d = max(d, hp.extra.get("ssm_d_state", 0))  # (per-thread rows: normed q, k)
        kmax = max(e, f, qd, inner)
        # mixture of experts: a row per (token, selected expert) for the expert FFN
        n_used = max(1, hp.extra.get("n_expert_used", 0))
        z = lazy_zeros
        self.n_tokens, self.n_threads = n_tokens, n_threads
        self.x = z((n_tokens, e + ple), np.float32)
        # (Mamba-2: x | B | C; qwen3next's fused ssm_in: q | k | v | z per key head)
        self.xn = z(
            (n_tokens, max(kmax, channels, _pad16(hp.extra.get("qkvz_width", 0)))), np.float32
        )
        channels = max(channels, hp.extra.get("q_width", 0))  # lfm2: b | c | x
        self.q = z((n_tokens, _pad16(max(qd + gate, channels))), np.float32)  # (whole row groups)
        self.k = z((n_tokens, _pad16(kvd)), np.float32)
        self.v = z((n_tokens, _pad16(kvd)), np.float32)
        self.att = z((n_tokens, max(qd, inner)), np.float32)
        self.g = z((n_tokens * n_used, _pad16(max(f, gate))), np.float32)
        self.u = z((n_tokens * n_used, _pad16(max(f, inner))), np.float32)
        # (Gated DeltaNet: beta per value head; qwen3next: betas | alphas fused)
        n_router = max(1, hp.extra.get("n_expert", 0), 2 * hp.extra.get("ssm_dt_rank", 0))
        self.router = z((n_tokens, _pad16(n_router)), np.float32)
        self.selected = z((n_tokens, n_used), np.int64)  # experts of each token, best first
        self.weights = z((n_tokens, n_used), np.float32)  # and their weights
        moe = hp.extra.get("n_expert_used", 0) > 0
        self.experts = z((n_tokens * n_used if moe else 1, _pad16(e)), np.float32)  # outputs
        # per thread: the (token, selected expert) rows grouped by expert (stages._expert_rows)
        n_rows = n_tokens * n_used + hp.extra.get("n_expert", 0) + 2 if moe else 1
        self.expert_rows = z((n_threads, n_rows), np.int64)
        self.acts = new_acts(n_tokens * n_used, kmax)
        self.acts_private = new_acts(n_threads, kmax)
        self.x_private = z((n_threads, kmax), np.float32)
        self.logits = z((1, _pad16(hp.n_vocab)), np.float32)
        nt, n_head, tile = n_threads, hp.n_head, TILE
        kv_heads = [h for h in x.get("kv_heads_per_layer", ()) if h] or [hp.n_head_kv]
        gqa = n_head // max(1, min(kv_heads))
        self.thread = (
            z((nt, max(2, hp.n_rot, x.get("n_rot_swa", 0))), np.float32),  # rope cache
            z((nt, d), np.float32),  # query in the K dot type
            z((nt, d), np.int32),  # query quantized (q8_0 K cache)
            z((nt, max(d, 48)), np.float32),  # V row (and the K dot's scratch, kv_rows)
            z((nt, d), np.float32),  # accumulator
            z((nt, d, tile), np.float32),  # K tile (transposed)
            z((nt, tile, d), np.float32),  # V tile
            z((nt, 2 * tile), np.float32),  # tile scores of two query rows
            z((nt, 128 * gqa), np.float32),  # softmax states of a block
            z((n_head, nt), np.float32),  # split partials: M
            z((n_head, nt), np.float32),  # S
            z((n_head, nt, d), np.float32),  # VKQ
            z((nt, d), np.float32),  # merge scratch
        )
        self.barrier = new_barrier()
        self.state = np.zeros(n_threads, stages.STATE_DTYPE)
        self.prof = z((n_threads, 16), np.int64)  # cycles per stage, see stages.P_*

    def ensure_outputs(self, n_out: int) -> None:
        if self.logits.shape[0] < n_out:
            self.logits = np.zeros((n_out, self.logits.shape[1]), np.float32)

    def scratch(self) -> tuple:
        return (
            self.x,
            self.xn,
            self.q,
            self.k,
            self.v,
            self.att,
            self.g,
            self.u,
            self.router,
            self.selected,
            self.weights,
            self.experts,
            self.expert_rows,
            self.acts,
            self.acts_private,
            self.x_private,
            self.logits,
            self.thread,
            self.prof,
        )


def _pad16(n: int) -> int:
    return -(-n // 16) * 16
