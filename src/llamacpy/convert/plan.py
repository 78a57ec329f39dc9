"""Output types, tensor data, shards and file names of a conversion.

``--outtype`` rules (llama.cpp's): 1-D tensors, norms, biases and a few listed tensors stay
F32; everything else gets the output type; Q8_0 falls back to F16 for rows that are not a
multiple of 32; ``auto`` picks BF16 or F16 from the first 2-D checkpoint tensor stored in
one of them (else F16). Splitting follows the converter too: a new shard starts when the
next tensor's data would push the current shard's tensor data over ``--split-max-size``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import quants
from ..gguf.constants import GGML_BLOCK_SIZES, GGMLType, LlamaFileType
from ..gguf.split import split_path
from .archs import Planned, TextArch
from .common import ConvertError
from .safetensors import SourceTensor

log = logging.getLogger("llamacpy.convert")

OUTTYPES: dict[str, LlamaFileType] = {
    "f32": LlamaFileType.ALL_F32,
    "f16": LlamaFileType.MOSTLY_F16,
    "bf16": LlamaFileType.MOSTLY_BF16,
    "q8_0": LlamaFileType.MOSTLY_Q8_0,
}
_TENSOR_TYPE = {
    LlamaFileType.ALL_F32: GGMLType.F32,
    LlamaFileType.MOSTLY_F16: GGMLType.F16,
    LlamaFileType.MOSTLY_BF16: GGMLType.BF16,
    LlamaFileType.MOSTLY_Q8_0: GGMLType.Q8_0,
}
_WEIGHT_SUFFIXES = (".weight", ".lora_a", ".lora_b")


def guess_ftype(sources: Iterable[SourceTensor]) -> LlamaFileType:
    """``--outtype auto``: BF16 or F16 after the first 2-D+ tensor stored so, else F16."""
    for st in sources:
        if len(st.shape) < 2:
            continue
        if st.dtype == "BF16":
            return LlamaFileType.MOSTLY_BF16
        if st.dtype == "F16":
            return LlamaFileType.MOSTLY_F16
    return LlamaFileType.MOSTLY_F16


def output_type_name(ftype: LlamaFileType) -> str:
    """``F16``, ``BF16``, ``Q8_0``, ``F32``: the file type's name without its prefix."""
    return ftype.name.partition("_")[2]


@dataclass(frozen=True)
class OutTensor:
    """A planned tensor with its GGML type and size."""

    planned: Planned
    type: GGMLType
    fell_back: bool = False  # Q8_0 requested but the rows do not fit its blocks

    @property
    def name(self) -> str:
        return self.planned.name

    @property
    def ggml_shape(self) -> tuple[int, ...]:
        return tuple(reversed(self.planned.data.shape))

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.planned.data.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        block, size = GGML_BLOCK_SIZES[self.type]
        return self.n_elements // block * size

    def produce(self) -> np.ndarray:
        """Load, transform and encode the tensor (the only time its data is in memory)."""
        lazy = self.planned.data
        try:
            a = lazy.make()
        except (ValueError, IndexError) as e:
            raise ConvertError(f"tensor {self.planned.source!r}: {e}") from None
        if tuple(a.shape) != tuple(lazy.shape):
            raise ConvertError(
                f"tensor {self.planned.source!r}: got shape {a.shape}, expected {lazy.shape}"
            )
        if self.type == GGMLType.F32:
            return np.ascontiguousarray(a, dtype=np.float32)
        if self.type == GGMLType.F16:
            # numpy's conversion, as the reference converter (NaN payloads included)
            return np.ascontiguousarray(a, dtype=np.float16)
        x = np.ascontiguousarray(a, dtype=np.float32)
        return quants.quantize(x, self.type)


def tensor_types(arch: TextArch, planned: list[Planned], ftype: LlamaFileType) -> list[OutTensor]:
    out = []
    for p in planned:
        name, shape = p.name, p.data.shape
        if not 1 <= len(shape) <= 4:
            raise ConvertError(f"tensor {p.source!r} has {len(shape)} dimensions (GGUF: 1 to 4)")
        if (
            len(shape) <= 1
            or name.endswith("_norm.weight")
            or arch.is_f32(name)
            or name[-7:] not in _WEIGHT_SUFFIXES
        ):
            out.append(OutTensor(p, GGMLType.F32))
            continue
        t = _TENSOR_TYPE[ftype]
        if t == GGMLType.Q8_0 and shape[-1] % GGML_BLOCK_SIZES[t][0]:
            log.warning("%s: row size %d is not a multiple of 32; using F16", name, shape[-1])
            out.append(OutTensor(p, GGMLType.F16, fell_back=True))
            continue
        out.append(OutTensor(p, t))
    return out


def total_parameters(tensors: Iterable[OutTensor]) -> int:
    return sum(t.n_elements for t in tensors)


# ---------------------------------------------------------------------------- naming
def size_label(n_params: int, min_digits: int = 2) -> str:
    """``22.57M`` parameters -> ``23M``; ``1.24B`` -> ``1.2B`` (gguf-py's rounded notation)."""
    if n_params > 1e12:
        scaled, suffix = n_params * 1e-12, "T"
    elif n_params > 1e9:
        scaled, suffix = n_params * 1e-9, "B"
    elif n_params > 1e6:
        scaled, suffix = n_params * 1e-6, "M"
    else:
        scaled, suffix = n_params * 1e-3, "K"
    fix = max(min_digits - len(str(round(scaled)).lstrip("0")), 0)
    return f"{scaled:.{fix}f}{suffix}"


def naming_convention(name: str | None, basename: str | None, finetune: str | None,
                      version: str | None, size: str | None, output_type: str | None,
                      model_type: str | None = None) -> str:  # fmt: skip
    """The GGUF naming convention: ``Name-Size-Finetune-Version-Encoding[-Type]``."""
    if basename is not None:
        base = basename.strip().replace(" ", "-").replace("/", "-")
    elif name is not None:
        base = name.strip().replace(" ", "-").replace("/", "-")
    else:
        base = "ggml-model"
    parts = [base]
    if size is not None:
        parts.append(size)
    if finetune is not None:
        parts.append(finetune.strip().replace(" ", "-"))
    if version is not None:
        parts.append(version.strip().replace(" ", "-"))
    if output_type is not None:
        parts.append(output_type.strip().replace(" ", "-").upper())
    if model_type is not None:
        parts.append(model_type.strip().replace(" ", "-"))
    return "-".join(parts)


def fill_template(filename: str, output_type: str) -> str:
    """Replace ``{ftype}``/``{outtype}`` (lower case) and ``{FTYPE}``/``{OUTTYPE}`` in a name."""
    lo, up = output_type.lower(), output_type.upper()
    try:
        return filename.format(lo, outtype=lo, ftype=lo, OUTTYPE=up, FTYPE=up)
    except (IndexError, KeyError, ValueError) as e:
        raise ConvertError(f"invalid --outfile template {filename!r}: {e}") from None


# ---------------------------------------------------------------------------- shards
@dataclass
class Shard:
    path: Path
    tensors: list[OutTensor]

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


def plan_shards(
    path: Path,
    tensors: list[OutTensor],
    *,
    max_size: int | None = None,
    max_tensors: int | None = None,
    no_tensor_first_split: bool = False,
) -> list[Shard]:
    """Group tensors into shards (a single one without limits) named ``STEM-0000i-of-0000n``."""
    groups: list[list[OutTensor]] = [[]]
    if no_tensor_first_split:
        groups.append([])
    for t in tensors:
        cur = groups[-1]
        if cur and (
            (max_tensors and len(cur) >= max_tensors)
            or (max_size and sum(x.nbytes for x in cur) + t.nbytes > max_size)
        ):
            groups.append([])
        groups[-1].append(t)
    if len(groups) == 1:
        if max_size or max_tensors:
            log.warning("the model fits the split limits: writing a single file")
        return [Shard(path, groups[0])]
    if len(groups) > 65535:
        raise ConvertError(f"the split would need {len(groups)} shards (at most 65535)")
    prefix = path.with_name(path.stem)
    return [Shard(split_path(prefix, i, len(groups)), g) for i, g in enumerate(groups)]
