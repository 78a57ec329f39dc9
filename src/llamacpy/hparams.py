"""Model hyper-parameters from GGUF metadata, and the consistency checks run before inference.

``HParams.from_gguf`` reads the ``{arch}.*`` keys; ``check_model`` then verifies that every
tensor the architecture needs exists with the shape the hyper-parameters imply. Problems
raise :class:`~llamacpy.errors.ModelError` naming the key or tensor, so a broken file fails
at load time with a clear message instead of crashing inside a kernel later.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import ModelError
from .gguf.constants import KEY_ARCHITECTURE

# Architectures whose hyper-parameters and tensor layout are known. The engine registers the
# ones it can run; this table only describes what a well-formed file must contain.
SUPPORTED_ARCHITECTURES = ("llama", "gemma3", "qwen2", "qwen3", "phi3")


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
    def from_gguf(cls, metadata: Mapping[str, Any], n_vocab: int | None = None) -> HParams:
        """Read and sanity-check the hyper-parameters of a model's metadata."""
        arch = metadata.get(KEY_ARCHITECTURE)
        if not isinstance(arch, str):
            raise ModelError(f"missing or non-string metadata key {KEY_ARCHITECTURE!r}")
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ModelError(
                f"unsupported architecture {arch!r} (key {KEY_ARCHITECTURE!r}); "
                f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        get = _Getter(metadata, arch)
        n_embd = get.int("embedding_length")
        n_head = get.int("attention.head_count")
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
            n_ff=get.int("feed_forward_length"),
            n_head=n_head,
            n_head_kv=n_head_kv,
            n_embd_head_k=head_k,
            n_embd_head_v=head_v,
            n_rot=n_rot,
            rope_freq_base=get.float("rope.freq_base", default=10000.0),
            rope_freq_scale=1.0 / scale_factor if scale_factor > 0 else 1.0,
            norm_rms_eps=get.float("attention.layer_norm_rms_epsilon", default=1e-5, positive=True),
            n_swa=get.int("attention.sliding_window", default=0, minimum=0),
        )

    def expected_tensors(self) -> dict[str, tuple[int, ...]]:
        """Required tensor name -> shape (ggml order) for this architecture."""
        e, v = self.n_embd, self.n_vocab
        q, kv, vo = (
            self.n_head * self.n_embd_head_k,
            self.n_head_kv * self.n_embd_head_k,
            self.n_head_kv * self.n_embd_head_v,
        )
        shapes: dict[str, tuple[int, ...]] = {
            "token_embd.weight": (e, v),
            "output_norm.weight": (e,),
        }
        for i in range(self.n_layer):
            b = f"blk.{i}."
            shapes |= {
                b + "attn_norm.weight": (e,),
                b + "attn_q.weight": (e, q),
                b + "attn_k.weight": (e, kv),
                b + "attn_v.weight": (e, vo),
                b + "attn_output.weight": (self.n_head * self.n_embd_head_v, e),
                b + "ffn_norm.weight": (e,),
                b + "ffn_gate.weight": (e, self.n_ff),
                b + "ffn_up.weight": (e, self.n_ff),
                b + "ffn_down.weight": (self.n_ff, e),
            }
            if self.arch in ("gemma3", "qwen3"):
                shapes |= {
                    b + "attn_q_norm.weight": (self.n_embd_head_k,),
                    b + "attn_k_norm.weight": (self.n_embd_head_k,),
                }
            if self.arch == "gemma3":
                shapes |= {
                    b + "post_attention_norm.weight": (e,),
                    b + "post_ffw_norm.weight": (e,),
                }
            if self.arch == "phi3":  # fused gate|up; q/k/v fused or not (checked at load)
                for name in ("attn_q", "attn_k", "attn_v", "ffn_gate"):
                    del shapes[b + name + ".weight"]
                shapes[b + "ffn_up.weight"] = (e, 2 * self.n_ff)
        return shapes


def check_model(metadata: Mapping[str, Any], tensors: Mapping[str, tuple[int, ...]]) -> HParams:
    """Validate a model before inference; ``tensors`` maps name -> shape (ggml order).

    Returns the hyper-parameters. Extra tensors are allowed (e.g. rope frequency factors);
    a missing or mis-shaped required tensor is a :class:`ModelError`.
    """
    emb = tensors.get("token_embd.weight")
    hp = HParams.from_gguf(metadata, n_vocab=None)
    if hp.n_vocab == 0 and emb is not None and len(emb) == 2:
        hp = HParams.from_gguf(metadata, n_vocab=emb[1])
    if hp.n_vocab <= 0:
        raise ModelError("cannot determine the vocabulary size (no tokenizer.ggml.tokens)")
    tokens = metadata.get("tokenizer.ggml.tokens")
    if tokens is not None and len(tokens) != hp.n_vocab:
        raise ModelError(
            f"{hp.arch}.vocab_size is {hp.n_vocab} but tokenizer.ggml.tokens has {len(tokens)} "
            "entries (key tokenizer.ggml.tokens)"
        )
    for name, shape in hp.expected_tensors().items():
        got = tensors.get(name)
        if got is None:
            raise ModelError(f"tensor {name!r} is missing (required by {hp.arch})")
        if tuple(got) != shape:
            raise ModelError(
                f"tensor {name!r} has shape {tuple(got)}, expected {shape} from the "
                f"hyper-parameters (n_embd={hp.n_embd}, n_head={hp.n_head}, "
                f"n_head_kv={hp.n_head_kv}, n_ff={hp.n_ff}, n_vocab={hp.n_vocab})"
            )
    out = tensors.get("output.weight")
    if out is not None and tuple(out) != (hp.n_embd, hp.n_vocab):
        raise ModelError(
            f"tensor 'output.weight' has shape {tuple(out)}, expected {(hp.n_embd, hp.n_vocab)}"
        )
    return hp


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
