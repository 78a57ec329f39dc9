"""Pooling and normalization of embeddings, as llama.cpp defines them.

Pooling (``llama_pooling_type``; from ``{arch}.pooling_type`` or a context override) turns
the per-token hidden states of a sequence into one vector: ``mean`` of the tokens, ``cls``
the token at the lowest position, ``last`` the token at the highest position; ``none``
keeps every token; ``rank`` scores a (query, document) pair with a reranker's classifier
head (:meth:`.context.Context.embed`). Normalization is ``common_embd_normalize(...,
embd_norm)``: ``-1`` none, ``0`` max-absolute scaled to the int16 range (``x / (max|x| /
32760)``), ``1`` taxicab, ``2`` euclidean (the default), ``p > 2`` the p-norm; sums are
accumulated in double.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import UsageError

# llama_pooling_type values
POOLING_TYPES: dict[str, int] = {
    "unspecified": -1,
    "none": 0,
    "mean": 1,
    "cls": 2,
    "last": 3,
    "rank": 4,
}
POOLING_NAMES = {v: k for k, v in POOLING_TYPES.items()}
SUPPORTED_POOLING = ("none", "mean", "cls", "last", "rank")


def pooling_name(value: str | int | None) -> str:
    """A pooling type given by name or ``llama_pooling_type`` number -> its name."""
    if value is None:
        return "unspecified"
    if isinstance(value, bool):
        raise UsageError(f"invalid pooling type {value!r}")
    if isinstance(value, int | np.integer):
        name = POOLING_NAMES.get(int(value))
    else:
        name = str(value).lower() if str(value).lower() in POOLING_TYPES else None
    if name is None:
        raise UsageError(
            f"unknown pooling type {value!r}; choose one of {', '.join(SUPPORTED_POOLING)} "
            "(or unspecified: the model's own)"
        )
    return name


def per_token_note(requested: str | int | None, model_default: int | None) -> str | None:
    """A note when embeddings come out one vector per token only because the model (a
    decoder) names no pooling and none was asked for."""
    if pooling_name(requested) != "unspecified" or model_default not in (None, -1):
        return None
    return (
        "the model names no pooling type (a decoder?): embeddings are one vector per "
        "token; --pooling mean or last (pooling_type=1 or 3) gives one per text"
    )


def resolve_pooling(requested: str | int | None, model_default: int | None) -> str:
    """The pooling a context uses: the request unless unspecified, else the model's
    ``{arch}.pooling_type``, else ``none`` (llama.cpp's defaults)."""
    name = pooling_name(requested)
    if name == "unspecified":
        name = (
            POOLING_NAMES.get(int(model_default), "none") if model_default is not None else "none"
        )
        if name == "unspecified":
            name = "none"
    if name not in SUPPORTED_POOLING:
        raise UsageError(
            f"pooling type {name!r} is not supported; supported: {', '.join(SUPPORTED_POOLING)}"
        )
    return name


def pool(hidden: np.ndarray, pos: Sequence[int] | np.ndarray, pooling: str) -> np.ndarray:
    """Pool one sequence's hidden states ``[n_tokens, n_embd]`` (positions ``pos``).

    ``none`` returns the rows themselves; the others a vector ``[n_embd]``.
    """
    hidden = np.asarray(hidden, np.float32)
    pos = np.asarray(pos)
    if pooling == "none":
        return hidden.copy()
    if len(hidden) == 0:
        raise UsageError("cannot pool an empty sequence")
    if pooling == "mean":
        # ggml: mul_mat of the hidden states with a column of 1/n (float32)
        w = np.float32(1.0) / np.float32(len(hidden))
        return (hidden.astype(np.float64) * w).sum(0).astype(np.float32)
    if pooling == "cls":
        return hidden[int(np.argmin(pos))].copy()  # first row at the lowest position
    if pooling == "last":
        top = np.flatnonzero(pos == pos.max())
        return hidden[int(top[-1])].copy()  # last row at the highest position
    if pooling == "rank":
        raise UsageError("rank pooling scores with the model's classifier: Context.embed")
    raise UsageError(f"unknown pooling type {pooling!r}; choose one of {SUPPORTED_POOLING}")


def check_embd_normalize(embd_norm: int) -> int:
    if isinstance(embd_norm, bool) or not isinstance(embd_norm, int | np.integer):
        raise UsageError(f"embd_normalize must be an integer, not {embd_norm!r}")
    if embd_norm < -1:
        raise UsageError(
            f"embd_normalize must be -1 (none), 0 (max-abs), 1 (taxicab), 2 (euclidean) "
            f"or a p > 2 (p-norm), not {embd_norm}"
        )
    return int(embd_norm)


def normalize(x: np.ndarray, embd_norm: int = 2) -> np.ndarray:
    """``common_embd_normalize`` of each vector (the last axis) of ``x``."""
    embd_norm = check_embd_normalize(embd_norm)
    x = np.asarray(x, np.float32)
    if embd_norm == -1:
        return x.copy()
    if embd_norm == 0:
        s = np.abs(x).max(-1, initial=0.0).astype(np.float64) / 32760.0
    elif embd_norm == 2:
        s = np.sqrt((x * x).astype(np.float64).sum(-1))
    else:
        a = np.abs(x).astype(np.float64)
        s = (a**embd_norm).sum(-1) ** (1.0 / embd_norm)
    s = np.asarray(s, np.float64)
    inv = np.where(s > 0.0, 1.0 / np.where(s > 0.0, s, 1.0), 0.0).astype(np.float32)
    return (x * inv[..., None]).astype(np.float32)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """``common_embd_similarity_cos`` (double sums; 1 for two zero vectors, 0 for one)."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    s1, s2 = float(a @ a), float(b @ b)
    if s1 == 0.0 or s2 == 0.0:
        return 1.0 if s1 == 0.0 and s2 == 0.0 else 0.0
    return float(a @ b) / (np.sqrt(s1) * np.sqrt(s2))
