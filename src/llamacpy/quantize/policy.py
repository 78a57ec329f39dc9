"""Which type each tensor is quantized to: llama.cpp's per-tensor policy, rule for rule.

The rules (``llama_tensor_get_type`` in llama.cpp's ``src/llama-quant.cpp``) look at a tensor's
name (its *category*: attn_v, ffn_down, output ...), its position among the tensors of its
category, the row length, a few hyper-parameters (layers, GQA ratio, experts) and the file
type. They are stateful: ``attn_v`` and ``ffn_down`` tensors are counted as they are visited,
so :func:`choose_types` must see the tensors in llama.cpp's order (:func:`loader_order`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from ..errors import ModelError, UsageError
from ..gguf.constants import GGML_BLOCK_SIZES, KEY_ARCHITECTURE, GGMLType, LlamaFileType
from .presets import default_type, ggml_name, is_quantized

FT = LlamaFileType
T = GGMLType


class Category(Enum):
    TOKEN_EMBD = "token_embd"
    ATTENTION_Q = "attn_q"
    ATTENTION_V = "attn_v"
    ATTENTION_K = "attn_k"
    ATTENTION_QKV = "attn_qkv"
    ATTENTION_KV_B = "attn_kv_b"
    ATTENTION_OUTPUT = "attn_output"
    FFN_UP = "ffn_up"
    FFN_GATE = "ffn_gate"
    FFN_DOWN = "ffn_down"
    OUTPUT = "output"
    OTHER = "other"


_ATTN_V_LIKE = {Category.ATTENTION_V, Category.ATTENTION_QKV, Category.ATTENTION_KV_B}
_TOKEN_EMBD_NAMES = {"token_embd.weight", "per_layer_token_embd.weight"}
# substring -> category, checked in this order after the exact names
_CATEGORY_SUBSTRINGS = (
    ("attn_qkv.weight", Category.ATTENTION_QKV),
    ("attn_kv_b.weight", Category.ATTENTION_KV_B),
    ("attn_v.weight", Category.ATTENTION_V),
    ("attn_k.weight", Category.ATTENTION_K),
    ("attn_q.weight", Category.ATTENTION_Q),
    ("attn_output.weight", Category.ATTENTION_OUTPUT),
    ("ffn_up", Category.FFN_UP),
    ("ffn_gate", Category.FFN_GATE),
    ("ffn_down", Category.FFN_DOWN),
)


def tensor_category(name: str) -> Category:
    """The broad role of a tensor, from its name alone (any architecture)."""
    if name == "output.weight":
        return Category.OUTPUT
    if name in _TOKEN_EMBD_NAMES:
        return Category.TOKEN_EMBD
    for sub, cat in _CATEGORY_SUBSTRINGS:
        if sub in name:
            return cat
    return Category.OTHER


# --------------------------------------------------------------------------- model facts
_IQ2_FAMILY = {FT.MOSTLY_IQ2_XXS, FT.MOSTLY_IQ2_XS, FT.MOSTLY_IQ1_S, FT.MOSTLY_IQ2_S}
_IQ2_FAMILY |= {FT.MOSTLY_IQ2_M, FT.MOSTLY_IQ1_M}
# architectures and layer counts llama.cpp labels as 70B models (the only size rule uses it)
_70B_LAYERS = {"qwen2": 80, "deci": 80, "olmo": 80, "jais2": 68}


@dataclass(frozen=True)
class ModelInfo:
    """The hyper-parameters the policy reads (llama.cpp's ``llama_hparams`` subset)."""

    arch: str
    n_layer: int  # block_count (llama.cpp's n_layer_all)
    n_head: int = 0  # of layer 0
    n_head_kv: int = 0
    n_expert: int = 0
    is_70b: bool = False

    @property
    def n_gqa(self) -> int:
        return self.n_head // self.n_head_kv if self.n_head_kv else 0

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any]) -> ModelInfo:
        """Read ``general.architecture`` and ``{arch}.*`` keys as llama.cpp's loader does."""
        arch = metadata.get(KEY_ARCHITECTURE)
        if not isinstance(arch, str):
            raise ModelError(f"the model has no {KEY_ARCHITECTURE!r} string key")

        def first_int(key: str, default: int) -> int:
            v = metadata.get(f"{arch}.{key}", default)
            if isinstance(v, str):
                raise ModelError(f"metadata key {arch}.{key} is a string, expected an integer")
            try:
                v = v[0] if len(v) else default  # per-layer arrays: layer 0
            except TypeError:
                pass
            return int(v)

        n_layer = first_int("block_count", 0)
        if n_layer <= 0:
            raise ModelError(f"the model has no valid {arch}.block_count key")
        n_nextn = first_int("nextn_predict_layers", 0)
        n_head = first_int("attention.head_count", 0)
        n_head_kv = first_int("attention.head_count_kv", n_head)
        n_expert = first_int("expert_count", 0)
        is_70b = _70B_LAYERS.get(arch) == n_layer - n_nextn
        if arch == "llama":
            is_70b = n_expert != 8 and n_layer - n_nextn == 80 and n_head != n_head_kv
        return cls(arch, n_layer, n_head, n_head_kv, n_expert, is_70b)


@dataclass(frozen=True)
class TensorSpec:
    """A tensor as the policy sees it: name, shape in ggml order (``ne[0]`` first), type."""

    name: str
    shape: tuple[int, ...]
    type: GGMLType = GGMLType.F32

    @property
    def n_dims(self) -> int:
        """``ggml_n_dims``: trailing dimensions of 1 do not count (at least 1)."""
        n = len(self.shape)
        while n > 1 and self.shape[n - 1] == 1:
            n -= 1
        return n

    def ne(self, i: int) -> int:
        return self.shape[i] if i < len(self.shape) else 1


_LAYER_RE = re.compile(r"blk\.\s*([+-]?\d+)")


def _layer_of(name: str) -> int | None:
    """``sscanf(name, "blk.%d.")``: the block number a name starts with, if any."""
    m = _LAYER_RE.match(name)
    return int(m.group(1)) if m else None


def loader_order(names: Iterable[str]) -> list[str]:
    """Names in llama.cpp's ``weights_map`` order: by block number (others first), then name."""

    def key(name: str) -> tuple[int, bytes]:
        layer = _layer_of(name)
        return (-1 if layer is None else layer, name.encode("utf-8", "surrogateescape"))

    return sorted(names, key=key)


# --------------------------------------------------------------------------- options
@dataclass(frozen=True)
class TypeOptions:
    """The parts of the quantize parameters the policy depends on."""

    ftype: LlamaFileType
    pure: bool = False
    only_copy: bool = False
    quantize_output_tensor: bool = True
    output_tensor_type: GGMLType | None = None
    token_embedding_type: GGMLType | None = None
    # (pattern, type): the first pattern found anywhere in a tensor's name wins
    tensor_types: tuple[tuple[str, GGMLType], ...] = ()
    has_imatrix: bool = False


# --------------------------------------------------------------------------- which tensors
_NOT_QUANTIZED_SUBSTRINGS = (
    "_norm.weight",
    "ffn_gate_inp.weight",
    "ffn_gate_tid2eid.weight",
    "altup",
    "laurel",
    "per_layer_model_proj",
    "ssm_conv1d",
    "shortconv.conv.weight",
    "indexer.k_proj.weight",
    "indexer.q_proj.weight",
    *(
        f"time_mix_{s}.weight"
        for s in (
            [
                "first",
                "w0",
                "w1",
                "w2",
                "v0",
                "v1",
                "v2",
                "a0",
                "a1",
                "a2",
                "g1",
                "g2",
                "decay_w1",
                "decay_w2",
                "lerp_fused",
            ]
        )
    ),
    "attn_rel_b.weight",
    ".position_embd",
    "sam.pos_embd",
    "sam.neck.",
    "sam.net_",
    ".rel_pos",
    ".patch_embd",
    ".patch_merger",
    "a.rvq.codebook",
    "mm.a.code_embd",
)
_GLM5_NEXT_NOT_QUANTIZED = (
    "hc_",
    "indexer.attn_q_b",
    "indexer.attn_k",
    "indexer.proj",
    "indexer_compressor_gate",
    "indexer_compressor_ape",
    "ssm_f_a.weight",
    "ssm_f_b.weight",
    "ssm_g_a.weight",
    "ssm_g_b.weight",
    "ssm_beta.weight",
    "attn_kv_a_mqa.weight",
    "attn_k_b.weight",
    "attn_v_b.weight",
)


def allows_quantization(t: TensorSpec, arch: str, opts: TypeOptions) -> bool:
    """Whether a tensor may change type at all: 2-D+ ``*weight`` tensors, minus norms,
    position/token-type embeddings, routers and the small special cases llama.cpp lists."""
    if opts.only_copy or t.n_dims < 2:
        return False
    name = t.name
    if not name.endswith("weight"):
        return False
    if name == "output.weight" and not opts.quantize_output_tensor:
        return False
    if name in ("position_embd.weight", "token_types.weight"):
        return False
    if any(s in name for s in _NOT_QUANTIZED_SUBSTRINGS):
        return False
    return not (arch == "glm5-next" and any(s in name for s in _GLM5_NEXT_NOT_QUANTIZED))


def requires_imatrix(name: str, t: GGMLType, ftype: LlamaFileType) -> bool:
    """Types that give garbage without an importance matrix (never for embeddings/output)."""
    if name in _TOKEN_EMBD_NAMES or name == "output.weight":
        return False
    if t in (T.IQ3_XXS, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ1_M, T.IQ1_S):
        return True
    return t == T.Q2_K and ftype == FT.MOSTLY_Q2_K_S


# --------------------------------------------------------------------------- the rules
def _use_more_bits(i_layer: int, n_layer: int) -> bool:
    return (
        i_layer < n_layer // 8 or i_layer >= 7 * n_layer // 8 or (i_layer - n_layer // 8) % 3 == 2
    )


@dataclass
class _State:
    """llama.cpp's ``quantize_state_impl``: counters advanced as tensors are visited."""

    model: ModelInfo
    opts: TypeOptions
    patterns: list[tuple[re.Pattern[str], GGMLType]]
    n_attention_wv: int = 0
    n_ffn_down: int = 0
    n_ffn_gate: int = 0
    n_ffn_up: int = 0
    i_attention_wv: int = 0
    i_ffn_down: int = 0
    i_ffn_gate: int = 0
    i_ffn_up: int = 0
    has_tied_embeddings: bool = True
    fallbacks: list[tuple[str, GGMLType, GGMLType]] = field(default_factory=list)
    overrides: list[tuple[str, GGMLType, GGMLType]] = field(default_factory=list)

    def layer_info(self, i_layer: int, n_layer: int, name: str) -> tuple[int, int]:
        # experts of one layer are not consecutive in every model: use the block number
        if max(1, self.model.n_expert) > 1:
            layer = _layer_of(name)
            if layer is None:
                raise ModelError(f"failed to determine the layer of tensor {name!r}")
            if not 0 <= layer < n_layer:
                raise ModelError(
                    f"bad layer {layer} for tensor {name!r}; must be in [0, {n_layer})"
                )
            return layer, n_layer
        return i_layer, n_layer


def _type_impl(qs: _State, new_type: GGMLType, t: TensorSpec, cat: Category) -> GGMLType:
    """``llama_tensor_get_type_impl``: the mixture rules of the file type."""
    ftype, m, name, arch = qs.opts.ftype, qs.model, t.name, qs.model.arch

    glm5_q = any(s in name for s in ("attn_q_a", "attn_q_b", "nextn.eh_proj"))
    if arch == "glm5-next" and glm5_q and new_type not in (T.F32, T.BF16, T.F16):
        return T.Q8_0

    if cat == Category.OUTPUT or (qs.has_tied_embeddings and cat == Category.TOKEN_EMBD):
        if qs.opts.output_tensor_type is not None:
            new_type = qs.opts.output_tensor_type
        else:
            nx, qk_k = t.ne(0), GGML_BLOCK_SIZES[new_type][0]
            if ftype == FT.MOSTLY_MXFP4_MOE or arch == "falcon" or nx % qk_k:
                new_type = T.Q8_0
            elif ftype in _IQ2_FAMILY or ftype == FT.MOSTLY_IQ3_XXS:
                new_type = T.Q5_K
            elif new_type != T.Q8_0:
                new_type = T.Q6_K
    elif ftype == FT.MOSTLY_MXFP4_MOE:
        # expert tensors -> MXFP4, everything else -> Q8_0
        is_bailing_expert = arch == "bailingmoe3" and cat in (
            Category.FFN_UP,
            Category.FFN_GATE,
            Category.FFN_DOWN,
        )
        if t.ne(2) > 1 and (arch != "bailingmoe3" or is_bailing_expert):
            new_type = T.MXFP4
        else:
            new_type = T.Q8_0
    elif cat == Category.TOKEN_EMBD:
        if qs.opts.token_embedding_type is not None:
            new_type = qs.opts.token_embedding_type
        elif ftype in (FT.MOSTLY_IQ2_XXS, FT.MOSTLY_IQ2_XS, FT.MOSTLY_IQ1_S, FT.MOSTLY_IQ1_M):
            new_type = T.Q2_K
        elif ftype in (FT.MOSTLY_IQ2_S, FT.MOSTLY_IQ2_M, FT.MOSTLY_IQ3_XXS):
            new_type = T.IQ3_S
        elif ftype in (FT.MOSTLY_TQ1_0, FT.MOSTLY_TQ2_0, FT.MOSTLY_Q2_0):
            new_type = T.Q4_K
    elif ftype in _IQ2_FAMILY:
        iq3 = ftype in (FT.MOSTLY_IQ2_S, FT.MOSTLY_IQ2_M)
        if cat in _ATTN_V_LIKE:
            gqa_or_moe = m.n_gqa >= 4 or m.n_expert >= 4
            new_type = T.Q4_K if gqa_or_moe else (T.IQ3_S if iq3 else T.Q2_K)
            qs.i_attention_wv += 1
        elif m.n_expert == 8 and cat == Category.ATTENTION_K:
            new_type = T.Q4_K
        elif cat == Category.FFN_DOWN:
            if qs.i_ffn_down < qs.n_ffn_down // 8:
                new_type = T.IQ3_S if iq3 else T.Q2_K
            qs.i_ffn_down += 1
        elif cat == Category.ATTENTION_OUTPUT:
            if m.n_expert == 8:
                new_type = T.Q5_K
            elif ftype in (FT.MOSTLY_IQ1_S, FT.MOSTLY_IQ1_M):
                new_type = T.IQ2_XXS
            elif iq3:
                new_type = T.IQ3_S
    elif cat in _ATTN_V_LIKE:
        new_type = _attn_v_type(qs, new_type)
        qs.i_attention_wv += 1
    elif cat == Category.ATTENTION_K:
        if m.n_expert == 8:
            new_type = T.Q8_0
        elif ftype == FT.MOSTLY_IQ3_XS:
            new_type = T.IQ3_XXS
        elif ftype == FT.MOSTLY_IQ3_XXS:
            new_type = T.IQ2_S
    elif cat == Category.ATTENTION_Q:
        if ftype == FT.MOSTLY_IQ3_XS:
            new_type = T.IQ3_XXS
        elif ftype == FT.MOSTLY_IQ3_XXS:
            new_type = T.IQ2_S
    elif cat == Category.FFN_DOWN:
        i_layer, n_layer = qs.layer_info(qs.i_ffn_down, qs.n_ffn_down, name)
        new_type = _ffn_down_type(qs, new_type, i_layer, n_layer)
        qs.i_ffn_down += 1
    elif cat == Category.ATTENTION_OUTPUT:
        new_type = _attn_output_type(qs, new_type)
    elif cat == Category.ATTENTION_QKV:  # unreachable (attn_v-like above), as in llama.cpp
        pass
    elif cat in (Category.FFN_GATE, Category.FFN_UP):
        up = cat == Category.FFN_UP
        i_layer, n_layer = qs.layer_info(qs.i_ffn_up if up else qs.i_ffn_gate, qs.n_ffn_up, name)
        if ftype == FT.MOSTLY_IQ3_XS and n_layer // 8 <= i_layer < 7 * n_layer // 8:
            new_type = T.IQ3_XXS
        if up:
            qs.i_ffn_up += 1
        else:
            qs.i_ffn_gate += 1
    return new_type


def _attn_v_type(qs: _State, new_type: GGMLType) -> GGMLType:
    ftype, m = qs.opts.ftype, qs.model
    gqa4 = m.n_gqa >= 4
    if ftype == FT.MOSTLY_Q2_K:
        new_type = T.Q4_K if gqa4 else T.Q3_K
    elif ftype == FT.MOSTLY_Q2_K_S and gqa4:
        new_type = T.Q4_K
    elif ftype == FT.MOSTLY_IQ3_XXS:
        new_type = T.Q4_K if gqa4 else (T.IQ3_XXS if qs.opts.has_imatrix else T.IQ3_S)
    elif (ftype in (FT.MOSTLY_IQ3_XS, FT.MOSTLY_IQ3_S) and gqa4) or ftype == FT.MOSTLY_IQ3_M:
        new_type = T.Q4_K
    elif ftype == FT.MOSTLY_Q3_K_M:
        new_type = T.Q5_K if qs.i_attention_wv < 2 else T.Q4_K
    elif ftype == FT.MOSTLY_Q3_K_L or (ftype in (FT.MOSTLY_IQ4_NL, FT.MOSTLY_IQ4_XS) and gqa4):
        new_type = T.Q5_K
    elif ftype in (FT.MOSTLY_Q4_K_M, FT.MOSTLY_Q5_K_M) and _use_more_bits(
        qs.i_attention_wv, qs.n_attention_wv
    ):
        new_type = T.Q6_K
    elif ftype == FT.MOSTLY_Q4_K_S and qs.i_attention_wv < 4:
        new_type = T.Q5_K
    # 70B: eight heads share attn_v, so a few more bits cost almost nothing
    if m.is_70b and new_type in (T.Q3_K, T.Q4_K):
        new_type = T.Q5_K
    if m.n_expert == 8:
        new_type = T.Q8_0
    return new_type


def _ffn_down_type(qs: _State, new_type: GGMLType, i_layer: int, n_layer: int) -> GGMLType:
    ftype, m, falcon = qs.opts.ftype, qs.model, qs.model.arch == "falcon"
    if ftype == FT.MOSTLY_Q2_K:
        return T.Q3_K
    if ftype == FT.MOSTLY_Q2_K_S:
        return T.Q4_K if i_layer < n_layer // 8 else new_type
    if ftype == FT.MOSTLY_IQ3_XXS and not qs.opts.has_imatrix:
        return T.Q4_K if i_layer < n_layer // 8 else T.Q3_K
    if ftype == FT.MOSTLY_Q3_K_M:
        if i_layer < n_layer // 16:
            return T.Q5_K
        return T.Q4_K if not falcon or _use_more_bits(i_layer, n_layer) else T.Q3_K
    if ftype == FT.MOSTLY_IQ3_M and (
        i_layer < n_layer // 8 or (m.n_expert == 8 and _use_more_bits(i_layer, n_layer))
    ):
        return T.Q4_K
    if ftype == FT.MOSTLY_Q3_K_L:
        return T.Q4_K if falcon else T.Q5_K
    if ftype == FT.MOSTLY_Q4_K_M:
        if falcon:
            if i_layer < n_layer // 16:
                return T.Q6_K
            return T.Q5_K if _use_more_bits(i_layer, n_layer) else T.Q4_K
        return T.Q6_K if _use_more_bits(i_layer, n_layer) else new_type
    if (
        i_layer < n_layer // 8
        and ftype in (FT.MOSTLY_IQ4_NL, FT.MOSTLY_IQ4_XS)
        and not qs.opts.has_imatrix
    ):
        return T.Q5_K
    if ftype == FT.MOSTLY_Q5_K_M and _use_more_bits(i_layer, n_layer):
        return T.Q6_K
    if ftype == FT.MOSTLY_Q4_K_S and not falcon and i_layer < n_layer // 8:
        return T.Q5_K
    if ftype in (FT.MOSTLY_Q4_0, FT.MOSTLY_Q5_0) and qs.opts.has_imatrix and i_layer < n_layer // 8:
        # guard the first ffn_down layers, which go wrong even with an imatrix
        return T.Q4_1 if ftype == FT.MOSTLY_Q4_0 else T.Q5_1
    return new_type


_MOE8_ATTN_OUTPUT_Q5K = {
    FT.MOSTLY_Q2_K,
    FT.MOSTLY_IQ3_XS,
    FT.MOSTLY_IQ3_XXS,
    FT.MOSTLY_Q3_K_S,
    FT.MOSTLY_Q3_K_M,
    FT.MOSTLY_IQ4_NL,
    FT.MOSTLY_Q4_K_S,
    FT.MOSTLY_Q4_K_M,
    FT.MOSTLY_IQ3_S,
    FT.MOSTLY_IQ3_M,
    FT.MOSTLY_IQ4_XS,
}
_ATTN_OUTPUT_TYPES = {
    FT.MOSTLY_Q2_K: T.Q3_K,
    FT.MOSTLY_IQ3_XXS: T.IQ3_S,
    FT.MOSTLY_Q3_K_M: T.Q4_K,
    FT.MOSTLY_Q3_K_L: T.Q5_K,
    FT.MOSTLY_IQ3_M: T.Q4_K,
}


def _attn_output_type(qs: _State, new_type: GGMLType) -> GGMLType:
    ftype = qs.opts.ftype
    if qs.model.arch == "falcon":
        return T.Q4_K if ftype == FT.MOSTLY_Q3_K_L else new_type
    if qs.model.n_expert == 8:
        return T.Q5_K if ftype in _MOE8_ATTN_OUTPUT_Q5K else new_type
    return _ATTN_OUTPUT_TYPES.get(ftype, new_type)


# types whose rows must be a multiple of 256, and the 32-block type each falls back to
_FALLBACKS = {
    **dict.fromkeys(
        (T.IQ1_S, T.IQ1_M, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ4_XS), T.IQ4_NL
    ),
    **dict.fromkeys((T.Q2_0, T.Q2_K, T.Q3_K, T.TQ1_0, T.TQ2_0), T.Q4_0),
    T.Q4_K: T.Q5_0,
    T.Q5_K: T.Q5_1,
    T.Q6_K: T.Q8_0,
}


def _fallback(qs: _State, t: TensorSpec, target: GGMLType) -> GGMLType:
    """``tensor_type_fallback``: a compatible type when the row length is not a multiple of the
    target's block size (F16 when not even the 32-block fallback fits)."""
    ncols, qk = t.ne(0), GGML_BLOCK_SIZES[target][0]
    if ncols % qk == 0:
        return target
    result = _FALLBACKS.get(target)
    if result is None:
        if qk > 32:
            raise UsageError(f"no tensor type fallback is defined for type {ggml_name(target)}")
        result = target
    if ncols % GGML_BLOCK_SIZES[result][0]:
        result = T.F16
    qs.fallbacks.append((t.name, target, result))
    return result


def _get_type(qs: _State, t: TensorSpec, default: GGMLType, cat: Category) -> GGMLType:
    """``llama_tensor_get_type``: options first, then the mixture rules, then the fallback."""
    opts = qs.opts
    if not allows_quantization(t, qs.model.arch, opts):
        return t.type
    if opts.token_embedding_type is not None and cat == Category.TOKEN_EMBD:
        # per_layer_token_embd follows the option unless a --tensor-type pattern names it
        named = t.name == "per_layer_token_embd.weight" and any(
            p.search(t.name) for p, _ in qs.patterns
        )
        if not named:
            return opts.token_embedding_type
    if opts.output_tensor_type is not None and cat == Category.OUTPUT:
        return opts.output_tensor_type

    new_type = default
    if is_quantized(default):
        manual = False
        for pattern, qtype in qs.patterns:
            if pattern.search(t.name):
                if qtype != new_type:
                    qs.overrides.append((t.name, new_type, qtype))
                    new_type = qtype
                manual = True
                break
        if not manual and not opts.pure:
            new_type = _type_impl(qs, new_type, t, cat)
        new_type = _fallback(qs, t, new_type)
    return new_type


@dataclass(frozen=True)
class TypeChoice:
    """The policy's decision for one tensor."""

    name: str
    category: Category
    allows_quantization: bool
    target: GGMLType
    requires_imatrix: bool


@dataclass(frozen=True)
class TypePlan:
    choices: tuple[TypeChoice, ...]
    # (tensor, wanted type, type used) for rows that did not fit the wanted type's blocks
    fallbacks: tuple[tuple[str, GGMLType, GGMLType], ...]
    # (tensor, rule type, --tensor-type type) where a pattern changed the type
    overrides: tuple[tuple[str, GGMLType, GGMLType], ...]


def compile_patterns(
    tensor_types: Sequence[tuple[str, GGMLType]],
) -> list[tuple[re.Pattern[str], GGMLType]]:
    out = []
    for pattern, t in tensor_types:
        try:
            out.append((re.compile(pattern), GGMLType(t)))
        except re.error as e:
            raise UsageError(f"invalid --tensor-type pattern {pattern!r}: {e}") from None
    return out


def choose_types(model: ModelInfo, tensors: Sequence[TensorSpec], opts: TypeOptions) -> TypePlan:
    """The target type of every tensor, visited in the given order (use :func:`loader_order`).

    ``tensors`` should be every tensor of the model: the counters (``attn_v`` tensors, tied
    embeddings) are computed over all of them, as llama.cpp does.
    """
    base = default_type(opts.ftype)
    if base is None:
        raise UsageError(f"invalid output file type {int(opts.ftype)}")
    qs = _State(model, opts, compile_patterns(opts.tensor_types))
    cats = [tensor_category(t.name) for t in tensors]
    qs.n_attention_wv = sum(c in _ATTN_V_LIKE for c in cats)
    qs.has_tied_embeddings = Category.OUTPUT not in cats
    qs.n_ffn_down = qs.n_ffn_gate = qs.n_ffn_up = model.n_layer
    choices = []
    for t, cat in zip(tensors, cats):
        allowed = allows_quantization(t, model.arch, opts)
        target = _get_type(qs, t, base, cat) if allowed else t.type
        choices.append(
            TypeChoice(t.name, cat, allowed, target, requires_imatrix(t.name, target, opts.ftype))
        )
    return TypePlan(tuple(choices), tuple(qs.fallbacks), tuple(qs.overrides))
