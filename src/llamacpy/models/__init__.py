"""L3: one module per ``general.architecture``, found by its name.

``load_model(path)`` opens a GGUF model (or the first shard of a split one), imports the
module ``llamacpy.models.<architecture>`` (``-`` written ``_``; only then) and loads the model with the class the
module exports as ``MODEL``. Adding an architecture = its module (and its tiny-model
builder in :mod:`.tiny`, which the shared tests run).
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from ..errors import ModelError
from ..gguf import GGUFModelFile
from ..gguf.constants import KEY_ARCHITECTURE
from ..hparams import HParams
from .common import RopeOverrides
from .weights import TensorSource, model_file

_DIR = Path(__file__).resolve().parent
_EXPORT = re.compile(r"^MODEL = ", re.M)


@cache
def supported_architectures() -> tuple[str, ...]:
    """The architectures with a module here (a module that exports ``MODEL``)."""
    found = []
    for p in sorted(_DIR.glob("*.py")):
        if not p.name.startswith("_") and _EXPORT.search(p.read_text(encoding="utf-8")):
            found.append(p.stem.replace("_", "-"))  # (a module name cannot hold "-")
    return tuple(found)


def model_class(arch: str) -> Any:
    """The model class of an architecture (imported on first use)."""
    if arch not in supported_architectures():
        raise ModelError(
            f"architecture {arch!r} is not supported by the engine (key {KEY_ARCHITECTURE!r}); "
            f"supported: {', '.join(supported_architectures())}"
        )
    return importlib.import_module(f"{__name__}.{arch.replace('-', '_')}").MODEL


def check_model(metadata: Mapping[str, Any], tensors: Mapping[str, tuple[int, ...]]) -> HParams:
    """Validate a model file before inference against its architecture's declarations;
    ``tensors`` maps name -> shape (ggml order). Returns the hyper-parameters."""
    arch = metadata.get(KEY_ARCHITECTURE)
    if not isinstance(arch, str):
        raise ModelError(f"missing or non-string metadata key {KEY_ARCHITECTURE!r}")
    return model_class(arch).check(metadata, tensors)


def load_model(
    path: str | os.PathLike[str] | GGUFModelFile,
    *,
    use_mmap: bool = True,
    rope: RopeOverrides | None = None,
    background: bool = True,
    backend: str | None = None,
) -> Any:
    """Open, check and load a model for inference. ``path`` may be an already opened
    :class:`~llamacpy.gguf.GGUFModelFile` (its metadata is not parsed again; the caller
    keeps it open and closes it).

    Everything is checked before this returns; with ``background`` the weights are then
    copied into the kernels' layout by a thread while the caller goes on (the model's
    forward pass, or reading its weight store, waits for them). ``backend``: where the
    weights go and the forward runs (:mod:`.backend`; default the CPU)."""
    own = not isinstance(path, GGUFModelFile)
    mf = model_file(path) if own else path
    source = TensorSource(mf, use_mmap=use_mmap, background=background)
    try:
        arch = mf.get(KEY_ARCHITECTURE)
        if not isinstance(arch, str):
            raise ModelError(f"{path}: missing metadata key {KEY_ARCHITECTURE!r}")
        model = model_class(arch).load(mf, source, rope, backend)
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


__all__ = [
    "RopeOverrides",
    "check_model",
    "load_model",
    "model_class",
    "supported_architectures",
]
