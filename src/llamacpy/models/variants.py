"""Loading of the llama-like decoders (qwen2, qwen3, phi3): one loader, per-architecture
block builders, all run by the llama forward (:mod:`.llama_kernel`).

A variant module declares its block dataclass (a :class:`~.llama.LlamaBlock` plus its extra
vectors), a function building one block from the file and the tensors it refuses; this
module checks the shapes the kernels need, reads the shared tensors and repacks. Fused
tensors (phi3's ``attn_qkv``, gate|up ``ffn_up``) are split here by row ranges into separate
repacked matrices (:func:`row_slice`), so the forward sees plain q/k/v and gate/up.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from ..errors import ModelError
from ..gguf import GGMLType, GGUFModelFile, TensorInfo
from ..gguf.constants import GGML_BLOCK_SIZES
from ..hparams import HParams, check_model
from ..ops import formats
from .common import RopeOverrides, rope_params
from .llama import LlamaBlock
from .weights import Matrix, TensorSource, Vector, WeightStore


class Loader:
    """Typed access to one model file's tensors while a variant builds its blocks."""

    def __init__(self, mf: GGUFModelFile, store: WeightStore) -> None:
        self.mf, self.store = mf, store

    def has(self, name: str) -> bool:
        return self.mf.has_tensor(name)

    def info(self, name: str) -> TensorInfo:
        return self.mf.tensor(name)

    def mat(self, name: str) -> Matrix:
        return self.store.matrix(self.mf.tensor(name))

    def vec(self, name: str, size: int | None = None) -> Vector:
        v = self.store.vector(self.mf.tensor(name))
        if size is not None and v.size != size:
            raise ModelError(f"tensor {name!r} has {v.size} elements, expected {size}")
        return v

    def opt_vec(self, name: str, size: int) -> Vector | None:
        return self.vec(name, size) if self.has(name) else None

    def rows(self, name: str, parts: tuple[int, ...]) -> list[Matrix]:
        """The matrix ``name`` split into consecutive row ranges of the given sizes."""
        info = self.mf.tensor(name)
        if len(info.shape) != 2 or info.shape[1] != sum(parts):
            raise ModelError(
                f"tensor {name!r} has shape {info.shape}, expected ({info.shape[0]}, "
                f"{sum(parts)}) (rows {' + '.join(map(str, parts))})"
            )
        out, r0 = [], 0
        for n in parts:
            out.append(self.store.matrix(row_slice(info, r0, n)))
            r0 += n
        return out


def row_slice(info: TensorInfo, r0: int, n: int) -> TensorInfo:
    """Rows ``r0 .. r0+n`` of a 2-D tensor (ggml rows are contiguous, whole blocks)."""
    ncols = info.shape[0]
    qk, size = GGML_BLOCK_SIZES[info.type]
    if ncols % qk:
        raise ModelError(f"tensor {info.name!r}: rows of {ncols} are not whole {qk}-blocks")
    rb = ncols // qk * size
    return replace(
        info,
        shape=(ncols, n),
        offset=info.offset + r0 * rb,
        data_offset=info.data_offset + r0 * rb,
        nbytes=n * rb,
        n_elements=n * ncols,
    )


def check_shapes(arch: str, hp: HParams, store: WeightStore) -> None:
    """What the kernels need: equal q/k/v head sizes (multiples of 16, fully roped), rows of
    whole format blocks."""
    d = hp.n_embd_head_k
    if d != hp.n_embd_head_v or d != hp.n_rot:
        raise ModelError(
            f"{arch} needs head size == value size == rope dims, got {d}, "
            f"{hp.n_embd_head_v}, {hp.n_rot}"
        )
    if d % 16 or hp.n_embd % 16 or hp.n_ff % 16:
        raise ModelError(
            f"unsupported shape: head size ({d}), n_embd ({hp.n_embd}) and n_ff ({hp.n_ff}) "
            "must be multiples of 16"
        )
    for m, _ in store.matrices:
        qk = formats.layout(m.type, tensor=m.name).qk
        if m.ncols % qk:
            raise ModelError(
                f"tensor {m.name!r}: {m.ncols} columns are not a multiple of the "
                f"{m.type.name} block size {qk}"
            )


BlockBuilder = Callable[[Loader, str, HParams], LlamaBlock]


def load_decoder(
    cls: Any,
    mf: GGUFModelFile,
    source: TensorSource,
    rope: RopeOverrides | None,
    block: BlockBuilder,
    unsupported: tuple[str, ...] = (),
    **kw: Any,
) -> Any:
    """Check, read and repack a llama-like model whose blocks ``block`` builds; ``kw`` go to
    the model class."""
    hp = check_model(mf.metadata, {t.name: t.shape for t in mf.tensors})
    for t in mf.tensors:
        if any(t.name.endswith(s) for s in unsupported):
            raise ModelError(f"tensor {t.name!r}: this {cls.arch} variant is not supported yet")
    store = WeightStore()
    ld = Loader(mf, store)
    token_embd = ld.mat("token_embd.weight")
    output_norm = ld.vec("output_norm.weight")
    output = ld.mat("output.weight") if ld.has("output.weight") else token_embd
    blk = [block(ld, f"blk.{i}.", hp) for i in range(hp.n_layer)]
    check_shapes(cls.arch, hp, store)
    extra = cls.load_extra(ld, source, hp)
    freqs = None
    if ld.has("rope_freqs.weight"):
        info = ld.info("rope_freqs.weight")
        if info.type != GGMLType.F32 or info.shape != (hp.n_rot // 2,):
            raise ModelError("tensor 'rope_freqs.weight' must be F32 of n_rot/2 elements")
        freqs = np.array(source.raw(info).view(np.float32))
    store.build(source)
    rp = rope_params(mf.metadata, cls.arch, hp.n_rot, hp.n_ctx_train, cls.rope_neox, rope)
    return cls(hp, rp, store, token_embd, output_norm, output, blk, freqs, **extra, **kw)


def plain_block(ld: Loader, p: str, hp: HParams, **extra: Any) -> dict[str, Any]:
    """The fields of a llama block with separate q/k/v and gate/up (plus ``extra``)."""
    return dict(
        attn_norm=ld.vec(p + "attn_norm.weight"),
        attn_q=ld.mat(p + "attn_q.weight"),
        attn_k=ld.mat(p + "attn_k.weight"),
        attn_v=ld.mat(p + "attn_v.weight"),
        attn_output=ld.mat(p + "attn_output.weight"),
        ffn_norm=ld.vec(p + "ffn_norm.weight"),
        ffn_gate=ld.mat(p + "ffn_gate.weight"),
        ffn_up=ld.mat(p + "ffn_up.weight"),
        ffn_down=ld.mat(p + "ffn_down.weight"),
        **extra,
    )
