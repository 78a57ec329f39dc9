"""The ``phi3`` architecture (Phi-3, Phi-3.5, Phi-4 mini), as llama.cpp runs it.

A llama block whose q/k/v come fused as ``attn_qkv`` (rows q | k | v) and whose gate and up
projections come fused as ``ffn_up`` (rows gate | up, SwiGLU): both are split by row ranges
at load time into separate repacked matrices, so the shared forward runs them as is (no
cost at run time). NeoX rope; queries are scaled by ``1/sqrt(head size)`` after rope.

Rope scaling (LongRoPE): ``rope_factors_short`` / ``rope_factors_long`` hold per-dimension
frequency factors; as llama.cpp, a context larger than the original training context
(``rope.scaling.original_context_length``, default ``context_length``) uses the long ones,
else the short ones (``rope_freqs``, when present, wins); llama.cpp compares its context
rounded up to a multiple of 256, this the context as allocated (the same for such sizes).
``rope.scaling.attn_factor`` scales the rotated values (see :func:`.common.rope_params`; a
K-shift applies it again, as llama.cpp's). ``attention.sliding_window`` is ignored, as
llama.cpp does for this architecture.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ModelError
from ..gguf import GGMLType, GGUFModelFile
from ..hparams import HParams
from .common import RopeOverrides
from .llama import LlamaBlock, LlamaModel
from .qwen2 import qkv_biases
from .variants import Loader, load_decoder
from .weights import TensorSource, Vector

_UNSUPPORTED = (
    "attn_qkv.bias",
    "attn_output.bias",
    "attn_norm.bias",
    "ffn_norm.bias",
    "ffn_up.bias",
    "ffn_down.bias",
    "ffn_gate_inp.weight",
    "output_norm.bias",
    "output.bias",
)


@dataclass(frozen=True)
class Phi3Block(LlamaBlock):
    attn_q_bias: Vector | None = None
    attn_k_bias: Vector | None = None
    attn_v_bias: Vector | None = None


def _block(ld: Loader, p: str, hp: HParams) -> Phi3Block:
    q, kv = hp.n_head * hp.n_embd_head_k, hp.n_head_kv * hp.n_embd_head_k
    if ld.has(p + "attn_qkv.weight"):
        wq, wk, wv = ld.rows(p + "attn_qkv.weight", (q, kv, hp.n_head_kv * hp.n_embd_head_v))
    else:
        wq, wk, wv = (ld.mat(p + f"attn_{x}.weight") for x in "qkv")
    gate, up = ld.rows(p + "ffn_up.weight", (hp.n_ff, hp.n_ff))
    return Phi3Block(
        attn_norm=ld.vec(p + "attn_norm.weight"),
        attn_q=wq,
        attn_k=wk,
        attn_v=wv,
        attn_output=ld.mat(p + "attn_output.weight"),
        ffn_norm=ld.vec(p + "ffn_norm.weight"),
        ffn_gate=gate,
        ffn_up=up,
        ffn_down=ld.mat(p + "ffn_down.weight"),
        **qkv_biases(ld, p, hp),
    )


def _factors(ld: Loader, source: TensorSource, name: str, n: int) -> np.ndarray | None:
    if not ld.has(name):
        return None
    info = ld.info(name)
    if info.type != GGMLType.F32 or info.shape != (n,):
        raise ModelError(f"tensor {name!r} must be F32 of n_rot/2 = {n} elements")
    return np.array(source.raw(info).view(np.float32))


class Phi3Model(LlamaModel):
    """A loaded phi3 model; see the module docstring."""

    arch = "phi3"
    rope_neox = True

    def __init__(
        self,
        *args: Any,
        factors_long: np.ndarray | None,
        factors_short: np.ndarray | None,
        n_ctx_orig: int,
        **kw: Any,
    ) -> None:
        self.factors_long = factors_long
        self.factors_short = factors_short
        self.n_ctx_orig = n_ctx_orig
        super().__init__(*args, **kw)

    def attention_scales(self) -> tuple[float, float]:
        """Queries are scaled after rope, the scores are not (as llama.cpp's graph)."""
        return 1.0, float(np.float32(1.0) / np.sqrt(np.float32(self.hparams.n_embd_head_k)))

    def rope_factors(self, n_ctx: int) -> np.ndarray:
        """The frequency factors of a context of ``n_ctx`` cells (long above the original
        training context, else short; empty: none)."""
        if self.rope_freqs is not None:
            return self.freqs_arr
        f = self.factors_long if n_ctx > self.n_ctx_orig else self.factors_short
        return np.zeros(0, np.float32) if f is None else np.ascontiguousarray(f, np.float32)

    @classmethod
    def load_extra(cls, ld: Loader, source: TensorSource, hp: HParams) -> dict[str, Any]:
        n = hp.n_rot // 2
        md = ld.mf.metadata
        orig = int(md.get(f"{cls.arch}.rope.scaling.original_context_length", 0) or 0)
        return {
            "factors_long": _factors(ld, source, "rope_factors_long.weight", n),
            "factors_short": _factors(ld, source, "rope_factors_short.weight", n),
            "n_ctx_orig": orig or hp.n_ctx_train,
        }

    @classmethod
    def load(
        cls, mf: GGUFModelFile, source: TensorSource, rope: RopeOverrides | None = None
    ) -> Phi3Model:
        """Check, read and repack a model's tensors (see :mod:`.variants`)."""
        return load_decoder(cls, mf, source, rope, _block, _UNSUPPORTED)
