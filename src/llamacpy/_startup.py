"""Start-up without the cyclic garbage collector.

Start-up allocates hundreds of thousands of objects that live until exit (numba's and
llamacpy's modules, ~230 kernel dispatchers, the vocabulary), and Python's collector, which
runs after every 700 net allocations, walks them over and over: ~200 collections and ~35 ms
of a ~0.5 s ``llamacpy run -n 1``. The console command therefore starts with the collector
off (:func:`pause_gc`) and turns it back on once its model is loaded (:func:`resume_gc`),
after moving everything start-up made into the collector's permanent generation
(``gc.freeze``), so later collections do not walk it either.

A library caller keeps its own collector settings: :func:`gc_paused` only suspends
collections for the duration of a model load and then restores the previous state.
"""

from __future__ import annotations

import gc
import mmap
import os
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_paused = False  # the collector was turned off by pause_gc and is not back on yet


def pause_gc() -> None:
    """Turn the collector off for start-up (a no-op if it is already off)."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def resume_gc() -> None:
    """End of start-up: freeze what it allocated and turn the collector back on, if
    :func:`pause_gc` turned it off (otherwise nothing)."""
    global _paused
    if _paused:
        _paused = False
        gc.freeze()
        gc.enable()


@contextmanager
def gc_paused() -> Iterator[None]:
    """No collections inside the block; the collector's previous state afterwards."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


# ------------------------------------------------------------------ memory for the weights
# A model's repacked weights need about its file size of fresh memory, and faulting that in
# costs ~25 ms per 100 MiB (4 KiB pages, see ``models.weights`` for why not huge pages), so
# the console command asks for it as soon as it knows the model file, and a thread faults it
# in while the interpreter imports numpy and numba.
_MADV_NOHUGEPAGE = getattr(mmap, "MADV_NOHUGEPAGE", 15)
_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)
_MADV_DONTNEED = getattr(mmap, "MADV_DONTNEED", 4)
_MIN_RESERVE = 32 << 20  # smaller models: not worth a thread
_POPULATE_STEP = 8 << 20
_reserve: tuple[threading.Thread, dict, int] | None = None
_reserve_lock = threading.Lock()
_MADVISE = None


def libc_madvise():
    """libc's ``madvise(addr, length, advice)`` through ctypes, which releases the GIL
    (``mmap.madvise`` does not); ``False`` where there is none."""
    global _MADVISE
    if _MADVISE is None:
        import ctypes

        try:
            fn = ctypes.CDLL(None, use_errno=True).madvise
            fn.argtypes = [ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int]  # (compiled calls too)
            fn.restype = ctypes.c_int
            _MADVISE = fn
        except (OSError, AttributeError):
            _MADVISE = False
    return _MADVISE


def _madvise(mm: mmap.mmap, start: int, length: int, advice: int) -> None:
    """:func:`libc_madvise` on part of an anonymous map; failures ignored."""
    import ctypes

    fn = libc_madvise()
    if not fn:
        return
    view = ctypes.c_char.from_buffer(mm)
    try:
        fn(ctypes.addressof(view) + start, length, advice)
    finally:
        del view


_SHARD = re.compile(r"^(.*)-(\d{5})-of-(\d{5})\.gguf$")


def weight_bytes_estimate(path: str) -> int:
    """An upper estimate of the repacked weights of the model file ``path`` (a split model:
    all its shards): the files' size plus 4% (repacking unpacks the 6-bit sub-block scales
    of Q3_K/Q4_K/Q5_K, up to +3.6%)."""
    size = os.path.getsize(path)
    m = _SHARD.match(os.path.basename(path))
    if m:
        d = os.path.dirname(path)
        for i in range(1, int(m[3]) + 1):
            shard = os.path.join(d, f"{m[1]}-{i:05d}-of-{m[3]}.gguf")
            if shard != path and os.path.isfile(shard):
                size += os.path.getsize(shard)
    return size + size // 25


def reserve_memory(nbytes: int) -> None:
    """Start faulting in ``nbytes`` of anonymous memory, in a daemon thread, for
    :func:`take_memory` (once per process; small sizes are ignored)."""
    global _reserve
    if nbytes < _MIN_RESERVE or not hasattr(mmap, "MAP_PRIVATE"):
        return
    nbytes = -nbytes % mmap.PAGESIZE + nbytes
    box: dict = {}

    def work() -> None:
        try:
            mm = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            _madvise(mm, 0, nbytes, _MADV_NOHUGEPAGE)
            # a piece at a time: populating holds the process's memory-map lock, and the
            # imports' mmap() calls (shared libraries, allocator arenas) wait for it
            for start in range(0, nbytes, _POPULATE_STEP):
                _madvise(mm, start, min(_POPULATE_STEP, nbytes - start), _MADV_POPULATE_WRITE)
            box["mm"] = mm
        except (OSError, ValueError, AttributeError):
            pass  # the weights get ordinary memory

    with _reserve_lock:
        if _reserve is not None:
            return
        job = threading.Thread(target=work, name="llamacpy-memory", daemon=True)
        job.start()
        _reserve = (job, box, nbytes)


def take_memory(nbytes: int) -> mmap.mmap | None:
    """The reserved memory if at least ``nbytes`` were reserved (its unused tail handed
    back to the system), else None; either way the reservation is over."""
    global _reserve
    with _reserve_lock:
        if _reserve is None:
            return None
        job, box, size = _reserve
        _reserve = None
    if size < nbytes:
        return None  # (the thread's map is freed when it ends)
    job.join()
    mm = box.get("mm")
    if mm is None:
        return None
    keep = -nbytes % mmap.PAGESIZE + nbytes
    if size > keep:
        _madvise(mm, keep, size - keep, _MADV_DONTNEED)
    return mm
