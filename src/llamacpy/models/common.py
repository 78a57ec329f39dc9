"""What architectures share: rope settings from GGUF metadata (llama.cpp's rules), the
ubatch arrays of a forward pass, and lazily backed buffers."""

from __future__ import annotations

import math
import mmap
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ModelError
from ..ops.rope import RopeParams

_F32 = np.float32
SCALING_TYPES = ("none", "linear", "yarn", "longrope")


@dataclass(frozen=True)
class RopeOverrides:
    """Context-level rope settings; ``None`` keeps the model's (llama.cpp's cparams)."""

    scaling_type: str | None = None
    freq_base: float | None = None
    freq_scale: float | None = None
    yarn_ext_factor: float | None = None
    yarn_attn_factor: float | None = None
    yarn_beta_fast: float | None = None
    yarn_beta_slow: float | None = None
    yarn_orig_ctx: int | None = None


def rope_params(
    md: Mapping[str, Any],
    arch: str,
    n_rot: int,
    n_ctx_train: int,
    neox: bool,
    ov: RopeOverrides | None = None,
) -> RopeParams:
    """The rope of a model + context, as llama.cpp's hparams loading and cparams setup."""
    ov = ov or RopeOverrides()

    def key(name: str, default: Any) -> Any:
        return md.get(f"{arch}.{name}", default)

    scaling = ov.scaling_type or str(key("rope.scaling.type", "linear"))
    if scaling not in SCALING_TYPES:
        raise ModelError(
            f"unknown rope scaling type {scaling!r} (key {arch}.rope.scaling.type); "
            f"supported: {', '.join(SCALING_TYPES)}"
        )
    if scaling == "longrope":
        raise ModelError(f"rope scaling 'longrope' is not supported (key {arch}.rope.scaling.type)")
    factor = float(key("rope.scaling.factor", key("rope.scale_linear", 0.0)))
    freq_scale = 1.0 / factor if factor != 0 else 1.0
    if ov.freq_scale:
        freq_scale = ov.freq_scale
    if scaling == "none":
        freq_scale = 1.0
    freq_base = ov.freq_base or float(key("rope.freq_base", 10000.0))
    n_ctx_orig = (
        ov.yarn_orig_ctx or int(key("rope.scaling.original_context_length", 0)) or n_ctx_train
    )
    ext = ov.yarn_ext_factor
    if ext is None:
        ext = float(key("rope.scaling.yarn_ext_factor", -1.0))
    if ext < 0:
        ext = 1.0 if scaling == "yarn" else 0.0
    attn = ov.yarn_attn_factor
    if attn is None:
        attn = float(key("rope.scaling.yarn_attn_factor", 1.0))
    attn = _F32(attn)
    if ext != 0:
        f = _F32(1.0) / _F32(freq_scale)
        log_mul = float(key("rope.scaling.yarn_log_multiplier", 0.0))

        def mscale(scale: np.float32, m: float) -> np.float32:
            if scale <= 1:
                return _F32(1.0)
            return _F32(0.1) * _F32(m) * _F32(math.log(scale)) + _F32(1.0)

        attn = mscale(f, 1.0) / mscale(f, log_mul) if log_mul != 0 else mscale(f, 1.0)
        attn = _F32(attn) * (_F32(1.0) / (_F32(1.0) + _F32(0.1) * _F32(math.log(f))))
    attn = _F32(attn) * _F32(key("rope.scaling.attn_factor", 1.0))
    return RopeParams(
        n_rot=n_rot,
        neox=neox,
        freq_base=freq_base,
        freq_scale=float(_F32(freq_scale)),
        ext_factor=float(ext),
        attn_factor=float(attn),
        beta_fast=ov.yarn_beta_fast or float(key("rope.scaling.yarn_beta_fast", 32.0)),
        beta_slow=ov.yarn_beta_slow or float(key("rope.scaling.yarn_beta_slow", 1.0)),
        n_ctx_orig=n_ctx_orig,
    )


@dataclass
class UBatchArrays:
    """What a forward pass needs of a ubatch (built by the engine from its KV cache)."""

    tokens: np.ndarray  # int32 [n]
    pos: np.ndarray  # int32 [n]
    cells: np.ndarray  # int32 [n], cache cell each token's K/V goes to
    mask: np.ndarray  # uint8 [n, n_kv], 1 where token t may attend cell c
    n_kv: int  # cells 0..n_kv are considered (ggml pads the used range to 256)
    out_idx: np.ndarray  # int32 [n_out], tokens whose logits are wanted
    # the sliding-window layers' cells, mask and range (their own cache, engine.iswa)
    cells_swa: np.ndarray | None = None  # None: ``cells``, ``mask``, ``n_kv``
    mask_swa: np.ndarray | None = None
    n_kv_swa: int = 0
    mode: int = 0  # attention kernel (stages.MODE_*) of the global layers
    mode_swa: int = 0  # ... and of the sliding-window layers
    # int32 [n_kv]: the order MODE_ROWS attends the cells in (None: cell order)
    order: np.ndarray | None = None
    order_swa: np.ndarray | None = None
    # int32 [n]: each token's state row in a hybrid memory's recurrent part (None: none)
    rows: np.ndarray | None = None


def lazy_zeros(shape, dtype) -> np.ndarray:
    """A zeroed array whose pages are backed only once written, in 4 KiB pages.

    numpy asks for transparent huge pages on large allocations; then one written byte makes
    a whole 2 MiB resident, and a KV cache whose heads each hold a few used cells becomes
    resident in full. An anonymous map with huge pages declined grows with what is used.
    """
    dtype = np.dtype(dtype)
    n = int(np.prod(shape)) * dtype.itemsize
    if n < 1 << 20:
        return np.zeros(shape, dtype)
    mm = mmap.mmap(-1, n)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        try:
            mm.madvise(mmap.MADV_NOHUGEPAGE)
        except OSError:
            pass
    return np.frombuffer(mm, dtype=dtype).reshape(shape)
