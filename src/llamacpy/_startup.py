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
