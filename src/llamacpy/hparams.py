"""Model hyper-parameters from GGUF metadata, and the consistency checks run before inference.

``HParams.from_gguf`` reads the ``{arch}.*`` keys every decoder has; an architecture module
declares its own keys and its tensors (``models.spec``), and ``models.check_model`` verifies
a file against them. Problems raise :class:`~llamacpy.errors.ModelError` naming the key or tensor, so a broken file fails
at load time with a clear message instead of crashing inside a kernel later.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from .errors import ModelError
from .gguf.constants import KEY_ARCHITECTURE


@dataclass(frozen=True)
class HParams:
    """Hyper-parameters in llama.cpp's vocabulary (``n_embd``, ``n_head_kv``, ...)."""

    arch: str
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_ff: int
    n_head: int
    n_head_kv: int
    n_embd_head_k: int  # key/query head size
    n_embd_head_v: int  # value head size
    n_rot: int  # rotary dimensions per head
    rope_freq_base: float
    rope_freq_scale: float
    norm_rms_eps: float
    n_swa: int  # sliding-window size, 0 when every layer attends globally

    @classmethod
    def from_gguf(
        cls, metadata: Mapping[str, Any], n_vocab: int | None = None, attention: bool = True
    ) -> HParams:
        """Read and sanity-check the hyper-parameters of a model's metadata. ``attention``
        False: a model without attention layers (mamba2, whose files give
        ``attention.head_count`` 0): the attention sizes are 0 and their keys not read."""
        arch = metadata.get(KEY_ARCHITECTURE)
        if not isinstance(arch, str):
            raise ModelError(f"missing or non-string metadata key {KEY_ARCHITECTURE!r}")
        get = _Getter(metadata, arch)
        n_embd = get.int("embedding_length")
        if attention:
            n_head, n_head_kv, head_k, head_v, n_rot = _attention_sizes(get, metadata, arch, n_embd)
        else:
            n_head = n_head_kv = head_k = head_v = n_rot = 0
        kv_layers = _kv_heads_per_layer(metadata, arch) if attention else None
        ff_layers = _per_layer(metadata, f"{arch}.feed_forward_length") if attention else None
        extra = {} if kv_layers is None else {"kv_heads_per_layer": kv_layers}
        if ff_layers is not None:
            extra["ff_per_layer"] = ff_layers
        if n_vocab is None:
            tokens = metadata.get("tokenizer.ggml.tokens")
            n_vocab = get.int("vocab_size", default=len(tokens) if tokens is not None else 0)
        scale_factor = get.float("rope.scaling.factor", default=0.0)
        return cls(
            arch=arch,
            n_vocab=int(n_vocab),
            n_ctx_train=get.int("context_length"),
            n_embd=n_embd,
            n_layer=get.int("block_count"),
            n_ff=(max(ff_layers) if ff_layers else get.int("feed_forward_length"))
            if attention
            else 0,
            n_head=n_head,
            n_head_kv=n_head_kv,
            n_embd_head_k=head_k,
            n_embd_head_v=head_v,
            n_rot=n_rot,
            rope_freq_base=get.float("rope.freq_base", default=10000.0),
            rope_freq_scale=1.0 / scale_factor if scale_factor > 0 else 1.0,
            norm_rms_eps=get.float("attention.layer_norm_rms_epsilon", default=1e-5, positive=True),
            n_swa=get.int("attention.sliding_window", default=0, minimum=0),
            extra=extra,
        )

    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)
    """architecture-specific values (see ``models.spec.Param``)"""

    def with_extra(self, extra: Mapping[str, Any]) -> HParams:
        return replace(self, extra={**self.extra, **extra})

    # sizes the tensor declarations use (``models.spec``)
    @property
    def n_embd_q(self) -> int:
        return self.n_head * self.n_embd_head_k

    @property
    def n_embd_k_gqa(self) -> int:
        return self.n_head_kv * self.n_embd_head_k

    @property
    def n_embd_v_gqa(self) -> int:
        return self.n_head_kv * self.n_embd_head_v

    @property
    def n_embd_o(self) -> int:
        """Columns of ``attn_output``: the attention output of all heads."""
        return self.n_head * self.n_embd_head_v


def _attention_sizes(get, metadata: Mapping[str, Any], arch: str, n_embd: int) -> tuple:
    """(heads, KV heads, key head size, value head size, rope dimensions), checked."""
    n_head = get.int("attention.head_count")
    kv_layers = _kv_heads_per_layer(metadata, arch)
    if kv_layers is not None:  # hybrids: 0 in the layers without attention
        n_head_kv = max(kv_layers)
    else:
        n_head_kv = get.int("attention.head_count_kv", default=n_head)
    if n_head_kv > n_head or n_head % n_head_kv:
        raise ModelError(
            f"attention.head_count ({n_head}) is not a multiple of "
            f"attention.head_count_kv ({n_head_kv}) (key {arch}.attention.head_count_kv)"
        )
    head_k = get.int("attention.key_length", default=0)
    if head_k == 0:
        if n_embd % n_head:
            raise ModelError(
                f"embedding_length ({n_embd}) is not divisible by attention.head_count "
                f"({n_head}) and no attention.key_length is given "
                f"(key {arch}.attention.head_count)"
            )
        head_k = n_embd // n_head
    head_v = get.int("attention.value_length", default=head_k)
    n_rot = get.int("rope.dimension_count", default=head_k)
    if n_rot > head_k or n_rot % 2:
        raise ModelError(
            f"rope.dimension_count ({n_rot}) must be even and at most the head size "
            f"({head_k}) (key {arch}.rope.dimension_count)"
        )
    return n_head, n_head_kv, head_k, head_v, n_rot


def _kv_heads_per_layer(metadata: Mapping[str, Any], arch: str) -> tuple[int, ...] | None:
    """``attention.head_count_kv`` given per layer: with zeros (a hybrid's layers without
    attention) or counts that differ (gemma4's global layers); None for a single count (or
    no key). Which forms a model accepts is its class's call (``Decoder.check``)."""
    key = f"{arch}.attention.head_count_kv"
    v = metadata.get(key)
    if not isinstance(v, np.ndarray | list) or not len(v):
        return None
    counts = tuple(int(x) for x in v)
    nonzero = {c for c in counts if c}
    if 0 not in counts and len(nonzero) == 1:
        return None  # one count for every layer
    if not nonzero or min(counts) < 0:
        raise ModelError(f"per-layer values {sorted(set(counts))} are not supported (key {key!r})")
    return counts


def _per_layer(metadata: Mapping[str, Any], key: str) -> tuple[int, ...] | None:
    """A per-layer array of positive integers whose values differ (gemma4's
    ``feed_forward_length``); None for one value (or no key)."""
    v = metadata.get(key)
    if not isinstance(v, np.ndarray | list) or len({int(x) for x in v}) < 2:
        return None
    counts = tuple(int(x) for x in v)
    if min(counts) < 1:
        raise ModelError(f"metadata key {key!r} has a layer of size {min(counts)}")
    return counts


class _Getter:
    """Typed access to ``{arch}.{suffix}`` keys with errors that name the key."""

    def __init__(self, metadata: Mapping[str, Any], arch: str) -> None:
        self.md, self.arch = metadata, arch

    _MISSING = object()

    def _raw(self, suffix: str, default: Any) -> tuple[str, Any]:
        """(key, value); value is ``_MISSING`` when the key is absent and has a default."""
        key = f"{self.arch}.{suffix}"
        value = self.md.get(key, self._MISSING)
        if value is self._MISSING:
            if default is self._MISSING:
                raise ModelError(f"required metadata key {key!r} is missing")
            return key, self._MISSING
        if isinstance(value, np.ndarray | list):
            # per-layer arrays (e.g. head counts): all layers must agree for now
            values = {int(x) for x in value} if len(value) else set()
            if len(values) != 1:
                raise ModelError(
                    f"per-layer values {sorted(values)} are not supported (key {key!r})"
                )
            value = values.pop()
        return key, value

    def int(self, suffix: str, default: Any = _MISSING, minimum: int = 1) -> int:
        key, value = self._raw(suffix, default)
        if value is self._MISSING:
            return default
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise ModelError(f"metadata key {key!r} must be an integer, not {value!r}")
        if value < minimum:
            raise ModelError(f"metadata key {key!r} is {value}; must be at least {minimum}")
        if value > 2**31 - 1:
            raise ModelError(f"metadata key {key!r} is {value}; implausibly large")
        return int(value)

    def float(self, suffix: str, default: Any = _MISSING, positive: bool = False) -> float:
        key, value = self._raw(suffix, default)
        if value is self._MISSING:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float | np.number):
            raise ModelError(f"metadata key {key!r} must be a number, not {value!r}")
        if not np.isfinite(value) or (positive and value <= 0):
            raise ModelError(f"metadata key {key!r} has invalid value {value}")
        return float(value)
