"""Tiny random models, deterministic from a seed, for tests of every architecture and format.

``write_tiny_llama(path, weight_type, seed)`` writes a 2-layer llama GGUF whose matrices are
random blocks of the given ggml type (random quants, scales chosen so weights have a
standard deviation of about 0.05) and whose vocabulary is 259 SentencePiece byte tokens, so
llama.cpp loads it too. ``arch`` picks a variant of the same decoder: ``qwen2`` (Q/K/V
biases), ``qwen3`` (per-head Q/K norms, head size 32 != n_embd/n_head), ``phi3`` (fused
``attn_qkv`` and gate|up ``ffn_up``, ``rope_factors_long/short`` and a rope attention
factor), ``gemma3`` (Q/K norms, post-norms, layers alternating sliding-window and global
attention, window 4), ``gemma2`` (post-norms, even layers sliding-window with window 4 and
their own rope base, attention and final logit soft-caps small enough to bite, the output
tied to ``token_embd``), ``olmo2`` (no pre-norms, Q/K norms over the whole projections,
post-norms), ``smollm3`` (4 layers: the fourth without rope), ``qwen3moe`` (qwen3's
attention, a mixture of 4 experts of FFN size 64, 2 used per token), ``gpt-oss`` (q/k/v/o
biases, attention sinks, layers alternating sliding-window and full attention, window 4,
YaRN rope, a post-attention norm, 4 biased experts of FFN size 64 with 2 used; expert biases
large enough to reach the clamps of its SwiGLU; ``experts_type`` sets the experts' type,
e.g. MXFP4 as the released files have them); ``n_expert`` > 0 gives
a ``llama`` file experts (Mixtral: 2 used, of FFN size ``n_ff``); ``gemma4`` (3 layers: local,
local, global with window 4; Q/K norms, value norms, post-norms, the global layer's
proportional rope factors, layer output scales, final soft-cap 3; with ``n_expert``, a dense
FFN beside the experts, their router scale, norms and output scales, ``gate_up_fused``
giving their gate and up in one tensor); ``deepseek2`` goes to
:func:`write_tiny_deepseek2` (latent attention, grouped and shared experts); ``sliding_window`` adds
``{arch}.attention.sliding_window`` (mistral-style files). ``write_tiny_bert`` writes a tiny random ``bert`` encoder.
Only numpy and the GGUF writer are used: the file is byte-identical for a given seed, type,
arch and numpy version.
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
    GGMLType.IQ2_XXS: ((0, 0.0012),),
    GGMLType.IQ2_XS: ((0, 0.0012),),
    GGMLType.IQ2_S: ((0, 0.0012),),
    GGMLType.IQ3_XXS: ((0, 0.0004),),
    GGMLType.IQ3_S: ((0, 0.0001),),
    GGMLType.IQ1_S: ((0, 0.006),),
    GGMLType.TQ1_0: ((52, 0.05),),
    GGMLType.TQ2_0: ((64, 0.05),),
    GGMLType.Q1_0: ((0, 0.05),),
    GGMLType.Q2_0: ((0, 0.04),),
}
# IQ1_M keeps its f16 scale in the top nibbles of its four 16-bit scale words (at byte 48)
_IQ1M_SCALES, _IQ1M_D = 48, 0.006
# E8M0 exponent bytes of each block: (byte offset, lowest, highest) -- scales 2**(e - 128)
# from 2**-8 to 2**-6, weights of std ~0.05
# NVFP4's four UE4M3 scale bytes: 2**-6 .. 2**-5.4 (halved: E2M1 values are doubled)
_EXPONENTS: dict[GGMLType, tuple[tuple[int, int, int], ...]] = {
    GGMLType.MXFP4: ((0, 120, 122),),
    GGMLType.NVFP4: ((0, 8, 12), (1, 8, 12), (2, 8, 12), (3, 8, 12)),
}
TINY_ARCHS = (
    "llama", "qwen2", "qwen3", "phi3", "gemma3", "smollm3", "qwen3moe", "gpt-oss", "gemma2",
    "olmo2", "deepseek2", "gemma4",
)  # fmt: skip
# gemma4 files as released, tiny (see TINY_SHAPE): 31B's and E2B's layouts
GEMMA4_31B = {"head_dim_swa": 32, "n_head_kv_global": 1, "v_from_k": 1}
GEMMA4_E2B = {
    "n_layer": 6, "head_dim_swa": 32, "n_kv_shared": 3, "n_embd_per_layer": 32,
    "ff_shared_x2": 1,
}  # fmt: skip
# Variants of an architecture that run other stages: name -> (arch, builder options)
TINY_VARIANTS: dict[str, tuple[str, dict]] = {
    "mixtral": ("llama", {"n_expert": 4}),
    "qwen3moe_router_f32": ("qwen3moe", {"router_f32": 1}),  # F32 router, quantized experts
    "gemma4_moe": ("gemma4", {"n_expert": 4, "n_ff_exp": 64}),  # a dense FFN beside experts
    "gemma4_31b": ("gemma4", GEMMA4_31B),  # local heads of their own size, values from keys
    "gemma4_e2b": ("gemma4", GEMMA4_E2B),  # shared KV layers, per-layer embeddings
}
# Cases compared with llama.cpp's logits and greedy text (tests/test_architectures.py,
# fixtures from scripts/make_arch_fixtures.py): name -> (arch, builder options, n_ctx)
LLAMA_CPP_CASES: dict[str, tuple[str, dict, int]] = {
    "qwen2": ("qwen2", {}, 64),
    "qwen3": ("qwen3", {}, 64),
    "phi3": ("phi3", {}, 256),  # short rope factors
    "phi3_long": ("phi3", {}, 512),  # long rope factors (context above the original 256)
    "llama_swa": ("llama", {"sliding_window": 4}, 64),  # the key is ignored for llama
    "smollm3": ("smollm3", {}, 64),
    "qwen3moe": ("qwen3moe", {}, 64),
    "qwen3moe_router_f32": ("qwen3moe", {"router_f32": 1}, 64),  # as converted files
    "mixtral": ("llama", {"n_expert": 4}, 64),  # a llama file with experts
    "gpt-oss": ("gpt-oss", {}, 64),
    "gpt-oss_mxfp4": ("gpt-oss", {"experts_type": int(GGMLType.MXFP4)}, 64),  # as released
    "gemma2": ("gemma2", {}, 64),
    "olmo2": ("olmo2", {}, 64),
    # OLMo 3's files: layers 0-2 sliding-window (window 4), 3 global; YaRN on the global one
    "olmo2_swa": ("olmo2", {"sliding_window": 4, "n_layer": 4, "rope": "yarn"}, 64),
    # V3's router (sigmoid, selection bias, 4 groups of which 2, weights normalized, scaled)
    "deepseek2": ("deepseek2", {}, 64),
    "deepseek2_v2": ("deepseek2", {"gating": 1, "groups": 0, "weights_norm": 0}, 64),
    "deepseek2_yarn": ("deepseek2", {"rope": "yarn"}, 64),  # DeepSeek's YaRN and kq_scale
    # V2-Lite's layout: q without low rank (llama.cpp: only in files of 26 or 27 layers);
    # V3's router (with V2's, token 15 of the F32 file meets a near tie of two experts)
    "deepseek2_lite": ("deepseek2", {"q_lora": 0, "n_layer": 26}, 64),
    # layers local, local, global (window 4); proportional rope factors on the global one
    "gemma4": ("gemma4", {}, 64),
    # 26B-A4B's layers: a dense GEGLU FFN beside 4 GEGLU experts of FFN size 64, 2 used
    "gemma4_moe": ("gemma4", {"n_expert": 4, "n_ff_exp": 64}, 64),
    # the experts' gate and up fused in ffn_gate_up_exps, as converted files have them
    "gemma4_moe_fused": ("gemma4", {"n_expert": 4, "n_ff_exp": 64, "gate_up_fused": 1}, 64),
    # 31B's layout: local layers of head size 32 (global 64), the global one with 1 KV head
    # and its values read from its keys (no attn_v)
    "gemma4_31b": ("gemma4", GEMMA4_31B, 64),
    # E2B's layout: 6 layers (local, local, global) x 2, the last 3 reading the KV of layers
    # 1 (local) and 2 (global) with FFNs twice as wide, per-layer embeddings of 32
    "gemma4_e2b": ("gemma4", GEMMA4_E2B, 64),
}
GEMMA2_SOFTCAPS = (1.0, 3.0)  # tiny gemma2: attention and final logit soft-caps
GEMMA4_SWA = (True, True, False)  # tiny gemma4: its layers' sliding-window flags
GEMMA4_SOFTCAP = 3.0  # and its final logit soft-cap
PHI3_ORIG_CTX = 256  # phi3: rope.scaling.original_context_length (long factors above it)
PHI3_N_CTX = 1024  # phi3: context_length
TINY_SHAPE = {
    "n_embd": 256,
    "n_head": 4,
    "n_head_kv": 2,
    "n_ff": 512,
    "n_layer": 2,
    "n_vocab": 259,
    "n_ctx": 256,
    "n_expert": 0,  # mixture of experts (0: a dense FFN)
    "n_expert_used": 2,
    "n_ff_exp": 0,  # qwen3moe's expert_feed_forward_length (0: none)
    "router_f32": 0,  # 1: ffn_gate_inp in F32 (as converted files keep it), not weight_type
    "experts_type": -1,  # the experts' ggml type (-1: weight_type)
    "head_dim": 0,  # attention.key_length (0: the architecture's tiny default)
    "gate_up_fused": 0,  # 1: the experts' gate and up in one ffn_gate_up_exps (gemma4)
    # gemma4 as released: the local layers' head size (0: head_dim's), the global layers' KV
    # heads (0: n_head_kv), 1: the global layers' values read from their keys (no attn_v),
    # the last n_kv_shared layers reading earlier layers' KV, per-layer embeddings of this
    # size, 1: those shared layers' FFN twice as wide (feed_forward_length per layer)
    "head_dim_swa": 0,
    "n_head_kv_global": 0,
    "v_from_k": 0,
    "n_kv_shared": 0,
    "n_embd_per_layer": 0,
    "ff_shared_x2": 0,
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
    for off, scale in _SCALES.get(t, ()):
        u = np.frombuffer(rng.bytes(2 * nblk), np.uint16).astype(np.float32) / 65535.0
        val = (scale * (0.5 + u)).astype(np.float16)  # in [0.5, 1.5] x scale
        raw[:, off : off + 2] = val.view(np.uint8).reshape(nblk, 2)
    for off, lo, hi in _EXPONENTS.get(t, ()):
        raw[:, off] = lo + np.frombuffer(rng.bytes(nblk), np.uint8) % (hi - lo + 1)
    if t == GGMLType.IQ1_M:
        u = np.frombuffer(rng.bytes(2 * nblk), np.uint16).astype(np.float32) / 65535.0
        bits = (_IQ1M_D * (0.5 + u)).astype(np.float16).view(np.uint16).astype(np.int64)
        for k in range(4):  # nibble k of d -> the high nibble of word k's high byte
            b = _IQ1M_SCALES + 2 * k + 1
            raw[:, b] = (raw[:, b] & 0x0F) | (((bits >> (4 * k)) & 0xF) << 4)
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
    arch: str = "llama",
    sliding_window: int = 0,
    attn_factor: float = 1.2,
    **shape: int,
) -> None:
    """Write a tiny random GGUF of ``arch`` with every matrix of type ``weight_type``.

    ``rope``: ``"none"``; ``"linear"`` (factor 2); ``"yarn"`` (factor 4 over an original
    context of 64); ``"llama3"`` (a ``rope_freqs.weight`` tensor of frequency factors).
    ``attn_factor``: phi3's ``rope.scaling.attn_factor``.
    """
    if arch not in TINY_ARCHS:
        raise ValueError(f"tiny models exist for {', '.join(TINY_ARCHS)}, not {arch!r}")
    if arch == "deepseek2":  # (its own layout: latent attention, grouped experts)
        return write_tiny_deepseek2(path, weight_type, seed, rope, **shape)
    own = {
        "phi3": {"n_ctx": PHI3_N_CTX},
        "smollm3": {"n_layer": 4},
        "qwen3moe": {"n_expert": 4, "n_ff_exp": 64},
        "gpt-oss": {"n_expert": 4, "n_ff_exp": 64},
        "gemma4": {"n_layer": len(GEMMA4_SWA)},
    }.get(arch, {})
    if arch == "gpt-oss":
        rope = "yarn" if rope == "none" else rope
        sliding_window = sliding_window or 4
    s = {**TINY_SHAPE, **own, **shape}
    hd = s["head_dim"] or (32 if arch in ("qwen3", "qwen3moe") else s["n_embd"] // s["n_head"])
    w = GGUFWriter(path)
    w.add("general.architecture", arch)
    # (llama.cpp keys vocabulary fix-ups on names containing "phi3": keep the arch out)
    label = "llama" if arch == "llama" else "random"
    w.add("general.name", f"tiny-{label}-{GGMLType(weight_type).name.lower()}")
    _add_hparams(w, arch, s, hd, rope, sliding_window, attn_factor)
    _add_byte_vocab(w, s["n_vocab"])
    rng = np.random.default_rng(seed)
    _add_tensors(w, rng, GGMLType(weight_type), arch, s, hd, rope)
    w.write()


def _add_hparams(w, a: str, s: dict, hd: int, rope: str, sliding_window: int, attn_factor):
    """The architecture's keys (``a``: the architecture, ``s``: the shape)."""
    w.add(f"{a}.context_length", s["n_ctx"], GGUFValueType.UINT32)
    w.add(f"{a}.embedding_length", s["n_embd"], GGUFValueType.UINT32)
    w.add(f"{a}.block_count", s["n_layer"], GGUFValueType.UINT32)
    if s["ff_shared_x2"]:  # (gemma4: the shared KV layers' FFN twice as wide)
        first = s["n_layer"] - s["n_kv_shared"]
        ffs = [s["n_ff"] * (2 if i >= first else 1) for i in range(s["n_layer"])]
        w.add(f"{a}.feed_forward_length", ffs, GGUFValueType.ARRAY, GGUFValueType.UINT32)
    else:
        w.add(f"{a}.feed_forward_length", s["n_ff"], GGUFValueType.UINT32)
    w.add(f"{a}.attention.head_count", s["n_head"], GGUFValueType.UINT32)
    if s["n_head_kv_global"]:  # (gemma4: per layer, the global layers' own count)
        kvs = [_gemma4_layer(s, hd, i)[1] for i in range(s["n_layer"])]
        w.add(f"{a}.attention.head_count_kv", kvs, GGUFValueType.ARRAY, GGUFValueType.UINT32)
    else:
        w.add(f"{a}.attention.head_count_kv", s["n_head_kv"], GGUFValueType.UINT32)
    if s["n_expert"]:
        w.add(f"{a}.expert_count", s["n_expert"], GGUFValueType.UINT32)
        w.add(f"{a}.expert_used_count", s["n_expert_used"], GGUFValueType.UINT32)
    if s["n_ff_exp"]:
        w.add(f"{a}.expert_feed_forward_length", s["n_ff_exp"], GGUFValueType.UINT32)
    if a in ("qwen3", "qwen3moe", "gemma4") or s["head_dim"]:
        w.add(f"{a}.attention.key_length", hd, GGUFValueType.UINT32)
        w.add(f"{a}.attention.value_length", hd, GGUFValueType.UINT32)
    w.add(f"{a}.rope.dimension_count", hd, GGUFValueType.UINT32)
    w.add(f"{a}.rope.freq_base", 10000.0, GGUFValueType.FLOAT32)
    w.add(f"{a}.attention.layer_norm_rms_epsilon", 1e-5, GGUFValueType.FLOAT32)
    if a == "gemma3":
        sliding_window = sliding_window or 4
        w.add(f"{a}.attention.sliding_window_pattern", 2, GGUFValueType.UINT32)
        w.add(f"{a}.rope.freq_base_swa", 1000.0, GGUFValueType.FLOAT32)
    if a == "gemma2":  # (the pattern is gemma2's default: even layers local)
        sliding_window = sliding_window or 4
        w.add(f"{a}.rope.freq_base_swa", 1000.0, GGUFValueType.FLOAT32)
        attn_cap, final_cap = GEMMA2_SOFTCAPS
        w.add(f"{a}.attn_logit_softcapping", attn_cap, GGUFValueType.FLOAT32)
        w.add(f"{a}.final_logit_softcapping", final_cap, GGUFValueType.FLOAT32)
    if a == "gemma4":
        sliding_window = sliding_window or 4
        _add_gemma4_hparams(w, a, s, hd)
    if sliding_window:
        w.add(f"{a}.attention.sliding_window", sliding_window, GGUFValueType.UINT32)
    if a == "phi3":
        w.add(f"{a}.rope.scaling.original_context_length", PHI3_ORIG_CTX, GGUFValueType.UINT32)
        w.add(f"{a}.rope.scaling.attn_factor", attn_factor, GGUFValueType.FLOAT32)
    if rope in ("linear", "yarn"):
        w.add(f"{a}.rope.scaling.type", rope)
        w.add(f"{a}.rope.scaling.factor", 2.0 if rope == "linear" else 4.0, GGUFValueType.FLOAT32)
    if rope == "yarn":
        w.add(f"{a}.rope.scaling.original_context_length", 64, GGUFValueType.UINT32)


def _add_gemma4_hparams(w, a: str, s: dict, hd: int) -> None:
    """gemma4's own keys: the layers' window flags, the local layers' head size and rope
    base, no shared KV layers, no per-layer embeddings, the final soft-cap."""
    swa = [GEMMA4_SWA[i % len(GEMMA4_SWA)] for i in range(s["n_layer"])]
    w.add(f"{a}.attention.sliding_window_pattern", swa, GGUFValueType.ARRAY, GGUFValueType.BOOL)
    hd_swa = s["head_dim_swa"] or hd
    w.add(f"{a}.attention.key_length_swa", hd_swa, GGUFValueType.UINT32)
    w.add(f"{a}.attention.value_length_swa", hd_swa, GGUFValueType.UINT32)
    if s["head_dim_swa"]:
        w.add(f"{a}.rope.dimension_count_swa", hd_swa, GGUFValueType.UINT32)
    w.add(f"{a}.attention.shared_kv_layers", s["n_kv_shared"], GGUFValueType.UINT32)
    npl = s["n_embd_per_layer"]
    w.add(f"{a}.embedding_length_per_layer_input", npl, GGUFValueType.UINT32)
    w.add(f"{a}.rope.freq_base_swa", 1000.0, GGUFValueType.FLOAT32)
    w.add(f"{a}.final_logit_softcapping", GEMMA4_SOFTCAP, GGUFValueType.FLOAT32)


def _gemma4_layer(s: dict, hd: int, il: int) -> tuple[int, int, bool, bool, int]:
    """Layer ``il`` of a tiny gemma4: head size, KV heads, whether it has KV of its own,
    whether it has ``attn_v``, FFN size."""
    local = GEMMA4_SWA[il % len(GEMMA4_SWA)]
    own = il < s["n_layer"] - s["n_kv_shared"]
    hd_l = (s["head_dim_swa"] or hd) if local else hd
    kvh = s["n_head_kv"] if local or not s["n_head_kv_global"] else s["n_head_kv_global"]
    ff = s["n_ff"] * (2 if s["ff_shared_x2"] and not own else 1)
    return hd_l, kvh, own, own and not (s["v_from_k"] and not local), ff


def gemma4_rope_freqs(hd: int, rotated: float = 0.25) -> np.ndarray:
    """The converter's "proportional" rope factors of a global layer: 1 for the first
    ``rotated`` of the pairs, 1e30 (no rotation) for the others."""
    n = int(hd * rotated / 2)
    return np.array([1.0] * n + [1e30] * (hd // 2 - n), np.float32)


def _add_byte_vocab(w, v: int) -> None:
    """A SentencePiece vocabulary of ``v`` tokens: <unk>, <s>, </s> and byte tokens."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(v - 3)]
    w.add("tokenizer.ggml.model", "llama")
    w.add("tokenizer.ggml.tokens", tokens, GGUFValueType.ARRAY, GGUFValueType.STRING)
    w.add("tokenizer.ggml.scores", np.zeros(v, np.float32))
    w.add("tokenizer.ggml.token_type", np.array([2, 3, 3] + [6] * (v - 3), np.int32))
    w.add("tokenizer.ggml.bos_token_id", 1, GGUFValueType.UINT32)
    w.add("tokenizer.ggml.eos_token_id", 2, GGUFValueType.UINT32)
    w.add("tokenizer.ggml.add_bos_token", False)


def _writers(w, rng, t: GGMLType, e: int):
    """(``mat``, ``vec``, ``norm``): add a random matrix (``n`` > 1: 3-D, one per expert) of
    type ``t`` (or ``typ``), add an F32 tensor, draw a norm's weights of ``n`` (default ``e``)."""

    def mat(name: str, nrows: int, ncols: int, n: int = 1, typ: GGMLType | None = None) -> None:
        typ = t if typ is None else typ
        shape = (ncols, nrows) if n == 1 else (ncols, nrows, n)
        w.add_tensor(name, typ, shape, random_tensor(rng, typ, nrows * n, ncols))

    def vec(name: str, x: np.ndarray, shape: tuple[int, ...] | None = None) -> None:
        x = np.asarray(x, np.float32)
        w.add_tensor(name, GGMLType.F32, shape or (x.size,), x.reshape(-1))

    def norm(n: int = e) -> np.ndarray:
        return (1.0 + _normal(rng, n)).astype(np.float32)

    return mat, vec, norm


def _add_tensors(w, rng, t: GGMLType, arch: str, s: dict, hd: int, rope: str) -> None:
    """Random tensors of every layer and the global ones (drawn from ``rng`` in file order)."""
    e, v = s["n_embd"], s["n_vocab"]
    mat, vec, norm = _writers(w, rng, t, e)
    mat("token_embd.weight", v, e)
    for i in range(s["n_layer"]):
        _add_layer(f"blk.{i}.", arch, s, hd, mat, vec, norm, rng, i)
    vec("output_norm.weight", norm())
    if arch != "gemma2":  # (gemma2: the output is token_embd; gemma4's may be, not here)
        mat("output.weight", v, e)
    if arch == "gemma4":
        vec("rope_freqs.weight", gemma4_rope_freqs(hd))
    if arch == "gemma4" and s["n_embd_per_layer"]:  # per-layer embeddings (global tensors)
        ple = s["n_layer"] * s["n_embd_per_layer"]
        mat("per_layer_token_embd.weight", v, ple)
        mat("per_layer_model_proj.weight", ple, e)
        vec("per_layer_proj_norm.weight", norm(s["n_embd_per_layer"]))
    if rope == "llama3":
        vec("rope_freqs.weight", np.geomspace(1.0, 8.0, hd // 2).astype(np.float32))
    if arch == "phi3":
        vec("rope_factors_long.weight", np.geomspace(1.0, 6.0, hd // 2).astype(np.float32))
        vec("rope_factors_short.weight", np.geomspace(1.0, 1.5, hd // 2).astype(np.float32))


def _add_layer(p: str, arch: str, s: dict, hd: int, mat, vec, norm, rng, il: int = 0) -> None:
    e, f = s["n_embd"], s["n_ff"]
    own = has_v = True
    if arch == "gemma4":  # (the layer's own geometry; shared KV layers: no k, v)
        hd, kvh, own, has_v, f = _gemma4_layer(s, hd, il)
        s = {**s, "n_head_kv": kvh}
    qd, kvd = hd * s["n_head"], hd * s["n_head_kv"]
    if arch != "olmo2":  # (olmo2: no pre-norms)
        vec(p + "attn_norm.weight", norm())
    if arch == "phi3":
        mat(p + "attn_qkv.weight", qd + 2 * kvd, e)
    else:
        mat(p + "attn_q.weight", qd, e)
        if own:
            mat(p + "attn_k.weight", kvd, e)
        if has_v:
            mat(p + "attn_v.weight", kvd, e)
    if arch == "qwen2":  # biases of std 0.5: large enough to matter
        for name, n in (("attn_q", qd), ("attn_k", kvd), ("attn_v", kvd)):
            vec(p + name + ".bias", 10.0 * _normal(rng, n))
    if arch == "gpt-oss":
        for name, n in (("attn_q", qd), ("attn_k", kvd), ("attn_v", kvd)):
            vec(p + name + ".bias", _normal(rng, n))
    if arch in ("qwen3", "qwen3moe", "gemma3", "gemma4"):
        vec(p + "attn_q_norm.weight", norm(hd))
        if own:
            vec(p + "attn_k_norm.weight", norm(hd))
    if arch == "olmo2":  # over the whole projections
        vec(p + "attn_q_norm.weight", norm(qd))
        vec(p + "attn_k_norm.weight", norm(kvd))
    mat(p + "attn_output.weight", e, qd)
    if arch == "gpt-oss":  # sinks of std 1: as large as the scores
        vec(p + "attn_output.bias", _normal(rng, e))
        vec(p + "attn_sinks.weight", 20.0 * _normal(rng, s["n_head"]))
    if arch in ("gemma3", "gpt-oss", "gemma2", "olmo2", "gemma4"):
        vec(p + "post_attention_norm.weight", norm())
    if arch not in ("gpt-oss", "olmo2"):
        vec(p + "ffn_norm.weight", norm())
    if s["n_expert"] and arch != "gemma4":
        _add_experts(p, s, mat, vec if arch == "gpt-oss" else None, rng)
    elif arch == "phi3":
        mat(p + "ffn_up.weight", 2 * f, e)
    else:
        mat(p + "ffn_gate.weight", f, e)
        mat(p + "ffn_up.weight", f, e)
    if not s["n_expert"] or arch == "gemma4":
        mat(p + "ffn_down.weight", e, f)
    if arch == "gemma4" and s["n_expert"]:  # the dense FFN beside the experts
        _add_gemma4_experts(p, s, mat, vec, norm, rng)
    if arch in ("gemma3", "gemma2", "olmo2", "gemma4"):
        vec(p + "post_ffw_norm.weight", norm())
    if arch == "gemma4" and s["n_embd_per_layer"]:  # the layer's per-layer embedding
        mat(p + "inp_gate.weight", s["n_embd_per_layer"], e)
        mat(p + "proj.weight", e, s["n_embd_per_layer"])
        vec(p + "post_norm.weight", norm())
    if arch == "gemma4":  # (in [0.5, 1.5])
        vec(p + "layer_output_scale.weight", 1.0 + 10.0 * _normal(rng, 1))


def _add_gemma4_experts(p: str, s: dict, mat, vec, norm, rng) -> None:
    """gemma4's experts beside its dense FFN: the router and its input scale (std 0.5 around
    1), the experts' norms, their matrices and output scales (in [0.5, 1.5])."""
    e, n = s["n_embd"], s["n_expert"]
    if s["gate_up_fused"]:  # (as the converter writes them: each expert's rows gate | up)
        mat(p + "ffn_gate_inp.weight", n, e)
        mat(p + "ffn_gate_up_exps.weight", 2 * s["n_ff_exp"], e, n)
        mat(p + "ffn_down_exps.weight", e, s["n_ff_exp"], n)
    else:
        _add_experts(p, s, mat, None, rng)
    vec(p + "ffn_gate_inp.scale", norm())
    vec(p + "ffn_down_exps.scale", 1.0 + 10.0 * _normal(rng, n))
    for name in ("pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2"):
        vec(p + name + ".weight", norm(e))


def _add_experts(p: str, s: dict, mat, vec, rng) -> None:
    """The router and the experts' 3-D tensors (``[n_expert, rows, cols]``); with ``vec``,
    their biases (router std 0.5; gate and up std 3, so that some pass the clamps of
    gpt-oss's SwiGLU; down std 0.5)."""
    e, n = s["n_embd"], s["n_expert"]
    f = s["n_ff_exp"] or s["n_ff"]
    xt = None if s["experts_type"] < 0 else GGMLType(s["experts_type"])
    mat(p + "ffn_gate_inp.weight", n, e, typ=GGMLType.F32 if s["router_f32"] else None)
    if vec:
        vec(p + "ffn_gate_inp.bias", 10.0 * _normal(rng, n))
    for name, rows, cols, std in (("gate", f, e, 60.0), ("up", f, e, 60.0), ("down", e, f, 10.0)):
        mat(p + f"ffn_{name}_exps.weight", rows, cols, n, typ=xt)
        if vec:
            vec(p + f"ffn_{name}_exps.bias", std * _normal(rng, rows * n), (rows, n))


def write_tiny_bert(
    path: str | os.PathLike[str], weight_type: GGMLType | int, seed: int = 0
) -> None:
    """Write a tiny random 2-layer ``bert`` encoder GGUF (matrices of ``weight_type``; a
    WordPiece vocabulary of 259 tokens; mean pooling)."""
    e, f, n_layer, v, n_ctx = 128, 256, 2, 259, 128
    rng = np.random.default_rng(seed)
    w = GGUFWriter(path)
    w.add("general.architecture", "bert")
    w.add("general.name", f"tiny-bert-{GGMLType(weight_type).name.lower()}")
    for key, val in (("context_length", n_ctx), ("embedding_length", e),
                     ("feed_forward_length", f), ("block_count", n_layer),
                     ("attention.head_count", 4), ("pooling_type", 1)):  # fmt: skip
        w.add(f"bert.{key}", val, GGUFValueType.UINT32)
    w.add("bert.attention.layer_norm_epsilon", 1e-12, GGUFValueType.FLOAT32)
    w.add("bert.attention.causal", False)
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"t{i}" for i in range(v - 5)]
    w.add("tokenizer.ggml.model", "bert")
    w.add("tokenizer.ggml.tokens", tokens, GGUFValueType.ARRAY, GGUFValueType.STRING)
    w.add("tokenizer.ggml.token_type", np.array([3] * 5 + [1] * (v - 5), np.int32))
    w.add("tokenizer.ggml.unknown_token_id", 1, GGUFValueType.UINT32)
    w.add("tokenizer.ggml.cls_token_id", 2, GGUFValueType.UINT32)
    w.add("tokenizer.ggml.seperator_token_id", 3, GGUFValueType.UINT32)
    t = GGMLType(weight_type)

    def vec(name: str, n: int, mean: float) -> None:
        w.add_tensor(name, GGMLType.F32, (n,), (mean + _normal(rng, n)).astype(np.float32))

    def mat(name: str, nrows: int, ncols: int) -> None:
        w.add_tensor(name, t, (ncols, nrows), random_tensor(rng, t, nrows, ncols))

    mat("token_embd.weight", v, e)
    w.add_tensor("token_types.weight", GGMLType.F32, (e, 2), _normal(rng, 2 * e))
    w.add_tensor("position_embd.weight", GGMLType.F32, (e, n_ctx), _normal(rng, n_ctx * e))
    vec("token_embd_norm.weight", e, 1.0)
    vec("token_embd_norm.bias", e, 0.0)
    for i in range(n_layer):
        p = f"blk.{i}."
        for name, nrows, ncols in (("attn_q", e, e), ("attn_k", e, e), ("attn_v", e, e),
                                   ("attn_output", e, e)):  # fmt: skip
            mat(p + name + ".weight", nrows, ncols)
            vec(p + name + ".bias", nrows, 0.0)
        vec(p + "attn_output_norm.weight", e, 1.0)
        vec(p + "attn_output_norm.bias", e, 0.0)
        mat(p + "ffn_up.weight", f, e)
        vec(p + "ffn_up.bias", f, 0.0)
        mat(p + "ffn_down.weight", e, f)
        vec(p + "ffn_down.bias", e, 0.0)
        vec(p + "layer_output_norm.weight", e, 1.0)
        vec(p + "layer_output_norm.bias", e, 0.0)
    w.write()


# qwen35 (Qwen3.5 dense): Gated DeltaNet layers and every fourth layer gated full attention
QWEN35_SHAPE = {
    "n_embd": 256,
    "n_layer": 4,
    "n_ff": 512,
    "n_head": 4,
    "n_head_kv": 2,
    "head_dim": 64,
    "n_rot": 16,  # a quarter of the head (partial rotary factor 0.25)
    "d_conv": 4,
    "d_state": 32,  # head size of the delta rule's keys and values
    "n_group": 2,  # key heads
    "dt_rank": 4,  # value heads (tiled over the key heads as ggml broadcasts)
    "n_vocab": 259,
    "n_ctx": 256,
    "n_expert": 0,  # qwen35moe: routed experts (0: a dense FFN)
}
QWEN35MOE_SHAPE = {**QWEN35_SHAPE, "n_expert": 4, "n_expert_used": 2, "n_ff_exp": 64,
                   "n_ff_shexp": 96}  # fmt: skip


def write_tiny_qwen35(
    path: str | os.PathLike[str], weight_type: GGMLType | int, seed: int = 0, **shape: int
) -> None:
    """Write a tiny random ``qwen35`` GGUF: layers 0-2 Gated DeltaNet (fused ``attn_qkv``, the
    output gate ``attn_gate``, an F32 ``ssm_conv1d`` of 4 taps, ``ssm_a`` = -exp(A_log),
    ``ssm_dt`` bias, ``ssm_alpha`` / ``ssm_beta``, the gated norm ``ssm_norm``, ``ssm_out``),
    layer 3 full attention with its output gate in ``attn_q`` (query | gate per head) and Q/K
    norms; every layer has a post-attention norm before its SwiGLU FFN."""
    _write_qwen35(path, "qwen35", weight_type, seed, {**QWEN35_SHAPE, **shape})


def write_tiny_qwen35moe(
    path: str | os.PathLike[str], weight_type: GGMLType | int, seed: int = 0, **shape: int
) -> None:
    """Write a tiny random ``qwen35moe`` GGUF: :func:`write_tiny_qwen35`'s layers with a
    mixture of 4 experts of FFN size 64 (2 used per token; the router and the experts in
    ``weight_type``) and a shared expert of FFN size 96 gated by an F32
    ``ffn_gate_inp_shexp`` in place of each dense FFN."""
    _write_qwen35(path, "qwen35moe", weight_type, seed, {**QWEN35MOE_SHAPE, **shape})


def write_tiny_qwen3next(
    path: str | os.PathLike[str],
    weight_type: GGMLType | int,
    seed: int = 0,
    ssm_in: bool = False,
    **shape: int,
) -> None:
    """Write a tiny random ``qwen3next`` GGUF: :func:`write_tiny_qwen35moe`'s layers with
    Qwen3-Next's Gated DeltaNet layout: one ``ssm_ba`` (per key head: the betas of
    its 2 value heads, then their alphas), value heads grouped by key head; the channels and
    gate as ``attn_qkv`` / ``attn_gate`` (what llama.cpp's converter writes), or with
    ``ssm_in`` as one fused ``ssm_in`` (per key head q | k | v | z: older files); no rope
    sections."""
    s = {**QWEN35MOE_SHAPE, **shape, "ssm_in": int(ssm_in)}
    _write_qwen35(path, "qwen3next", weight_type, seed, s)


def _write_qwen35(path, a: str, weight_type: GGMLType | int, seed: int, s: dict) -> None:
    t = GGMLType(weight_type)
    w = GGUFWriter(path)
    w.add("general.architecture", a)
    w.add("general.name", f"tiny-random-{t.name.lower()}")
    for key, name in (("context_length", "n_ctx"), ("embedding_length", "n_embd"),
                      ("block_count", "n_layer"), ("feed_forward_length", "n_ff"),
                      ("attention.head_count", "n_head"), ("attention.head_count_kv", "n_head_kv"),
                      ("attention.key_length", "head_dim"), ("attention.value_length", "head_dim"),
                      ("rope.dimension_count", "n_rot"), ("ssm.conv_kernel", "d_conv"),
                      ("ssm.state_size", "d_state"), ("ssm.group_count", "n_group"),
                      ("ssm.time_step_rank", "dt_rank")):  # fmt: skip
        w.add(f"{a}.{key}", s[name], GGUFValueType.UINT32)
    w.add(f"{a}.ssm.inner_size", s["d_state"] * s["dt_rank"], GGUFValueType.UINT32)
    w.add(f"{a}.full_attention_interval", 4, GGUFValueType.UINT32)
    if s["n_expert"]:
        for key, name in (("expert_count", "n_expert"), ("expert_used_count", "n_expert_used"),
                          ("expert_feed_forward_length", "n_ff_exp"),
                          ("expert_shared_feed_forward_length", "n_ff_shexp")):  # fmt: skip
            w.add(f"{a}.{key}", s[name], GGUFValueType.UINT32)
    w.add(f"{a}.rope.freq_base", 10000.0, GGUFValueType.FLOAT32)
    w.add(f"{a}.attention.layer_norm_rms_epsilon", 1e-6, GGUFValueType.FLOAT32)
    if a != "qwen3next":  # (qwen3next: a plain neox rope)
        third = -(-s["n_rot"] // 6)  # rope pairs in thirds (Qwen3.5: 11, 11, 10 of 32)
        sections = [third, third, s["n_rot"] // 2 - 2 * third, 0]
        w.add(f"{a}.rope.dimension_sections", np.array(sections, np.int32))
    _add_byte_vocab(w, s["n_vocab"])
    rng = np.random.default_rng(seed)
    _add_qwen35_tensors(w, rng, t, {**s, "next": int(a == "qwen3next")})
    w.write()


def _add_qwen35_tensors(w, rng, t: GGMLType, s: dict) -> None:
    e, v, hd = s["n_embd"], s["n_vocab"], s["head_dim"]
    key_dim, value_dim = s["d_state"] * s["n_group"], s["d_state"] * s["dt_rank"]
    conv_dim = 2 * key_dim + value_dim
    mat, vec, norm = _writers(w, rng, t, e)
    mat("token_embd.weight", v, e)
    for i in range(s["n_layer"]):
        p = f"blk.{i}."
        vec(p + "attn_norm.weight", norm())
        if (i + 1) % 4:
            if s.get("ssm_in"):  # qwen3next's older layout: per key head q | k | v | z
                mat(p + "ssm_in.weight", conv_dim + value_dim, e)
            else:
                mat(p + "attn_qkv.weight", conv_dim, e)
                mat(p + "attn_gate.weight", value_dim, e)
            # conv taps of std 0.5 (ggml: [d_conv, channels]), decays -exp(A_log) in [-2.7, -1]
            vec(p + "ssm_conv1d.weight", 10.0 * _normal(rng, conv_dim * s["d_conv"]),
                (s["d_conv"], conv_dim))  # fmt: skip
            vec(p + "ssm_dt.bias", 10.0 * _normal(rng, s["dt_rank"]))
            vec(p + "ssm_a", -np.exp(0.5 + 5.0 * _normal(rng, s["dt_rank"])))
            if s["next"]:  # per key head: its value heads' betas, then their alphas
                mat(p + "ssm_ba.weight", 2 * s["dt_rank"], e)
            else:
                mat(p + "ssm_beta.weight", s["dt_rank"], e)
                mat(p + "ssm_alpha.weight", s["dt_rank"], e)
            vec(p + "ssm_norm.weight", norm(s["d_state"]))
            mat(p + "ssm_out.weight", e, value_dim)
        else:
            mat(p + "attn_q.weight", 2 * hd * s["n_head"], e)
            mat(p + "attn_k.weight", hd * s["n_head_kv"], e)
            mat(p + "attn_v.weight", hd * s["n_head_kv"], e)
            vec(p + "attn_q_norm.weight", norm(hd))
            vec(p + "attn_k_norm.weight", norm(hd))
            mat(p + "attn_output.weight", e, hd * s["n_head"])
        vec(p + "post_attention_norm.weight", norm())
        if s["n_expert"]:  # qwen35moe: routed experts and a gated shared expert
            _add_experts(p, {**s, "experts_type": -1, "router_f32": 0}, mat, None, rng)
            f = s["n_ff_shexp"]
            vec(p + "ffn_gate_inp_shexp.weight", _normal(rng, e))
            mat(p + "ffn_gate_shexp.weight", f, e)
            mat(p + "ffn_up_shexp.weight", f, e)
            mat(p + "ffn_down_shexp.weight", e, f)
        else:
            mat(p + "ffn_gate.weight", s["n_ff"], e)
            mat(p + "ffn_up.weight", s["n_ff"], e)
            mat(p + "ffn_down.weight", e, s["n_ff"])
    vec("output_norm.weight", norm())
    mat("output.weight", v, e)


# lfm2 (LFM2): short-convolution layers (head_count_kv 0) and attention layers
LFM2_SHAPE = {
    **{k: QWEN35_SHAPE[k] for k in ("n_embd", "n_layer", "n_ff", "n_head", "n_head_kv",
                                    "head_dim", "n_vocab", "n_ctx")},
    "l_cache": 3,  # convolution taps (the state row holds l_cache - 1 inputs)
}  # fmt: skip
LFM2_ATTENTION_LAYERS = (2,)  # the others are convolution layers


def write_tiny_lfm2(
    path: str | os.PathLike[str], weight_type: GGMLType | int, seed: int = 0, **shape: int
) -> None:
    """Write a tiny random ``lfm2`` GGUF: layers 0, 1 and 3 short convolutions (an F32
    ``shortconv.conv`` of 3 taps, ``in_proj`` giving b | c | x, ``out_proj``), layer 2
    attention with Q/K norms (``attention.head_count_kv`` per layer: 0 for the convolution
    layers); SwiGLU FFNs; the output norm stored as ``token_embd_norm``."""
    _write_lfm2(path, "lfm2", weight_type, seed, {**LFM2_SHAPE, **shape})


LFM2MOE_SHAPE = {**LFM2_SHAPE, "n_layer": 4, "n_expert": 4, "n_expert_used": 2,
                 "n_ff_exp": 64, "n_dense_lead": 1}  # fmt: skip


def write_tiny_lfm2moe(
    path: str | os.PathLike[str], weight_type: GGMLType | int, seed: int = 0, **shape: int
) -> None:
    """Write a tiny random ``lfm2moe`` GGUF: :func:`write_tiny_lfm2`'s layers, layer 0 with a
    dense FFN and layers 1-3 with 4 experts of FFN size 64 (2 used per token) behind a
    sigmoid router with a selection bias ``exp_probs_b``."""
    _write_lfm2(path, "lfm2moe", weight_type, seed, {**LFM2MOE_SHAPE, **shape})


def _write_lfm2(path, a: str, weight_type: GGMLType | int, seed: int, s: dict) -> None:
    t = GGMLType(weight_type)
    e, hd, moe = s["n_embd"], s["head_dim"], s.get("n_expert", 0)
    w = GGUFWriter(path)
    w.add("general.architecture", a)
    w.add("general.name", f"tiny-random-{t.name.lower()}")
    keys = [("context_length", "n_ctx"), ("embedding_length", "n_embd"),
            ("block_count", "n_layer"), ("feed_forward_length", "n_ff"),
            ("attention.head_count", "n_head"), ("shortconv.l_cache", "l_cache"),
            ("vocab_size", "n_vocab")]  # fmt: skip
    if moe:
        keys += [("expert_count", "n_expert"), ("expert_used_count", "n_expert_used"),
                 ("expert_feed_forward_length", "n_ff_exp"),
                 ("leading_dense_block_count", "n_dense_lead")]  # fmt: skip
    for key, name in keys:
        w.add(f"{a}.{key}", s[name], GGUFValueType.UINT32)
    if moe:
        w.add(f"{a}.expert_gating_func", 2, GGUFValueType.UINT32)  # sigmoid
    kv = [s["n_head_kv"] if i in LFM2_ATTENTION_LAYERS else 0 for i in range(s["n_layer"])]
    w.add(f"{a}.attention.head_count_kv", np.array(kv, np.uint32))
    w.add(f"{a}.rope.freq_base", 1000000.0, GGUFValueType.FLOAT32)
    w.add(f"{a}.attention.layer_norm_rms_epsilon", 1e-5, GGUFValueType.FLOAT32)
    _add_byte_vocab(w, s["n_vocab"])
    rng = np.random.default_rng(seed)
    mat, vec, norm = _writers(w, rng, t, e)
    mat("token_embd.weight", s["n_vocab"], e)
    for i in range(s["n_layer"]):
        p = f"blk.{i}."
        vec(p + "attn_norm.weight", norm())
        if i in LFM2_ATTENTION_LAYERS:
            mat(p + "attn_q.weight", hd * s["n_head"], e)
            mat(p + "attn_k.weight", hd * s["n_head_kv"], e)
            mat(p + "attn_v.weight", hd * s["n_head_kv"], e)
            vec(p + "attn_q_norm.weight", norm(hd))
            vec(p + "attn_k_norm.weight", norm(hd))
            mat(p + "attn_output.weight", e, hd * s["n_head"])
        else:
            vec(p + "shortconv.conv.weight", 10.0 * _normal(rng, e * s["l_cache"]),
                (s["l_cache"], e))  # fmt: skip
            mat(p + "shortconv.in_proj.weight", 3 * e, e)
            mat(p + "shortconv.out_proj.weight", e, e)
        vec(p + "ffn_norm.weight", norm())
        if not moe or i < s["n_dense_lead"]:
            mat(p + "ffn_gate.weight", s["n_ff"], e)
            mat(p + "ffn_up.weight", s["n_ff"], e)
            mat(p + "ffn_down.weight", e, s["n_ff"])
        else:
            n, f = s["n_expert"], s["n_ff_exp"]
            mat(p + "ffn_gate_inp.weight", n, e)
            mat(p + "ffn_gate_exps.weight", f, e, n)
            mat(p + "ffn_up_exps.weight", f, e, n)
            mat(p + "ffn_down_exps.weight", e, f, n)
            vec(p + "exp_probs_b.bias", 0.1 * _normal(rng, n))
    vec("token_embd_norm.weight", norm())
    mat("output.weight", s["n_vocab"], e)
    w.write()


# deepseek2: latent attention (absorbed form) and experts in groups, shared experts
DEEPSEEK2_SHAPE = {
    "n_embd": 256, "n_layer": 3, "n_ff": 512, "n_head": 4, "n_vocab": 259, "n_ctx": 256,
    "q_lora": 64, "kv_lora": 96, "n_rot": 32, "nope": 32, "v_head": 32,
    "n_expert": 8, "n_expert_used": 2, "n_ff_exp": 64, "n_shared": 2, "n_dense_lead": 1,
    "gating": 2, "groups": 4, "groups_used": 2, "weights_norm": 1,
}  # fmt: skip


def write_tiny_deepseek2(
    path: str | os.PathLike[str],
    weight_type: GGMLType | int,
    seed: int = 0,
    rope: str = "none",
    **shape: int,
) -> None:
    """Write a tiny random ``deepseek2`` GGUF as converted files are: 3 layers (the first
    with a dense FFN), the low-rank query (``attn_q_a``, its norm, ``attn_q_b``), the latent
    attention split for absorption (``attn_kv_a_mqa``, its norm, per-head ``attn_k_b`` /
    ``attn_v_b``; latent 96, rope 32, nope 32, value 32; one KV head), 8 experts of FFN size
    64 (2 used) behind a sigmoid router with a selection bias ``exp_probs_b``, in 4 groups of
    which 2 are used, the weights normalized and scaled by 2.5, and 2 shared experts
    (``gating`` 1: V2's softmax router without groups or bias, weights not normalized;
    ``q_lora`` 0: q direct, ``attn_q``, as V2-Lite's files; llama.cpp needs 26 or 27 layers).
    ``rope`` ``"yarn"``: YaRN (factor 4 over an original context of 64) with DeepSeek's
    log multiplier (``mscale_all_dim`` 1)."""
    s = {**DEEPSEEK2_SHAPE, **shape}
    t, a = GGMLType(weight_type), "deepseek2"
    w = GGUFWriter(path)
    w.add("general.architecture", a)
    w.add("general.name", f"tiny-random-{t.name.lower()}")
    r, nr, hk = s["kv_lora"], s["n_rot"], s["nope"] + s["n_rot"]
    u32 = {"context_length": s["n_ctx"], "embedding_length": s["n_embd"],
           "block_count": s["n_layer"], "feed_forward_length": s["n_ff"],
           "attention.head_count": s["n_head"], "attention.head_count_kv": 1,
           "attention.key_length": r + nr, "attention.value_length": r,
           "attention.key_length_mla": hk, "attention.value_length_mla": s["v_head"],
           "rope.dimension_count": nr, "attention.q_lora_rank": s["q_lora"],
           "attention.kv_lora_rank": r, "leading_dense_block_count": s["n_dense_lead"],
           "expert_count": s["n_expert"], "expert_used_count": s["n_expert_used"],
           "expert_feed_forward_length": s["n_ff_exp"], "expert_shared_count": s["n_shared"],
           "expert_gating_func": s["gating"], "vocab_size": s["n_vocab"]}  # fmt: skip
    if not s["q_lora"]:  # (llama.cpp reads q directly only in files of 26 or 27 layers)
        del u32["attention.q_lora_rank"]
    if s["groups"]:
        u32 |= {"expert_group_count": s["groups"], "expert_group_used_count": s["groups_used"]}
    for key, v in u32.items():
        w.add(f"{a}.{key}", v, GGUFValueType.UINT32)
    w.add(f"{a}.rope.freq_base", 10000.0, GGUFValueType.FLOAT32)
    w.add(f"{a}.attention.layer_norm_rms_epsilon", 1e-6, GGUFValueType.FLOAT32)
    w.add(f"{a}.expert_weights_scale", 2.5 if s["weights_norm"] else 1.0, GGUFValueType.FLOAT32)
    w.add(f"{a}.expert_weights_norm", bool(s["weights_norm"]))
    if rope == "yarn":
        w.add(f"{a}.rope.scaling.type", "yarn")
        w.add(f"{a}.rope.scaling.factor", 4.0, GGUFValueType.FLOAT32)
        w.add(f"{a}.rope.scaling.original_context_length", 64, GGUFValueType.UINT32)
        w.add(f"{a}.rope.scaling.yarn_log_multiplier", 0.1, GGUFValueType.FLOAT32)
    _add_byte_vocab(w, s["n_vocab"])
    _add_deepseek2_tensors(w, np.random.default_rng(seed), t, s)
    w.write()


def _add_deepseek2_tensors(w, rng, t: GGMLType, s: dict) -> None:
    e, h, r, nr = s["n_embd"], s["n_head"], s["kv_lora"], s["n_rot"]
    mat, vec, norm = _writers(w, rng, t, e)
    mat("token_embd.weight", s["n_vocab"], e)
    for i in range(s["n_layer"]):
        p = f"blk.{i}."
        vec(p + "attn_norm.weight", norm())
        if s["q_lora"]:
            mat(p + "attn_q_a.weight", s["q_lora"], e)
            vec(p + "attn_q_a_norm.weight", norm(s["q_lora"]))
            mat(p + "attn_q_b.weight", h * (s["nope"] + nr), s["q_lora"])
        else:  # (lite files: q direct)
            mat(p + "attn_q.weight", h * (s["nope"] + nr), e)
        mat(p + "attn_kv_a_mqa.weight", r + nr, e)
        vec(p + "attn_kv_a_norm.weight", norm(r))
        mat(p + "attn_k_b.weight", r, s["nope"], h)
        mat(p + "attn_v_b.weight", s["v_head"], r, h)
        mat(p + "attn_output.weight", e, h * s["v_head"])
        vec(p + "ffn_norm.weight", norm())
        if i < s["n_dense_lead"]:
            for name, rows, cols in (("gate", s["n_ff"], e), ("up", s["n_ff"], e),
                                     ("down", e, s["n_ff"])):  # fmt: skip
                mat(p + f"ffn_{name}.weight", rows, cols)
            continue
        n, f, fs = s["n_expert"], s["n_ff_exp"], s["n_ff_exp"] * s["n_shared"]
        mat(p + "ffn_gate_inp.weight", n, e)
        if s["gating"] == 2:
            vec(p + "exp_probs_b.bias", 0.1 * _normal(rng, n))
        mat(p + "ffn_gate_exps.weight", f, e, n)
        mat(p + "ffn_up_exps.weight", f, e, n)
        mat(p + "ffn_down_exps.weight", e, f, n)
        mat(p + "ffn_gate_shexp.weight", fs, e)
        mat(p + "ffn_up_shexp.weight", fs, e)
        mat(p + "ffn_down_shexp.weight", e, fs)
    vec("output_norm.weight", norm())
    mat("output.weight", s["n_vocab"], e)


# mamba2: every layer a Mamba-2 mixer (no attention, no FFN)
MAMBA2_SHAPE = {
    "n_embd": 128,
    "n_layer": 3,
    "n_vocab": 259,
    "n_ctx": 256,
    "d_inner": 256,  # 2 * n_embd
    "head_dim": 64,  # ssm.time_step_rank = d_inner / head_dim heads
    "n_group": 2,
    "d_state": 64,  # a multiple of 64: ggml's vectorized scan covers the whole row
    "d_conv": 4,
}


def write_tiny_mamba2(
    path: str | os.PathLike[str], weight_type: GGMLType | int, seed: int = 0, **shape: int
) -> None:
    """Write a tiny random ``mamba2`` GGUF as llama.cpp's converter lays one out: 3 layers of
    ``ssm_in`` (z | xBC | dt), an F32 ``ssm_conv1d`` of 4 taps with its bias, ``ssm_dt``
    bias, ``ssm_a`` = -exp(A_log) and ``ssm_d`` as ``[1, heads]``, the grouped norm
    ``ssm_norm`` as ``[d_inner / groups, groups]`` (2 groups of 2 heads of 64 channels, state
    size 64), ``ssm_out``; ``attention.head_count`` and ``feed_forward_length`` 0."""
    s = {**MAMBA2_SHAPE, **shape}
    t = GGMLType(weight_type)
    a, e, inner, ds, ng = "mamba2", s["n_embd"], s["d_inner"], s["d_state"], s["n_group"]
    nh, ch = inner // s["head_dim"], inner + 2 * s["n_group"] * s["d_state"]
    w = GGUFWriter(path)
    w.add("general.architecture", a)
    w.add("general.name", f"tiny-random-{t.name.lower()}")
    for key, v in (("context_length", s["n_ctx"]), ("embedding_length", e),
                   ("feed_forward_length", 0), ("attention.head_count", 0),
                   ("block_count", s["n_layer"]), ("ssm.conv_kernel", s["d_conv"]),
                   ("ssm.inner_size", inner), ("ssm.state_size", ds),
                   ("ssm.time_step_rank", nh), ("ssm.group_count", ng)):  # fmt: skip
        w.add(f"{a}.{key}", v, GGUFValueType.UINT32)
    w.add(f"{a}.attention.layer_norm_rms_epsilon", 1e-5, GGUFValueType.FLOAT32)
    _add_byte_vocab(w, s["n_vocab"])
    rng = np.random.default_rng(seed)
    mat, vec, norm = _writers(w, rng, t, e)
    mat("token_embd.weight", s["n_vocab"], e)
    for i in range(s["n_layer"]):
        p = f"blk.{i}."
        vec(p + "attn_norm.weight", norm())
        mat(p + "ssm_in.weight", inner + ch + nh, e)
        # conv taps of std 0.5, decays -exp(A_log) in [-2.7, -1], dt biases around 0
        vec(p + "ssm_conv1d.weight", 10.0 * _normal(rng, ch * s["d_conv"]), (s["d_conv"], ch))
        vec(p + "ssm_conv1d.bias", _normal(rng, ch))
        vec(p + "ssm_dt.bias", 10.0 * _normal(rng, nh))
        vec(p + "ssm_a", -np.exp(0.5 + 5.0 * _normal(rng, nh)), (1, nh))
        vec(p + "ssm_d", 1.0 + 5.0 * _normal(rng, nh), (1, nh))
        vec(p + "ssm_norm.weight", norm(inner), (inner // ng, ng))
        mat(p + "ssm_out.weight", e, inner)
    vec("output_norm.weight", norm())
    mat("output.weight", s["n_vocab"], e)
    w.write()


# granitehybrid (Granite 4.0 H): Mamba-2 layers (head_count_kv 0) and attention layers
GRANITEHYBRID_SHAPE = {
    **{k: MAMBA2_SHAPE[k] for k in ("n_embd", "n_vocab", "n_ctx", "d_inner", "head_dim",
                                    "d_state", "d_conv")},
    "n_layer": 4,
    "n_group": 1,
    "n_head": 4,
    "n_head_kv": 2,
    "n_ff": 256,
    "n_expert": 0,  # > 0: routed experts of FFN size n_ff (n_expert_used of them)
    "n_expert_used": 2,
    "n_ff_shexp": 0,  # > 0 (with experts): a shared expert of this FFN size
    "rope": 0,  # 1: rope.scaling.finetuned true (Bamba): the attention layers rotate
}  # fmt: skip
GRANITEHYBRID_ATTENTION_LAYERS = (2,)  # the others are Mamba-2 layers
# Granite 4.0 H's multipliers (embedding, residual, logits, attention)
GRANITE_SCALES = (12.0, 0.22, 8.0, 0.0078125)


def write_tiny_granitehybrid(
    path: str | os.PathLike[str], weight_type: GGMLType | int, seed: int = 0, **shape: int
) -> None:
    """Write a tiny random ``granitehybrid`` GGUF: layers 0, 1 and 3 Mamba-2 mixers
    (:func:`write_tiny_mamba2`'s tensors, one group), layer 2 attention (4 heads, 2 KV heads
    of 32; ``attention.head_count_kv`` per layer, 0 for the Mamba-2 layers); Granite 4.0 H's
    embedding, residual, logit and attention scales; a SwiGLU FFN in every layer, or with
    ``n_expert`` routed experts of FFN size ``n_ff`` (2 used) and, with ``n_ff_shexp``, a
    shared expert; no rope unless ``rope`` (``rope.scaling.finetuned``)."""
    s = {**GRANITEHYBRID_SHAPE, **shape}
    t = GGMLType(weight_type)
    a, e, inner, ds, ng = "granitehybrid", s["n_embd"], s["d_inner"], s["d_state"], s["n_group"]
    nh, ch = inner // s["head_dim"], inner + 2 * ng * ds
    hd = e // s["n_head"]
    w = GGUFWriter(path)
    w.add("general.architecture", a)
    w.add("general.name", f"tiny-random-{t.name.lower()}")
    keys = [("context_length", s["n_ctx"]), ("embedding_length", e),
            ("feed_forward_length", s["n_ff"]), ("attention.head_count", s["n_head"]),
            ("block_count", s["n_layer"]), ("ssm.conv_kernel", s["d_conv"]),
            ("ssm.inner_size", inner), ("ssm.state_size", ds),
            ("ssm.time_step_rank", nh), ("ssm.group_count", ng)]  # fmt: skip
    if s["n_expert"]:
        keys += [("expert_count", s["n_expert"]), ("expert_used_count", s["n_expert_used"])]
        if s["n_ff_shexp"]:
            keys += [("expert_shared_feed_forward_length", s["n_ff_shexp"])]
    for key, v in keys:
        w.add(f"{a}.{key}", v, GGUFValueType.UINT32)
    kv = [s["n_head_kv"] if i in GRANITEHYBRID_ATTENTION_LAYERS else 0 for i in range(s["n_layer"])]
    w.add(f"{a}.attention.head_count_kv", np.array(kv, np.uint32))
    for key, v in zip(("embedding_scale", "residual_scale", "logit_scale", "attention.scale"),
                      GRANITE_SCALES, strict=True):  # fmt: skip
        w.add(f"{a}.{key}", v, GGUFValueType.FLOAT32)
    w.add(f"{a}.rope.scaling.finetuned", bool(s["rope"]))
    w.add(f"{a}.rope.freq_base", 10000.0, GGUFValueType.FLOAT32)
    w.add(f"{a}.attention.layer_norm_rms_epsilon", 1e-5, GGUFValueType.FLOAT32)
    _add_byte_vocab(w, s["n_vocab"])
    rng = np.random.default_rng(seed)
    mat, vec, norm = _writers(w, rng, t, e)
    mat("token_embd.weight", s["n_vocab"], e)
    for i in range(s["n_layer"]):
        p = f"blk.{i}."
        vec(p + "attn_norm.weight", norm())
        if i in GRANITEHYBRID_ATTENTION_LAYERS:
            mat(p + "attn_q.weight", hd * s["n_head"], e)
            mat(p + "attn_k.weight", hd * s["n_head_kv"], e)
            mat(p + "attn_v.weight", hd * s["n_head_kv"], e)
            mat(p + "attn_output.weight", e, hd * s["n_head"])
        else:
            mat(p + "ssm_in.weight", inner + ch + nh, e)
            vec(p + "ssm_conv1d.weight", 10.0 * _normal(rng, ch * s["d_conv"]), (s["d_conv"], ch))
            vec(p + "ssm_conv1d.bias", _normal(rng, ch))
            vec(p + "ssm_dt.bias", 10.0 * _normal(rng, nh))
            vec(p + "ssm_a", -np.exp(0.5 + 5.0 * _normal(rng, nh)), (1, nh))
            vec(p + "ssm_d", 1.0 + 5.0 * _normal(rng, nh), (1, nh))
            vec(p + "ssm_norm.weight", norm(inner), (inner // ng, ng))
            mat(p + "ssm_out.weight", e, inner)
        vec(p + "ffn_norm.weight", norm())
        f = s["n_ff"]
        if s["n_expert"]:
            n = s["n_expert"]
            mat(p + "ffn_gate_inp.weight", n, e)
            mat(p + "ffn_gate_exps.weight", f, e, n)
            mat(p + "ffn_up_exps.weight", f, e, n)
            mat(p + "ffn_down_exps.weight", e, f, n)
            if s["n_ff_shexp"]:
                fs = s["n_ff_shexp"]
                mat(p + "ffn_gate_shexp.weight", fs, e)
                mat(p + "ffn_up_shexp.weight", fs, e)
                mat(p + "ffn_down_shexp.weight", e, fs)
        else:
            mat(p + "ffn_gate.weight", f, e)
            mat(p + "ffn_up.weight", f, e)
            mat(p + "ffn_down.weight", e, f)
    vec("output_norm.weight", norm())
    mat("output.weight", s["n_vocab"], e)
    w.write()


# granitehybrid cases compared with llama.cpp (tests/test_granitehybrid.py): name -> options
GRANITEHYBRID_CASES: dict[str, dict] = {
    "granitehybrid": {},  # Granite 4.0 H dense: no rope
    "granitehybrid_moe": {"n_expert": 4, "n_ff": 64, "n_ff_shexp": 96},  # H-Tiny's layout
    "granitehybrid_rope": {"rope": 1},  # rope.scaling.finetuned (Bamba)
}
