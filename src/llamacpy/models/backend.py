"""The backend seam: where a model's weights and memory live and what runs its forward.

A model (its declarations and stages) and the engine (batches, sequences, sampling) do not
touch the hardware; they ask the model's :class:`Backend` for

* **weights**: :meth:`Backend.place_weights` copies the tensors a
  :class:`~.weights.WeightStore` registered from the file into the backend's memory, in the
  layout its kernels read;
* **memory**: :meth:`Backend.zeros` gives the storage of the KV cache (and of any other
  per-sequence state), zero-filled;
* **compute**: :meth:`Backend.forward_kernel` turns a block (stage names) into its forward;
  :meth:`Backend.workspace` gives the scratch buffers of a ubatch;
  :meth:`Backend.run` runs one ubatch through the forward.

:class:`CPUBackend` is the one that exists: weights repacked into one numpy buffer
(:mod:`llamacpy.ops.formats`, copied by a background thread), lazily committed numpy arrays
for memory, the numba forward composed from :mod:`.stages` (:mod:`.compose`) running in
one parallel region. A second backend (CUDA, say) implements the same five methods: device
buffers for weights (its own repacked layout: the weight-format traits records give the
block sizes and fields), device arrays for memory (the cache keeps its cell bookkeeping on
the host and only hands these arrays to the forward), and a forward per block built from
the same stage names, with a numpy-reference test per architecture
(``tests/test_reference.py``) as its specification.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numba
import numpy as np

from ..errors import UsageError
from ..kernel_cache import preload
from .common import lazy_zeros
from .compose import compiled_forward


class Backend(ABC):
    """What a model and the engine need from the hardware (see the module docstring)."""

    name: str

    @abstractmethod
    def place_weights(self, store, source) -> None:
        """Copy (and repack) the store's registered tensors from ``source`` (the file)."""

    @abstractmethod
    def zeros(self, shape: tuple[int, ...], dtype) -> Any:
        """Zero-filled memory for caches and states."""

    @abstractmethod
    def forward_kernel(self, block: tuple[str, ...]) -> Any:
        """The compiled forward of a block (its stage names, in order)."""

    @abstractmethod
    def workspace(self, kind, *args) -> Any:
        """The scratch buffers a model's workspace class ``kind`` describes (``args``: its
        sizes: hyper-parameters or model, tokens per ubatch, threads)."""

    @abstractmethod
    def run(self, kernel, args: tuple, store, n_threads: int) -> None:
        """Run one ubatch through ``kernel`` on ``n_threads`` threads (waits for
        ``store``'s weights first)."""

    @abstractmethod
    def set_threads(self, n_threads: int) -> None:
        """Threads of the calling thread's next computations."""


class CPUBackend(Backend):
    """numpy memory, repacked weights and numba kernels on this machine's cores."""

    name = "cpu"

    def place_weights(self, store, source) -> None:
        store.build(source)

    def zeros(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        return lazy_zeros(shape, dtype)

    def forward_kernel(self, block: tuple[str, ...]):
        return compiled_forward(block)

    def workspace(self, kind, *args):
        return kind(*args)

    def set_threads(self, n_threads: int) -> None:
        """Run the calling thread's parallel regions on ``n_threads`` threads (numba's
        setting is per calling thread)."""
        if numba.get_num_threads() != n_threads:
            numba.set_num_threads(n_threads)

    def run(self, kernel, args: tuple, store, n_threads: int) -> None:
        self.set_threads(n_threads)
        if store.pending:  # first call: load the machine code while the weights are copied
            preload(kernel, args)
        store.wait()  # (raises if the copy failed)
        kernel(*args)


CPU = CPUBackend()
BACKENDS: dict[str, Backend] = {CPU.name: CPU}


def backend(name: str | Backend | None) -> Backend:
    """The backend called ``name`` (None: the CPU); a :class:`UsageError` for others."""
    if name is None:
        return CPU
    if isinstance(name, Backend):
        return name
    try:
        return BACKENDS[name]
    except KeyError:
        raise UsageError(
            f"unknown backend {name!r}; available: {', '.join(sorted(BACKENDS))}"
        ) from None
