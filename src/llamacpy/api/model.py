"""Opening a model for inference: resolve the ``-m`` argument, read metadata, build the
tokenizer and the engine context, and describe the model the way llama.cpp does
(``llama 256M Q4_1``, size in bytes, parameter count, metadata as strings)."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .._startup import gc_paused, resume_gc
from ..engine.params import ContextParams
from ..errors import UsageError
from ..gguf import GGUFModelFile
from ..gguf.constants import LlamaFileType
from ..models import load_model as load_weights
from ..registry import resolve_model
from ..tokenizer import Tokenizer

if TYPE_CHECKING:
    from ..engine.context import Context

# llama.cpp's llama_ftype_name for the file types that differ from the enum name
_FTYPE_NAMES = {
    "ALL_F32": "all F32",
    "MOSTLY_MXFP4_MOE": "MXFP4 MoE",
    "MOSTLY_Q2_K": "Q2_K - Medium",
    "MOSTLY_Q2_K_S": "Q2_K - Small",
    "MOSTLY_Q3_K_S": "Q3_K - Small",
    "MOSTLY_Q3_K_M": "Q3_K - Medium",
    "MOSTLY_Q3_K_L": "Q3_K - Large",
    "MOSTLY_Q4_K_S": "Q4_K - Small",
    "MOSTLY_Q4_K_M": "Q4_K - Medium",
    "MOSTLY_Q5_K_S": "Q5_K - Small",
    "MOSTLY_Q5_K_M": "Q5_K - Medium",
    "MOSTLY_TQ1_0": "TQ1_0 - 1.69 bpw ternary",
    "MOSTLY_TQ2_0": "TQ2_0 - 2.06 bpw ternary",
    "MOSTLY_IQ2_XXS": "IQ2_XXS - 2.0625 bpw",
    "MOSTLY_IQ2_XS": "IQ2_XS - 2.3125 bpw",
    "MOSTLY_IQ2_S": "IQ2_S - 2.5 bpw",
    "MOSTLY_IQ2_M": "IQ2_M - 2.7 bpw",
    "MOSTLY_IQ3_XS": "IQ3_XS - 3.3 bpw",
    "MOSTLY_IQ3_XXS": "IQ3_XXS - 3.0625 bpw",
    "MOSTLY_IQ1_S": "IQ1_S - 1.5625 bpw",
    "MOSTLY_IQ1_M": "IQ1_M - 1.75 bpw",
    "MOSTLY_IQ4_NL": "IQ4_NL - 4.5 bpw",
    "MOSTLY_IQ4_XS": "IQ4_XS - 4.25 bpw",
    "MOSTLY_IQ3_S": "IQ3_S - 3.4375 bpw",
    "MOSTLY_IQ3_M": "IQ3_S mix - 3.66 bpw",
}

# llama architecture: n_layer -> size label (llama.cpp's llm_type for LLM_ARCH_LLAMA)
_LLAMA_TYPES = {16: "1B", 22: "1B", 26: "3B", 28: "3B", 30: "256M", 36: "8B", 40: "13B",
                48: "34B", 60: "30B"}  # fmt: skip


def ftype_name(ft: int | None) -> str:
    """``llama_ftype_name``: ``Q4_1``, ``Q4_K - Medium``, ``all F32`` ..."""
    if ft is None:
        return "all F32"
    guessed = bool(ft & LlamaFileType.GUESSED)
    try:
        name = LlamaFileType(ft & ~LlamaFileType.GUESSED).name
    except ValueError:
        text = "unknown, may not work"
    else:
        text = _FTYPE_NAMES.get(name, name.removeprefix("MOSTLY_"))
    return f"(guessed) {text}" if guessed else text


def size_label(md: Mapping[str, Any]) -> str:
    """llama.cpp's model type label (``256M``, ``8B``; ``?B`` when it has none)."""
    arch = md.get("general.architecture")
    n_layer = int(md.get(f"{arch}.block_count", 0) or 0)
    if arch == "llama" and int(md.get(f"{arch}.expert_count", 0) or 0) != 8:
        if n_layer == 32:
            n_vocab = int(md.get(f"{arch}.vocab_size", 0) or 0)
            return "3B" if n_vocab == 49152 else ("7B" if 0 < n_vocab < 40000 else "8B")
        if n_layer == 80:
            same = md.get(f"{arch}.attention.head_count") == md.get(
                f"{arch}.attention.head_count_kv"
            )
            return "65B" if same else "70B"
        return _LLAMA_TYPES.get(n_layer, "?B")
    n_embd = int(md.get(f"{arch}.embedding_length", 0) or 0)
    if arch == "gemma3":  # src/models/<arch>.cpp: load_arch_hparams
        return {18: "270M", 26: "1B", 32: "8B", 34: "4B", 48: "12B", 62: "27B"}.get(n_layer, "?B")
    if arch == "qwen3":
        if n_layer == 28:
            return "0.6B" if n_embd == 1024 else "1.7B"
        if n_layer == 36:
            return "4B" if n_embd == 2560 else "8B"
        return {40: "14B", 64: "32B"}.get(n_layer, "?B")
    if arch == "qwen2":
        if n_layer == 24:
            return "0.5B" if n_embd == 1024 else "1B"
        if n_layer == 28:
            return "1.5B" if n_embd == 1536 else "7B"
        if n_layer == 40:
            return "4B" if int(md.get(f"{arch}.attention.head_count", 0) or 0) == 20 else "13B"
        return {32: "7B", 36: "3B", 48: "14B", 64: "32B", 80: "70B"}.get(n_layer, "?B")
    if arch == "phi3":
        return {24: "1B", 32: "3B", 40: "14B"}.get(n_layer, "?B")
    if arch == "bert":  # llama_model_bert::load_arch_hparams
        if n_layer == 12:
            return {384: "33M", 768: "109M"}.get(int(md.get("bert.embedding_length", 0)), "?B")
        return {3: "17M", 6: "22M", 24: "335M"}.get(n_layer, "?B")
    return "?B"


def metadata_strings(md: Mapping[str, Any]) -> dict[str, str]:
    """Metadata as llama.cpp's ``llama_model_meta_val_str`` shows it: scalars only, floats
    with ``%f``, booleans ``true``/``false`` (what llama-cpp-python's ``Llama.metadata`` is)."""
    out = {}
    for k, v in md.items():
        if isinstance(v, bool | np.bool_):
            out[k] = "true" if v else "false"
        elif isinstance(v, int | np.integer):
            out[k] = str(int(v))
        elif isinstance(v, float | np.floating):
            out[k] = f"{float(v):f}"
        elif isinstance(v, str):
            out[k] = v
    return out


def apply_overrides(md: Mapping[str, Any], overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """Metadata with ``kv_overrides`` applied (bool/int/float/str values, as llama.cpp)."""
    out = dict(md)
    for k, v in (overrides or {}).items():
        if not isinstance(v, bool | int | float | str):
            raise UsageError(f"kv_overrides[{k!r}]: unsupported value type {type(v).__name__}")
        if isinstance(v, str) and len(v.encode()) > 127:
            raise UsageError(f"kv_overrides[{k!r}]: string values are limited to 127 bytes")
        out[k] = v
    return out


@dataclass
class ModelInfo:
    """What a model is, independent of any context."""

    path: Path
    metadata: dict[str, Any]  # scalar metadata (arrays left out), overrides applied
    arch: str
    desc: str  # llama.cpp's model description, e.g. "llama 256M Q4_1"
    size: int  # bytes of tensor data
    n_params: int

    @classmethod
    def read(
        cls, model_path: str | os.PathLike[str], kv_overrides: Mapping[str, Any] | None = None
    ) -> tuple[ModelInfo, Tokenizer]:
        """Read a model's metadata and build its tokenizer (no weights are loaded)."""
        with GGUFModelFile(resolve_model(model_path)) as mf:
            return cls.from_file(mf, kv_overrides)

    @classmethod
    def from_file(
        cls, mf: GGUFModelFile, kv_overrides: Mapping[str, Any] | None = None
    ) -> tuple[ModelInfo, Tokenizer]:
        """:meth:`read` from an opened model file."""
        md = apply_overrides(mf.metadata, kv_overrides)
        tokenizer = Tokenizer.from_metadata(md)
        size = sum(int(t.nbytes) for t in mf.tensors)
        n_params = sum(int(t.n_elements) for t in mf.tensors)
        scalars = {k: v for k, v in md.items() if isinstance(v, bool | int | float | str)}
        arch = str(scalars.get("general.architecture", "?"))
        ft = scalars.get("general.file_type")
        desc = f"{arch} {size_label(scalars)} {ftype_name(None if ft is None else int(ft))}"
        return cls(Path(mf.paths[0]), scalars, arch, desc, size, n_params), tokenizer


@dataclass
class LoadedModel:
    """A model ready to run: info, tokenizer and an engine context."""

    info: ModelInfo
    tokenizer: Tokenizer
    ctx: Context
    load_time: float  # seconds, metadata + weights + context


def load_model(
    model_path: str | os.PathLike[str],
    params: ContextParams,
    kv_overrides: Mapping[str, Any] | None = None,
) -> LoadedModel:
    """Resolve, read and load a model with a context of ``params``.

    ``kv_overrides`` change the tokenizer's and the chat template's metadata; overriding
    model hyper-parameters needs engine support and is refused rather than ignored.
    """
    t0 = time.perf_counter()
    with gc_paused(), GGUFModelFile(resolve_model(model_path)) as mf:  # parsed once, for both
        arch = mf.get("general.architecture")
        for k in kv_overrides or {}:
            if k.startswith(f"{arch}."):
                raise UsageError(
                    f"kv_overrides[{k!r}]: overriding model hyper-parameters is not supported "
                    "by the engine yet (tokenizer.* and general.* keys are)"
                )
        # checked, then the weights are copied in the background while the engine's
        # modules are imported and the tokenizer is built
        model = load_weights(mf, use_mmap=params.use_mmap, rope=params.rope)
        from ..engine.context import Context

        ctx = Context(params=params, model=model)
        info, tokenizer = ModelInfo.from_file(mf, kv_overrides)
    resume_gc()  # the console command's start-up ends here
    return LoadedModel(info, tokenizer, ctx, time.perf_counter() - t0)
