"""The ``gemma3`` architecture (Gemma 3 text models), as llama.cpp runs it.

A llama block with, in this order: ``h = rms_norm(x) * attn_norm``; q/k/v; per-head RMSNorm
of q and k (``attn_q_norm``, ``attn_k_norm``); NeoX rope; queries scaled by
``1/sqrt(attention.key_length)`` (``1/sqrt(n_embd/n_head)`` for the 27B model); attention;
``x += rms_norm(attn_output(...)) * post_attention_norm``; then ``x += rms_norm(ffn_down(
gelu(ffn_gate(h)) * ffn_up(h))) * post_ffw_norm`` with ``h = rms_norm(x) * ffn_norm``. Token
embeddings are scaled by ``sqrt(n_embd)``; logits are soft-capped when the file sets
``final_logit_softcapping``.

Sliding-window attention: when ``gemma3.attention.sliding_window`` (``n_swa``) is set, layer
``il`` is local unless ``il % pattern == pattern - 1`` (``attention.sliding_window_pattern``,
default 6: five local layers, then one global), or as listed by a boolean array under that
key. Local layers see only the ``n_swa`` latest positions (the engine builds a second,
windowed mask over the same KV cache) and use their own rope base
(``rope.freq_base_swa``, default 10000, not changed by context rope overrides).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ..errors import ModelError
from ..gguf import GGUFModelFile
from ..hparams import HParams, check_model
from ..ops.activations import ACT_GEGLU
from ..ops.rope import RopeParams
from .common import RopeOverrides, rope_params
from .llama import LlamaBlock, LlamaModel
from .weights import Matrix, TensorSource, Vector, WeightStore

_UNSUPPORTED = ("dense_2.weight", "dense_3.weight")  # embeddinggemma heads
DEFAULT_SWA_PATTERN = 6
DEFAULT_FREQ_BASE_SWA = 10000.0


@dataclass(frozen=True)
class Gemma3Block(LlamaBlock):
    attn_q_norm: Vector
    attn_k_norm: Vector
    post_attention_norm: Vector
    post_ffw_norm: Vector


def swa_layers(md, arch: str, n_layer: int) -> tuple[bool, ...]:
    """Which layers use the sliding window (llama.cpp's ``load_swa_pattern``)."""
    if int(md.get(f"{arch}.attention.sliding_window", 0) or 0) <= 0:
        return (False,) * n_layer
    key = f"{arch}.attention.sliding_window_pattern"
    pat = md.get(key, DEFAULT_SWA_PATTERN)
    if isinstance(pat, list | tuple | np.ndarray):
        if len(pat) != n_layer:
            raise ModelError(f"{key} lists {len(pat)} layers, the model has {n_layer}")
        return tuple(bool(x) for x in pat)
    n = int(pat)
    if n < 0:
        raise ModelError(f"{key} must be >= 0, not {n}")
    return tuple(n == 0 or il % n < n - 1 for il in range(n_layer))


class Gemma3Model(LlamaModel):
    """A loaded gemma3 model; see the module docstring."""

    arch = "gemma3"
    rope_neox = True
    ffn_act = ACT_GEGLU

    def __init__(
        self,
        *args,
        n_swa: int,
        rope_swa: RopeParams,
        layer_swa: tuple[bool, ...],
        logit_softcap: float,
        **kw,
    ) -> None:
        self.n_swa = n_swa
        self.rope_swa = rope_swa
        self.layer_swa = layer_swa
        self.logit_softcap = logit_softcap
        super().__init__(*args, **kw)

    @property
    def embd_scale(self) -> float:  # type: ignore[override]
        return float(np.sqrt(np.float32(self.hparams.n_embd)))

    def attention_scales(self) -> tuple[float, float]:
        """Queries are scaled after rope (``f_attention_scale``), the scores are not."""
        hp = self.hparams
        d = hp.n_embd // hp.n_head if hp.n_layer == 62 else hp.n_embd_head_k  # 27B: gemma_pytorch
        return 1.0, float(np.float32(1.0) / np.sqrt(np.float32(d)))

    @classmethod
    def load(
        cls, mf: GGUFModelFile, source: TensorSource, rope: RopeOverrides | None = None
    ) -> Gemma3Model:
        """Check, read and repack a model's tensors (see :mod:`.weights`)."""
        md = mf.metadata
        hp: HParams = check_model(md, {t.name: t.shape for t in mf.tensors})
        for t in mf.tensors:
            if t.name in _UNSUPPORTED:
                raise ModelError(f"tensor {t.name!r}: this gemma3 variant is not supported yet")
        d = hp.n_embd_head_k
        if d != hp.n_embd_head_v or d != hp.n_rot:
            raise ModelError(
                f"gemma3 needs head size == value size == rope dims, got {d}, "
                f"{hp.n_embd_head_v}, {hp.n_rot}"
            )
        if d % 16 or hp.n_embd % 32 or hp.n_ff % 32:
            raise ModelError(
                f"unsupported shape: head size {d} must be a multiple of 16, n_embd "
                f"({hp.n_embd}) and n_ff ({hp.n_ff}) multiples of 32"
            )
        store = WeightStore()
        t = mf.tensor

        def mat(name: str) -> Matrix:
            return store.matrix(t(name))

        def vec(name: str) -> Vector:
            return store.vector(t(name))

        token_embd = mat("token_embd.weight")
        output_norm = vec("output_norm.weight")
        output = mat("output.weight") if mf.has_tensor("output.weight") else token_embd
        blk = []
        for i in range(hp.n_layer):
            p = f"blk.{i}."
            blk.append(
                Gemma3Block(
                    attn_norm=vec(p + "attn_norm.weight"),
                    attn_q=mat(p + "attn_q.weight"),
                    attn_k=mat(p + "attn_k.weight"),
                    attn_v=mat(p + "attn_v.weight"),
                    attn_output=mat(p + "attn_output.weight"),
                    ffn_norm=vec(p + "ffn_norm.weight"),
                    ffn_gate=mat(p + "ffn_gate.weight"),
                    ffn_up=mat(p + "ffn_up.weight"),
                    ffn_down=mat(p + "ffn_down.weight"),
                    attn_q_norm=vec(p + "attn_q_norm.weight"),
                    attn_k_norm=vec(p + "attn_k_norm.weight"),
                    post_attention_norm=vec(p + "post_attention_norm.weight"),
                    post_ffw_norm=vec(p + "post_ffw_norm.weight"),
                )
            )
        store.build(source)
        rp = rope_params(md, cls.arch, hp.n_rot, hp.n_ctx_train, cls.rope_neox, rope)
        layer_swa = swa_layers(md, cls.arch, hp.n_layer)
        n_swa = hp.n_swa if any(layer_swa) else 0
        # llama.cpp: local layers keep the file's base and scale whatever the context says
        base_swa = float(md.get(f"{cls.arch}.rope.freq_base_swa", DEFAULT_FREQ_BASE_SWA))
        rope_swa = replace(rp, freq_base=base_swa, freq_scale=1.0)
        softcap = float(md.get(f"{cls.arch}.final_logit_softcapping", 0.0) or 0.0)
        if not math.isfinite(softcap) or softcap < 0:
            raise ModelError(f"{cls.arch}.final_logit_softcapping must be >= 0, not {softcap}")
        return cls(
            hp,
            rp,
            store,
            token_embd,
            output_norm,
            output,
            blk,
            None,
            n_swa=n_swa,
            rope_swa=rope_swa,
            layer_swa=layer_swa,
            logit_softcap=softcap,
        )
