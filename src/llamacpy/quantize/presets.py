"""Quantization presets (llama.cpp's ``llama_ftype``) and ggml type names as llama-quantize spells them.

A preset is a *file type*: a default tensor type plus the per-tensor mixture rules in
:mod:`.policy`. Names, aliases and numbers are those ``llama-quantize`` accepts.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UsageError
from ..gguf.constants import GGML_BLOCK_SIZES, GGMLType, LlamaFileType

FT = LlamaFileType

# GGML_QNT_VERSION: written as general.quantization_version
QUANTIZATION_VERSION = 2


@dataclass(frozen=True)
class Preset:
    """One ``TYPE`` argument of ``llamacpy quantize``."""

    name: str
    ftype: LlamaFileType
    description: str

    @property
    def only_copy(self) -> bool:
        return self.name == "COPY"


# llama-quantize's table, in its order (name lookups go first to last; COPY must follow F32)
PRESETS: tuple[Preset, ...] = (
    Preset("Q1_0", FT.MOSTLY_Q1_0, " 1.125 bpw quantization"),
    Preset("Q2_0", FT.MOSTLY_Q2_0, " 2.25 bpw quantization (group 64)"),
    Preset("Q4_0", FT.MOSTLY_Q4_0, " 4.34G, +0.4685 ppl @ Llama-3-8B"),
    Preset("Q4_1", FT.MOSTLY_Q4_1, " 4.78G, +0.4511 ppl @ Llama-3-8B"),
    Preset("MXFP4_MOE", FT.MOSTLY_MXFP4_MOE, " MXFP4 MoE"),
    Preset("Q5_0", FT.MOSTLY_Q5_0, " 5.21G, +0.1316 ppl @ Llama-3-8B"),
    Preset("Q5_1", FT.MOSTLY_Q5_1, " 5.65G, +0.1062 ppl @ Llama-3-8B"),
    Preset("IQ2_XXS", FT.MOSTLY_IQ2_XXS, " 2.06 bpw quantization"),
    Preset("IQ2_XS", FT.MOSTLY_IQ2_XS, " 2.31 bpw quantization"),
    Preset("IQ2_S", FT.MOSTLY_IQ2_S, " 2.5  bpw quantization"),
    Preset("IQ2_M", FT.MOSTLY_IQ2_M, " 2.7  bpw quantization"),
    Preset("IQ1_S", FT.MOSTLY_IQ1_S, " 1.56 bpw quantization"),
    Preset("IQ1_M", FT.MOSTLY_IQ1_M, " 1.75 bpw quantization"),
    Preset("TQ1_0", FT.MOSTLY_TQ1_0, " 1.69 bpw ternarization"),
    Preset("TQ2_0", FT.MOSTLY_TQ2_0, " 2.06 bpw ternarization"),
    Preset("Q2_K", FT.MOSTLY_Q2_K, " 2.96G, +3.5199 ppl @ Llama-3-8B"),
    Preset("Q2_K_S", FT.MOSTLY_Q2_K_S, " 2.96G, +3.1836 ppl @ Llama-3-8B"),
    Preset("IQ3_XXS", FT.MOSTLY_IQ3_XXS, " 3.06 bpw quantization"),
    Preset("IQ3_S", FT.MOSTLY_IQ3_S, " 3.44 bpw quantization"),
    Preset("IQ3_M", FT.MOSTLY_IQ3_M, " 3.66 bpw quantization mix"),
    Preset("Q3_K", FT.MOSTLY_Q3_K_M, "alias for Q3_K_M"),
    Preset("IQ3_XS", FT.MOSTLY_IQ3_XS, " 3.3 bpw quantization"),
    Preset("Q3_K_S", FT.MOSTLY_Q3_K_S, " 3.41G, +1.6321 ppl @ Llama-3-8B"),
    Preset("Q3_K_M", FT.MOSTLY_Q3_K_M, " 3.74G, +0.6569 ppl @ Llama-3-8B"),
    Preset("Q3_K_L", FT.MOSTLY_Q3_K_L, " 4.03G, +0.5562 ppl @ Llama-3-8B"),
    Preset("IQ4_NL", FT.MOSTLY_IQ4_NL, " 4.50 bpw non-linear quantization"),
    Preset("IQ4_XS", FT.MOSTLY_IQ4_XS, " 4.25 bpw non-linear quantization"),
    Preset("Q4_K", FT.MOSTLY_Q4_K_M, "alias for Q4_K_M"),
    Preset("Q4_K_S", FT.MOSTLY_Q4_K_S, " 4.37G, +0.2689 ppl @ Llama-3-8B"),
    Preset("Q4_K_M", FT.MOSTLY_Q4_K_M, " 4.58G, +0.1754 ppl @ Llama-3-8B"),
    Preset("Q5_K", FT.MOSTLY_Q5_K_M, "alias for Q5_K_M"),
    Preset("Q5_K_S", FT.MOSTLY_Q5_K_S, " 5.21G, +0.1049 ppl @ Llama-3-8B"),
    Preset("Q5_K_M", FT.MOSTLY_Q5_K_M, " 5.33G, +0.0569 ppl @ Llama-3-8B"),
    Preset("Q6_K", FT.MOSTLY_Q6_K, " 6.14G, +0.0217 ppl @ Llama-3-8B"),
    Preset("Q8_0", FT.MOSTLY_Q8_0, " 7.96G, +0.0026 ppl @ Llama-3-8B"),
    Preset("F16", FT.MOSTLY_F16, "14.00G, +0.0020 ppl @ Mistral-7B"),
    Preset("BF16", FT.MOSTLY_BF16, "14.00G, -0.0050 ppl @ Mistral-7B"),
    Preset("F32", FT.ALL_F32, "26.00G              @ 7B"),
    Preset("COPY", FT.ALL_F32, "only copy tensors, no quantizing"),
)

# llama_ftype_get_default_type
_DEFAULT_TYPES: dict[LlamaFileType, GGMLType] = {
    FT.MOSTLY_Q4_0: GGMLType.Q4_0,
    FT.MOSTLY_Q4_1: GGMLType.Q4_1,
    FT.MOSTLY_Q5_0: GGMLType.Q5_0,
    FT.MOSTLY_Q5_1: GGMLType.Q5_1,
    FT.MOSTLY_Q8_0: GGMLType.Q8_0,
    FT.MOSTLY_F16: GGMLType.F16,
    FT.MOSTLY_BF16: GGMLType.BF16,
    FT.ALL_F32: GGMLType.F32,
    FT.MOSTLY_Q1_0: GGMLType.Q1_0,
    FT.MOSTLY_Q2_0: GGMLType.Q2_0,
    FT.MOSTLY_MXFP4_MOE: GGMLType.MXFP4,
    FT.MOSTLY_Q2_K_S: GGMLType.Q2_K,
    FT.MOSTLY_Q2_K: GGMLType.Q2_K,
    FT.MOSTLY_IQ3_XS: GGMLType.IQ3_S,
    FT.MOSTLY_Q3_K_S: GGMLType.Q3_K,
    FT.MOSTLY_Q3_K_M: GGMLType.Q3_K,
    FT.MOSTLY_Q3_K_L: GGMLType.Q3_K,
    FT.MOSTLY_Q4_K_S: GGMLType.Q4_K,
    FT.MOSTLY_Q4_K_M: GGMLType.Q4_K,
    FT.MOSTLY_Q5_K_S: GGMLType.Q5_K,
    FT.MOSTLY_Q5_K_M: GGMLType.Q5_K,
    FT.MOSTLY_Q6_K: GGMLType.Q6_K,
    FT.MOSTLY_TQ1_0: GGMLType.TQ1_0,
    FT.MOSTLY_TQ2_0: GGMLType.TQ2_0,
    FT.MOSTLY_IQ2_XXS: GGMLType.IQ2_XXS,
    FT.MOSTLY_IQ2_XS: GGMLType.IQ2_XS,
    FT.MOSTLY_IQ2_S: GGMLType.IQ2_XS,
    FT.MOSTLY_IQ2_M: GGMLType.IQ2_S,
    FT.MOSTLY_IQ3_XXS: GGMLType.IQ3_XXS,
    FT.MOSTLY_IQ1_S: GGMLType.IQ1_S,
    FT.MOSTLY_IQ1_M: GGMLType.IQ1_M,
    FT.MOSTLY_IQ4_NL: GGMLType.IQ4_NL,
    FT.MOSTLY_IQ4_XS: GGMLType.IQ4_XS,
    FT.MOSTLY_IQ3_S: GGMLType.IQ3_S,
    FT.MOSTLY_IQ3_M: GGMLType.IQ3_S,
}


def default_type(ftype: LlamaFileType | int) -> GGMLType | None:
    """The tensor type a file type quantizes to unless a rule says otherwise (None: no such ftype)."""
    try:
        return _DEFAULT_TYPES.get(LlamaFileType(ftype))
    except ValueError:
        return None


def is_quantized(t: GGMLType | int) -> bool:
    """``ggml_is_quantized``: a block type (not F32/F16/BF16/F64/I8..I64)."""
    return GGML_BLOCK_SIZES[GGMLType(t)][0] > 1


def ggml_name(t: GGMLType | int) -> str:
    """The type's name as ggml prints it: ``q4_K``, ``q8_0``, ``f16``, ``iq4_nl``."""
    try:
        name = GGMLType(t).name.lower()
    except ValueError:
        return f"type {t}"
    return name[:-2] + "_K" if name.endswith("_k") else name


def parse_ggml_type(text: str) -> GGMLType:
    """A ggml type name, case-insensitive (``q8_0``, ``Q6_K``, ``f16``)."""
    for t in GGMLType:
        if t.name.lower() == text.lower():
            return t
    raise UsageError(f"invalid ggml type {text!r}")


def parse_preset(text: str) -> Preset:
    """A preset by name (case-insensitive, aliases included) or by file-type number."""
    for p in PRESETS:
        if p.name.lower() == text.lower():
            return p
    try:
        number = int(text.strip())
    except ValueError:
        number = None
    if number is not None:
        for p in PRESETS:
            if p.ftype == number:
                return p
    names = ", ".join(p.name for p in PRESETS)
    raise UsageError(f"invalid quantization type {text!r}; expected one of: {names}")
