"""L4: batches, the KV cache with sequence operations, and the inference context."""

from .batch import Batch, BatchError, UBatch
from .context import Context
from .generate import generate
from .kv_cache import KVCache, KVCacheFullError
from .params import ContextParams

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
