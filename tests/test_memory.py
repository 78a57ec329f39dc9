"""The memory interface (engine/memory.py): the unified KV cache implements all of it."""

from __future__ import annotations

import inspect

import numpy as np

from llamacpy.engine.kv_cache import KVCache
from llamacpy.engine.memory import Memory


def test_the_kv_cache_implements_every_operation_of_the_interface() -> None:
    assert issubclass(KVCache, Memory) and not KVCache.__abstractmethods__
    wanted = {n for n, _ in inspect.getmembers(Memory) if not n.startswith("_")}
    assert {"seq_rm", "seq_cp", "prepare", "n_keep", "apply_shift", "get_state"} <= wanted
    kv = KVCache(2, 2, 32, 64)
    k, v, ks, vs, info = kv.forward_arrays()
    assert k.base is not None and np.shares_memory(k, kv.k) and np.shares_memory(v, kv.v)
    assert ks is k and vs is v  # no sliding-window part: the same cells
    assert info.tolist() == [kv.type_k, kv.type_v, kv.row_bytes, 64, 64, kv.row_bytes]
    assert kv.forward_arrays() is kv.forward_arrays()  # built once, views of the cells
