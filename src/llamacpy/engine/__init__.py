"""L4: batches, the KV cache with sequence operations, and the inference context.

The names are imported on first use (``from llamacpy.engine import Context``), so that
``llamacpy.engine.params`` alone stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_NAMES = {
    "Batch": "batch",
    "BatchError": "batch",
    "UBatch": "batch",
    "Context": "context",
    "generate": "generate",
    "KVCache": "kv_cache",
    "KVCacheFullError": "kv_cache",
    "ContextParams": "params",
}

__all__ = [
    "Batch",
    "BatchError",
    "Context",
    "ContextParams",
    "KVCache",
    "KVCacheFullError",
    "UBatch",
    "generate",
]


def __getattr__(name: str) -> Any:
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_NAMES})


if TYPE_CHECKING:
    from .batch import Batch, BatchError, UBatch
    from .context import Context
    from .generate import generate
    from .kv_cache import KVCache, KVCacheFullError
    from .params import ContextParams
