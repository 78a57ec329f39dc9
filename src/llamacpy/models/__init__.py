"""L3: one module per ``general.architecture``, found through a lazy registry.

``load_model(path)`` opens a GGUF model (or the first shard of a split one), looks its
architecture up here, imports that module only then, and returns the loaded model. Adding an
architecture = its module + one line in ``_ARCHITECTURES`` + its entry in the shared tests.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from ..errors import ModelError
from ..gguf import GGUFModelFile
from ..gguf.constants import KEY_ARCHITECTURE
from .common import RopeOverrides
from .weights import TensorSource, model_file

# architecture -> (module, class)
_ARCHITECTURES: dict[str, tuple[str, str]] = {
    "llama": ("llamacpy.models.llama", "LlamaModel"),
    "gemma3": ("llamacpy.models.gemma3", "Gemma3Model"),
    "qwen2": ("llamacpy.models.qwen2", "Qwen2Model"),
    "qwen3": ("llamacpy.models.qwen3", "Qwen3Model"),
    "phi3": ("llamacpy.models.phi3", "Phi3Model"),
    "bert": ("llamacpy.models.bert", "BertModel"),
}


def supported_architectures() -> tuple[str, ...]:
    return tuple(_ARCHITECTURES)


def model_class(arch: str) -> Any:
    """The model class of an architecture (imported on first use)."""
    try:
        module, name = _ARCHITECTURES[arch]
    except KeyError:
        raise ModelError(
            f"architecture {arch!r} is not supported by the engine (key {KEY_ARCHITECTURE!r}); "
            f"supported: {', '.join(_ARCHITECTURES)}"
        ) from None
    return getattr(importlib.import_module(module), name)


def load_model(
    path: str | os.PathLike[str] | GGUFModelFile,
    *,
    use_mmap: bool = True,
    rope: RopeOverrides | None = None,
    background: bool = True,
) -> Any:
    """Open, check and load a model for inference. ``path`` may be an already opened
    :class:`~llamacpy.gguf.GGUFModelFile` (its metadata is not parsed again; the caller
    keeps it open and closes it).

    Everything is checked before this returns; with ``background`` the weights are then
    copied into the kernels' layout by a thread while the caller goes on (the model's
    forward pass, or reading its weight store, waits for them)."""
    own = not isinstance(path, GGUFModelFile)
    mf = model_file(path) if own else path
    source = TensorSource(mf, use_mmap=use_mmap, background=background)
    try:
        arch = mf.get(KEY_ARCHITECTURE)
        if not isinstance(arch, str):
            raise ModelError(f"{path}: missing metadata key {KEY_ARCHITECTURE!r}")
        model = model_class(arch).load(mf, source, rope)
    except BaseException:
        source.close()
        raise
    finally:
        if own:
            mf.close()  # the source maps the shards itself
    store = getattr(model, "store", None)
    if store is not None:
        store.after_build(source.close)
    else:
        source.close()
    return model


__all__ = ["RopeOverrides", "load_model", "model_class", "supported_architectures"]
