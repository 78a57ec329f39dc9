"""Tiny random models, deterministic from a seed, for tests of every architecture and format.

``write_tiny_llama(path, weight_type, seed)`` writes a 2-layer llama GGUF whose matrices are
random blocks of the given ggml type (random quants, scales chosen so weights have a
standard deviation of about 0.05) and whose vocabulary is 259 SentencePiece byte tokens, so
llama.cpp loads it too. Only numpy and the GGUF writer are used: the file is byte-identical
for a given seed, type and numpy version.
"""

from __future__ import annotations

import os

import numpy as np

from ..gguf import GGMLType, GGUFValueType, GGUFWriter
from ..gguf.constants import GGML_BLOCK_SIZES

# f16 fields of each block: (byte offset, scale) -- scales make weights of std ~0.05
_SCALES: dict[GGMLType, tuple[tuple[int, float], ...]] = {
    GGMLType.Q4_0: ((0, 0.011),),
    GGMLType.Q4_1: ((0, 0.011), (2, -0.08)),
    GGMLType.Q5_0: ((0, 0.0055),),
    GGMLType.Q5_1: ((0, 0.0055), (2, -0.08)),
    GGMLType.Q8_0: ((0, 0.0007),),
    GGMLType.IQ4_NL: ((0, 0.0008),),
    GGMLType.Q2_K: ((80, 0.0022), (82, 0.0022)),
    GGMLType.Q3_K: ((108, 0.00075),),
    GGMLType.Q4_K: ((0, 0.00035), (2, 0.0003)),
    GGMLType.Q5_K: ((0, 0.00018), (2, 0.0003)),
    GGMLType.Q6_K: ((208, 0.00022),),
    GGMLType.IQ4_XS: ((0, 0.00003),),
}
TINY_SHAPE = {
    "n_embd": 256,
    "n_head": 4,
    "n_head_kv": 2,
    "n_ff": 512,
    "n_layer": 2,
    "n_vocab": 259,
    "n_ctx": 256,
}


def random_tensor(rng: np.random.Generator, t: GGMLType, nrows: int, ncols: int) -> np.ndarray:
    """Bytes of a random ``[nrows, ncols]`` tensor of type ``t`` (ggml layout)."""
    t = GGMLType(t)
    if t == GGMLType.F32:
        return _normal(rng, nrows * ncols).astype(np.float32).view(np.uint8)
    if t == GGMLType.F16:
        return _normal(rng, nrows * ncols).astype(np.float16).view(np.uint8)
    if t == GGMLType.BF16:
        bits = _normal(rng, nrows * ncols).astype(np.float32).view(np.uint32) >> 16
        return bits.astype(np.uint16).view(np.uint8)
    qk, size = GGML_BLOCK_SIZES[t]
    nblk = nrows * ncols // qk
    raw = np.frombuffer(rng.bytes(nblk * size), np.uint8).reshape(nblk, size).copy()
    for off, scale in _SCALES[t]:
        u = np.frombuffer(rng.bytes(2 * nblk), np.uint16).astype(np.float32) / 65535.0
        val = (scale * (0.5 + u)).astype(np.float16)  # in [0.5, 1.5] x scale
        raw[:, off : off + 2] = val.view(np.uint8).reshape(nblk, 2)
    return raw.reshape(-1)


def _normal(rng: np.random.Generator, n: int) -> np.ndarray:
    """Approximately normal(0, 0.05) from raw bytes (stable across numpy versions)."""
    u = np.frombuffer(rng.bytes(8 * n), np.uint16).reshape(n, 4).astype(np.float64)
    return ((u.sum(1) / 65535.0 - 2.0) * (0.05 / 0.577)).astype(np.float32)


def write_tiny_llama(
    path: str | os.PathLike[str],
    weight_type: GGMLType | int,
    seed: int = 0,
    rope: str = "none",
    **shape: int,
) -> None:
    """Write a tiny random llama GGUF with every matrix of type ``weight_type``.

    ``rope``: ``"none"``; ``"linear"`` (factor 2); ``"yarn"`` (factor 4 over an original
    context of 64); ``"llama3"`` (a ``rope_freqs.weight`` tensor of frequency factors).
    """
    s = {**TINY_SHAPE, **shape}
    e, f, v = s["n_embd"], s["n_ff"], s["n_vocab"]
    hd = e // s["n_head"]
    kvd = hd * s["n_head_kv"]
    rng = np.random.default_rng(seed)
    w = GGUFWriter(path)
    w.add("general.architecture", "llama")
    w.add("general.name", f"tiny-llama-{GGMLType(weight_type).name.lower()}")
    w.add("llama.context_length", s["n_ctx"], GGUFValueType.UINT32)
    w.add("llama.embedding_length", e, GGUFValueType.UINT32)
    w.add("llama.block_count", s["n_layer"], GGUFValueType.UINT32)
    w.add("llama.feed_forward_length", f, GGUFValueType.UINT32)
    w.add("llama.attention.head_count", s["n_head"], GGUFValueType.UINT32)
    w.add("llama.attention.head_count_kv", s["n_head_kv"], GGUFValueType.UINT32)
    w.add("llama.rope.dimension_count", hd, GGUFValueType.UINT32)
    w.add("llama.rope.freq_base", 10000.0, GGUFValueType.FLOAT32)
    w.add("llama.attention.layer_norm_rms_epsilon", 1e-5, GGUFValueType.FLOAT32)
    if rope in ("linear", "yarn"):
        w.add("llama.rope.scaling.type", rope)
        w.add("llama.rope.scaling.factor", 2.0 if rope == "linear" else 4.0, GGUFValueType.FLOAT32)
    if rope == "yarn":
        w.add("llama.rope.scaling.original_context_length", 64, GGUFValueType.UINT32)
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(v - 3)]
    w.add("tokenizer.ggml.model", "llama")
    w.add("tokenizer.ggml.tokens", tokens, GGUFValueType.ARRAY, GGUFValueType.STRING)
    w.add("tokenizer.ggml.scores", np.zeros(v, np.float32))
    w.add("tokenizer.ggml.token_type", np.array([2, 3, 3] + [6] * (v - 3), np.int32))
    w.add("tokenizer.ggml.bos_token_id", 1, GGUFValueType.UINT32)
    w.add("tokenizer.ggml.eos_token_id", 2, GGUFValueType.UINT32)
    w.add("tokenizer.ggml.add_bos_token", False)
    t = GGMLType(weight_type)

    def norm() -> np.ndarray:
        return (1.0 + _normal(rng, e)).astype(np.float32)

    w.add_tensor("token_embd.weight", t, (e, v), random_tensor(rng, t, v, e))
    for i in range(s["n_layer"]):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", GGMLType.F32, (e,), norm())
        w.add_tensor(p + "attn_q.weight", t, (e, e), random_tensor(rng, t, e, e))
        w.add_tensor(p + "attn_k.weight", t, (e, kvd), random_tensor(rng, t, kvd, e))
        w.add_tensor(p + "attn_v.weight", t, (e, kvd), random_tensor(rng, t, kvd, e))
        w.add_tensor(p + "attn_output.weight", t, (e, e), random_tensor(rng, t, e, e))
        w.add_tensor(p + "ffn_norm.weight", GGMLType.F32, (e,), norm())
        w.add_tensor(p + "ffn_gate.weight", t, (e, f), random_tensor(rng, t, f, e))
        w.add_tensor(p + "ffn_up.weight", t, (e, f), random_tensor(rng, t, f, e))
        w.add_tensor(p + "ffn_down.weight", t, (f, e), random_tensor(rng, t, e, f))
    w.add_tensor("output_norm.weight", GGMLType.F32, (e,), norm())
    w.add_tensor("output.weight", t, (e, v), random_tensor(rng, t, v, e))
    if rope == "llama3":
        freqs = np.geomspace(1.0, 8.0, hd // 2).astype(np.float32)
        w.add_tensor("rope_freqs.weight", GGMLType.F32, (hd // 2,), freqs)
    w.write()
