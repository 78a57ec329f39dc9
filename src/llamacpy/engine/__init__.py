"""L4: batches, the KV cache with sequence operations, and the inference context.

The names are imported on first use (``from llamacpy.engine import Context``), so that
``llamacpy.engine.params`` alone stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_names

_NAMES = {
    "Batch": "batch",
    "BatchError": "batch",
    "UBatch": "batch",
    "Context": "context",
    "generate": "greedy",
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


__getattr__, __dir__ = lazy_names(__name__, _NAMES)


if TYPE_CHECKING:
    from .batch import Batch, BatchError, UBatch
    from .context import Context
    from .greedy import generate
    from .kv_cache import KVCache, KVCacheFullError
    from .params import ContextParams
