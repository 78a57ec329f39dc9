"""The ``llama`` architecture (Llama 1/2/3, Mistral, SmolLM, ...): attribute names are the
GGUF tensor names (``model.token_embd``, ``model.blk[i].attn_q``, ...).

A block is ``x += attn(rms_norm(x) * attn_norm)``; ``x += ffn_down(silu(ffn_gate(h)) *
ffn_up(h))`` with ``h = rms_norm(x) * ffn_norm``; normal (adjacent-pair) rope; grouped-query
attention; the output head is ``output.weight`` or, when absent, the token embedding (tied).

The model owns no sequence state: :meth:`LlamaModel.forward` gets the ubatch, the attention
plan (which cache cells each token writes and may see) and the KV cache from the engine, and
a :class:`Workspace` of scratch buffers it allocated with :meth:`LlamaModel.workspace`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ModelError
from ..gguf import GGUFModelFile
from ..hparams import HParams, check_model
from ..kernel_cache import preload
from ..ops import formats
from ..ops.activations import ACT_SWIGLU
from ..ops.attention import TILE
from ..ops.matmul import act_need, format_mask, new_acts
from ..ops.rope import RopeParams
from ..ops.threads import new_barrier
from . import llama_kernel
from .common import RopeOverrides, UBatchArrays, lazy_zeros, rope_params
from .weights import Matrix, TensorSource, Vector, WeightStore

_UNSUPPORTED = (
    "attn_qkv.weight",
    "attn_q.bias",
    "attn_k.bias",
    "attn_v.bias",
    "attn_output.bias",
    "ffn_gate.bias",
    "ffn_up.bias",
    "ffn_down.bias",
    "ffn_gate_inp.weight",
)


@dataclass(frozen=True)
class LlamaBlock:
    attn_norm: Vector
    attn_q: Matrix
    attn_k: Matrix
    attn_v: Matrix
    attn_output: Matrix
    ffn_norm: Vector
    ffn_gate: Matrix
    ffn_up: Matrix
    ffn_down: Matrix


class Workspace:
    """Scratch buffers of one context (sized for ``n_tokens`` per ubatch, grown on demand for
    outputs). Zero-filled lazily by the OS: untouched pages cost no memory."""

    def __init__(self, model: LlamaModel, n_tokens: int, n_threads: int) -> None:
        hp = model.hparams
        e, f, d = hp.n_embd, hp.n_ff, hp.n_embd_head_k
        qd, kvd = hp.n_head * d, hp.n_head_kv * d
        kmax = max(e, f, qd)
        z = lazy_zeros
        self.n_tokens, self.n_threads = n_tokens, n_threads
        self.x = z((n_tokens, e), np.float32)
        self.xn = z((n_tokens, kmax), np.float32)
        self.q = z((n_tokens, qd), np.float32)
        self.k = z((n_tokens, _pad16(kvd)), np.float32)
        self.v = z((n_tokens, _pad16(kvd)), np.float32)
        self.att = z((n_tokens, qd), np.float32)
        self.g = z((n_tokens, _pad16(f)), np.float32)
        self.u = z((n_tokens, _pad16(f)), np.float32)
        self.acts = new_acts(n_tokens, kmax)
        self.acts_private = new_acts(n_threads, kmax)
        self.x_private = z((n_threads, kmax), np.float32)
        self.logits = z((1, _pad16(hp.n_vocab)), np.float32)
        nt, n_head, tile = n_threads, hp.n_head, TILE
        self.thread = (
            z((nt, max(2, hp.n_rot)), np.float32),  # rope cache
            z((nt, d), np.float32),  # query in the K dot type
            z((nt, d), np.int32),  # query quantized (q8_0 K cache)
            z((nt, d), np.float32),  # V row
            z((nt, d), np.float32),  # accumulator
            z((nt, d, tile), np.float32),  # K tile (transposed)
            z((nt, tile, d), np.float32),  # V tile
            z((nt, 2 * tile), np.float32),  # tile scores of two query rows
            z((nt, 128 * (n_head // hp.n_head_kv)), np.float32),  # softmax states of a block
            z((n_head, nt), np.float32),  # split partials: M
            z((n_head, nt), np.float32),  # S
            z((n_head, nt, d), np.float32),  # VKQ
            z((nt, d), np.float32),  # merge scratch
        )
        self.barrier = new_barrier()
        self.prof = z((n_threads, 16), np.int64)  # cycles per stage, see llama_kernel.P_*

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
            self.acts,
            self.acts_private,
            self.x_private,
            self.logits,
            self.thread,
            self.prof,
        )


def _pad16(n: int) -> int:
    return -(-n // 16) * 16


class LlamaModel:
    """A loaded llama model; see the module docstring.

    Variants (gemma3) subclass it and set the class attributes below, their block norms
    (``attn_q_norm``, ``attn_k_norm``, ``post_attention_norm``, ``post_ffw_norm``), and
    ``rope_swa`` / ``layer_swa`` for sliding-window layers; one compiled forward runs all.
    """

    arch = "llama"
    rope_neox = False
    ffn_act = ACT_SWIGLU
    n_swa = 0  # sliding window (tokens), 0: every layer attends globally
    rope_swa: RopeParams | None = None  # rope of the sliding-window layers (None: ``rope``)
    layer_swa: tuple[bool, ...] = ()  # per layer: sliding window (empty: none)
    embd_scale = 1.0  # token embeddings are multiplied by this
    logit_softcap = 0.0  # logits -> c * tanh(logits / c) when c > 0

    def __init__(
        self,
        hparams: HParams,
        rope: RopeParams,
        store: WeightStore,
        token_embd: Matrix,
        output_norm: Vector,
        output: Matrix,
        blk: list[LlamaBlock],
        rope_freqs: np.ndarray | None,
    ) -> None:
        self.hparams = hparams
        self.rope = rope
        self.store = store
        self.token_embd = token_embd
        self.output_norm = output_norm
        self.output = output
        self.blk = blk
        self.rope_freqs = rope_freqs
        self._pack()

    # ------------------------------------------------------------------ loading
    @classmethod
    def load(
        cls, mf: GGUFModelFile, source: TensorSource, rope: RopeOverrides | None = None
    ) -> LlamaModel:
        """Check, read and repack a model's tensors (see :mod:`.weights`)."""
        shapes = {t.name: t.shape for t in mf.tensors}
        hp = check_model(mf.metadata, shapes)
        for t in mf.tensors:
            if any(t.name.endswith(s) for s in _UNSUPPORTED):
                raise ModelError(f"tensor {t.name!r}: this llama variant is not supported yet")
        d = hp.n_embd_head_k
        if d != hp.n_embd_head_v or d != hp.n_rot:
            raise ModelError(
                f"llama needs head size == value size == rope dims, got {d}, "
                f"{hp.n_embd_head_v}, {hp.n_rot}"
            )
        if d % 16 or hp.n_embd % 32 or hp.n_ff % 32:
            raise ModelError(
                f"unsupported shape: head size {d} must be a multiple of 16, n_embd "
                f"({hp.n_embd}) and n_ff ({hp.n_ff}) multiples of 32"
            )
        store = WeightStore()
        t = mf.tensor
        token_embd = store.matrix(t("token_embd.weight"))
        output_norm = store.vector(t("output_norm.weight"))
        output = store.matrix(t("output.weight")) if mf.has_tensor("output.weight") else token_embd
        blk = []
        for i in range(hp.n_layer):
            p = f"blk.{i}."
            blk.append(
                LlamaBlock(
                    attn_norm=store.vector(t(p + "attn_norm.weight")),
                    attn_q=store.matrix(t(p + "attn_q.weight")),
                    attn_k=store.matrix(t(p + "attn_k.weight")),
                    attn_v=store.matrix(t(p + "attn_v.weight")),
                    attn_output=store.matrix(t(p + "attn_output.weight")),
                    ffn_norm=store.vector(t(p + "ffn_norm.weight")),
                    ffn_gate=store.matrix(t(p + "ffn_gate.weight")),
                    ffn_up=store.matrix(t(p + "ffn_up.weight")),
                    ffn_down=store.matrix(t(p + "ffn_down.weight")),
                )
            )
        freqs = None
        if mf.has_tensor("rope_freqs.weight"):
            info = t("rope_freqs.weight")
            if info.type != formats.GGMLType.F32 or info.shape != (hp.n_rot // 2,):
                raise ModelError("tensor 'rope_freqs.weight' must be F32 of n_rot/2 elements")
            freqs = np.array(source.raw(info).view(np.float32))
        store.build(source)
        rp = rope_params(mf.metadata, cls.arch, hp.n_rot, hp.n_ctx_train, cls.rope_neox, rope)
        return cls(hp, rp, store, token_embd, output_norm, output, blk, freqs)

    def _pack(self) -> None:
        """The integer tables the compiled forward reads."""
        hp, b = self.hparams, self.blk
        self.fmask = format_mask(self.store.types)
        self.layer_w = np.array(
            [
                [
                    x.attn_q.index,
                    x.attn_k.index,
                    x.attn_v.index,
                    x.attn_output.index,
                    x.ffn_gate.index,
                    x.ffn_up.index,
                    x.ffn_down.index,
                ]
                for x in b
            ],
            np.int64,
        ).reshape(-1, 7)

        def off(x: object, name: str) -> int:
            v = getattr(x, name, None)
            return -1 if v is None else v.offset

        self.layer_n = np.array(
            [
                [x.attn_norm.offset, x.ffn_norm.offset]
                + [
                    off(x, n)
                    for n in (
                        "attn_q_norm",
                        "attn_k_norm",
                        "post_attention_norm",
                        "post_ffw_norm",
                        "attn_q_bias",
                        "attn_k_bias",
                        "attn_v_bias",
                    )
                ]
                for x in b
            ],
            np.int64,
        ).reshape(-1, 9)
        swa = self.layer_swa or (False,) * len(b)
        self.layer_kind = np.array([1 if s else 0 for s in swa], np.int64)
        self.layer_need = np.array(
            [
                [
                    act_need([x.attn_q.type, x.attn_k.type, x.attn_v.type]),
                    act_need([x.attn_output.type]),
                    act_need([x.ffn_gate.type, x.ffn_up.type]),
                    act_need([x.ffn_down.type]),
                ]
                for x in b
            ],
            np.int64,
        ).reshape(-1, 4)
        self.glob = np.array(
            [
                self.token_embd.index,
                self.output.index,
                self.output_norm.offset,
                act_need([self.output.type]),
            ],
            np.int64,
        )
        self.hp_arr = np.array(
            [
                hp.n_embd,
                hp.n_head,
                hp.n_head_kv,
                hp.n_embd_head_k,
                hp.n_ff,
                hp.n_vocab,
                hp.n_layer,
                hp.n_rot,
                self.ffn_act,
            ],
            np.int64,
        )
        kq_scale, q_scale = self.attention_scales()
        self.fp_arr = np.array(
            [hp.norm_rms_eps, kq_scale, self.embd_scale, self.logit_softcap, q_scale], np.float32
        )
        self.rope_arr = np.stack([self.rope.packed(), (self.rope_swa or self.rope).packed()])
        self.freqs_arr = (
            np.zeros(0, np.float32)
            if self.rope_freqs is None
            else np.ascontiguousarray(self.rope_freqs, np.float32)
        )

    def attention_scales(self) -> tuple[float, float]:
        """(scale of the K.Q scores, scale applied to the roped queries)."""
        return float(np.float32(1.0) / np.sqrt(np.float32(self.hparams.n_embd_head_k))), 1.0

    @property
    def rope_layers(self) -> list[RopeParams]:
        """The rope of each layer (what a K-shift re-ropes the layer's keys with)."""
        swa = self.layer_swa or (False,) * self.hparams.n_layer
        return [(self.rope_swa or self.rope) if s else self.rope for s in swa]

    def use_all_kernels(self) -> None:
        """Link every format's matmul kernel into the compiled forward pass (one compiled
        forward for all models, instead of one per set of weight formats)."""
        self.fmask = format_mask(formats.SUPPORTED_TYPES)

    def rope_factors(self, n_ctx: int) -> np.ndarray:
        """The rope frequency factors of a context of ``n_ctx`` cells (empty: none); phi3
        picks its long or short factors by the context size."""
        return self.freqs_arr

    # ------------------------------------------------------------------ running
    def workspace(self, n_tokens: int, n_threads: int) -> Workspace:
        return Workspace(self, n_tokens, n_threads)

    def forward(
        self, ws: Workspace, ub: UBatchArrays, kv_arrays: tuple, mode: int, n_threads: int
    ) -> np.ndarray:
        """Run one ubatch; returns the logits ``[n_out, n_vocab]`` (a view into ``ws``)."""
        n = len(ub.tokens)
        n_out = len(ub.out_idx)
        ws.ensure_outputs(n_out)
        info = np.array([n, ub.n_kv, mode, n_out], np.int64)
        st = self.store
        mask_swa = ub.mask if ub.mask_swa is None else ub.mask_swa
        args = (
            self.fmask,
            n_threads,
            st.arrays_unchecked(),
            (self.layer_w, self.layer_n, self.layer_need, self.layer_kind),
            self.glob,
            self.hp_arr,
            self.fp_arr,
            self.rope_arr,
            self.rope_factors(int(kv_arrays[2][3])),
            (ub.tokens, ub.pos, ub.cells, ub.mask, mask_swa, ub.out_idx, info),
            kv_arrays,
            ws.scratch(),
            ws.barrier,
        )
        if st.pending:  # first call: load the machine code while the weights are copied
            preload(llama_kernel.forward, args)
        st.wait()  # (raises if the copy failed)
        llama_kernel.forward(*args)
        return ws.logits[:n_out, : self.hparams.n_vocab]
