"""GGUF format constants: value types, ggml tensor types and their block layouts, file types.

Numbers are the on-disk values defined by the GGUF specification and ggml; they must never
change.
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)  # version 1 (32-bit counts) is obsolete, as in llama.cpp
GGUF_DEFAULT_ALIGNMENT = 32
GGML_MAX_NAME = 64  # tensor names must be shorter than this (ggml's fixed-size name field)
GGML_MAX_DIMS = 4
QK_K = 256

# Magic numbers of the pre-GGUF formats, as the bytes they appear as on disk.
LEGACY_MAGICS = {
    b"lmgg": "GGML",
    b"fmgg": "GGMF",
    b"tjgg": "GGJT",
    b"algg": "GGLA",
    b"nsgg": "GGSN",
    b"ggml": "GGML",
    b"ggmf": "GGMF",
    b"ggjt": "GGJT",
}


class GGUFValueType(IntEnum):
    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


# struct format and numpy dtype of every fixed-size scalar value type (little-endian)
SCALAR_FORMATS: dict[GGUFValueType, str] = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}
SCALAR_DTYPES: dict[GGUFValueType, np.dtype] = {
    t: np.dtype(f.replace("?", "u1")) if t == GGUFValueType.BOOL else np.dtype(f)
    for t, f in SCALAR_FORMATS.items()
}
SCALAR_SIZES: dict[GGUFValueType, int] = {t: d.itemsize for t, d in SCALAR_DTYPES.items()}
INTEGER_RANGES: dict[GGUFValueType, tuple[int, int]] = {
    GGUFValueType.UINT8: (0, 2**8 - 1),
    GGUFValueType.INT8: (-(2**7), 2**7 - 1),
    GGUFValueType.UINT16: (0, 2**16 - 1),
    GGUFValueType.INT16: (-(2**15), 2**15 - 1),
    GGUFValueType.UINT32: (0, 2**32 - 1),
    GGUFValueType.INT32: (-(2**31), 2**31 - 1),
    GGUFValueType.UINT64: (0, 2**64 - 1),
    GGUFValueType.INT64: (-(2**63), 2**63 - 1),
}


class GGMLType(IntEnum):
    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39
    NVFP4 = 40
    Q1_0 = 41
    Q2_0 = 42


# (elements per block, bytes per block) of every ggml type
GGML_BLOCK_SIZES: dict[GGMLType, tuple[int, int]] = {
    GGMLType.F32: (1, 4),
    GGMLType.F16: (1, 2),
    GGMLType.Q4_0: (32, 2 + 16),
    GGMLType.Q4_1: (32, 2 + 2 + 16),
    GGMLType.Q5_0: (32, 2 + 4 + 16),
    GGMLType.Q5_1: (32, 2 + 2 + 4 + 16),
    GGMLType.Q8_0: (32, 2 + 32),
    GGMLType.Q8_1: (32, 2 + 2 + 32),
    GGMLType.Q2_K: (QK_K, 2 + 2 + QK_K // 16 + QK_K // 4),
    GGMLType.Q3_K: (QK_K, 2 + QK_K // 4 + QK_K // 8 + 12),
    GGMLType.Q4_K: (QK_K, 2 + 2 + QK_K // 2 + 12),
    GGMLType.Q5_K: (QK_K, 2 + 2 + QK_K // 2 + QK_K // 8 + 12),
    GGMLType.Q6_K: (QK_K, 2 + QK_K // 2 + QK_K // 4 + QK_K // 16),
    GGMLType.Q8_K: (QK_K, 4 + QK_K + QK_K // 8),
    GGMLType.IQ2_XXS: (QK_K, 2 + QK_K // 4),
    GGMLType.IQ2_XS: (QK_K, 2 + QK_K // 4 + QK_K // 32),
    GGMLType.IQ3_XXS: (QK_K, 2 + QK_K // 4 + QK_K // 8),
    GGMLType.IQ1_S: (QK_K, 2 + QK_K // 8 + QK_K // 16),
    GGMLType.IQ4_NL: (32, 2 + 16),
    GGMLType.IQ3_S: (QK_K, 2 + QK_K // 4 + QK_K // 8 + QK_K // 32 + 4),
    GGMLType.IQ2_S: (QK_K, 2 + QK_K // 4 + QK_K // 16),
    GGMLType.IQ4_XS: (QK_K, 2 + 2 + QK_K // 2 + QK_K // 64),
    GGMLType.I8: (1, 1),
    GGMLType.I16: (1, 2),
    GGMLType.I32: (1, 4),
    GGMLType.I64: (1, 8),
    GGMLType.F64: (1, 8),
    GGMLType.IQ1_M: (QK_K, QK_K // 8 + QK_K // 16 + QK_K // 32),
    GGMLType.BF16: (1, 2),
    GGMLType.TQ1_0: (QK_K, 2 + 4 * 13),
    GGMLType.TQ2_0: (QK_K, 2 + 64),
    GGMLType.MXFP4: (32, 1 + 16),
    GGMLType.NVFP4: (64, 4 + 32),
    GGMLType.Q1_0: (128, 2 + 16),
    GGMLType.Q2_0: (64, 2 + 16),
}

# numpy dtype for types whose elements are plain scalars; bf16 is exposed as its raw uint16 bits
GGML_NUMPY_DTYPES: dict[GGMLType, np.dtype] = {
    GGMLType.F32: np.dtype("<f4"),
    GGMLType.F16: np.dtype("<f2"),
    GGMLType.BF16: np.dtype("<u2"),
    GGMLType.I8: np.dtype("i1"),
    GGMLType.I16: np.dtype("<i2"),
    GGMLType.I32: np.dtype("<i4"),
    GGMLType.I64: np.dtype("<i8"),
    GGMLType.F64: np.dtype("<f8"),
}


def ggml_type_name(t: int) -> str:
    """Name of a ggml type id, or ``'type <n>'`` for an id ggml does not define."""
    try:
        return GGMLType(t).name
    except ValueError:
        return f"type {t}"


def row_nbytes(ggml_type: GGMLType, n_elements: int) -> int:
    """Bytes used by ``n_elements`` consecutive values; must be a whole number of blocks."""
    block, nbytes = GGML_BLOCK_SIZES[ggml_type]
    if n_elements % block:
        raise ValueError(
            f"{n_elements} elements is not a multiple of the {ggml_type.name} block size {block}"
        )
    return n_elements // block * nbytes


class LlamaFileType(IntEnum):
    """``general.file_type``: the dominant weight format, as llama.cpp's ``llama_ftype``."""

    ALL_F32 = 0
    MOSTLY_F16 = 1
    MOSTLY_Q4_0 = 2
    MOSTLY_Q4_1 = 3
    MOSTLY_Q8_0 = 7
    MOSTLY_Q5_0 = 8
    MOSTLY_Q5_1 = 9
    MOSTLY_Q2_K = 10
    MOSTLY_Q3_K_S = 11
    MOSTLY_Q3_K_M = 12
    MOSTLY_Q3_K_L = 13
    MOSTLY_Q4_K_S = 14
    MOSTLY_Q4_K_M = 15
    MOSTLY_Q5_K_S = 16
    MOSTLY_Q5_K_M = 17
    MOSTLY_Q6_K = 18
    MOSTLY_IQ2_XXS = 19
    MOSTLY_IQ2_XS = 20
    MOSTLY_Q2_K_S = 21
    MOSTLY_IQ3_XS = 22
    MOSTLY_IQ3_XXS = 23
    MOSTLY_IQ1_S = 24
    MOSTLY_IQ4_NL = 25
    MOSTLY_IQ3_S = 26
    MOSTLY_IQ3_M = 27
    MOSTLY_IQ2_S = 28
    MOSTLY_IQ2_M = 29
    MOSTLY_IQ4_XS = 30
    MOSTLY_IQ1_M = 31
    MOSTLY_BF16 = 32
    MOSTLY_TQ1_0 = 36
    MOSTLY_TQ2_0 = 37
    MOSTLY_MXFP4_MOE = 38
    MOSTLY_NVFP4 = 39
    MOSTLY_Q1_0 = 40
    MOSTLY_Q2_0 = 41
    GUESSED = 1024


def file_type_name(ft: int) -> str:
    """Display name of a ``general.file_type`` value, e.g. ``Q4_K_M`` or ``F16``."""
    try:
        name = LlamaFileType(ft).name
    except ValueError:
        return f"unknown ({ft})"
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")


# Keys of llama.cpp's split (shard) convention.
KEY_SPLIT_NO = "split.no"
KEY_SPLIT_COUNT = "split.count"
KEY_SPLIT_TENSORS_COUNT = "split.tensors.count"
KEY_ALIGNMENT = "general.alignment"
KEY_ARCHITECTURE = "general.architecture"
KEY_FILE_TYPE = "general.file_type"

# The recommended-sampling keys ``general.sampling.<name>`` llama.cpp reads (common.cpp) and
# its converter writes, in the order written: name -> kind ("seq": a sampler sequence string,
# "int": int32, "float": float32).
GENERAL_SAMPLING = dict(
    sequence="seq", top_k="int", top_p="float", min_p="float", xtc_probability="float",
    xtc_threshold="float", temp="float", penalty_last_n="int", penalty_repeat="float",
    mirostat="int", mirostat_tau="float", mirostat_eta="float",
)  # fmt: skip
