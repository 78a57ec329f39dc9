"""The memory interface between the engine and a model (llama.cpp's ``llama_memory_i``).

What a context keeps between ubatches for its sequences, behind one contract, so that the
engine (``Context.decode``, the server's slots, state save/restore) does not depend on the
kind of memory a model needs:

* **sequences**: ``seq_rm``, ``seq_cp``, ``seq_keep``, ``seq_add``, ``seq_div`` (positions
  shifted or divided), ``seq_pos_min`` / ``seq_pos_max`` / ``seq_pos_max_all``, ``clear``;
* **a ubatch**: ``place(ub)`` (the cells its tokens go to; a ``KVCacheFullError`` when none
  are free), ``n_kv()`` (the cells the forward looks at), ``mask(ub, n_kv, n_swa)`` (which
  cells each token sees), ``apply_shift(rope, freqs)`` (pending position changes applied
  to the stored keys before the next forward), ``forward_arrays()`` (what the compiled
  forward reads and writes);
* **state**: ``get_state()`` / ``set_state(state)`` (arrays, for save / restore),
  ``nbytes``, ``n_used``.

:class:`~.kv_cache.KVCache` (the unified KV cache: every layer's keys and values in
``n_ctx`` shared cells) is the one kind today. The kinds this contract is shaped for:

* a sliding-window cache (llama.cpp's iSWA): the SWA layers of a gemma3 model keep their
  own cells, only as many as the window plus a ubatch; cells that left every sequence's
  window are reused (``place`` frees them), so a long sequence no longer costs ``n_ctx``
  cells in those layers; ``mask`` and ``forward_arrays`` then come in two parts (global,
  window), which the forward picks per layer (``L.swa``);
* a recurrent state (hybrid and state-space models): one fixed-size row per sequence per
  recurrent layer instead of cells; ``seq_cp`` copies the row, ``seq_rm`` of a sequence's
  tail is refused unless it removes the whole sequence (as llama.cpp's recurrent memory),
  ``seq_add`` / ``seq_div`` do nothing;
* a hybrid memory combining both, each layer using the part its declaration names.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

from .batch import UBatch


class Memory(ABC):
    """A context's per-sequence memory (see the module docstring)."""

    # ------------------------------------------------------------------ sequences
    @abstractmethod
    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        """Forget positions ``[p0, p1)`` of a sequence (-1: all; ``seq_id`` -1: every
        sequence); False when the memory cannot remove that range."""

    @abstractmethod
    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """Let ``dst`` also hold ``src``'s positions ``[p0, p1)``."""

    @abstractmethod
    def seq_keep(self, seq_id: int) -> None:
        """Forget every other sequence."""

    @abstractmethod
    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        """Shift positions ``[p0, p1)`` of a sequence by ``delta``."""

    @abstractmethod
    def seq_div(self, seq_id: int, p0: int, p1: int, d: int) -> None:
        """Divide positions ``[p0, p1)`` of a sequence by ``d``."""

    @abstractmethod
    def seq_pos_min(self, seq_id: int) -> int:
        """Smallest position of the sequence, -1 when it has none."""

    @abstractmethod
    def seq_pos_max(self, seq_id: int) -> int:
        """Largest position of the sequence, -1 when it has none."""

    @abstractmethod
    def seq_pos_max_all(self) -> dict[int, int]:
        """seq_id -> largest position, for every sequence present."""

    @abstractmethod
    def clear(self) -> None:
        """Forget everything."""

    # ------------------------------------------------------------------ one ubatch
    @abstractmethod
    def place(self, ub: UBatch) -> np.ndarray:
        """The cells of the ubatch's tokens (taken for them)."""

    @abstractmethod
    def n_kv(self) -> int:
        """Cells the forward's attention looks at."""

    @abstractmethod
    def mask(self, ub: UBatch, n_kv: int, n_swa: int = 0) -> np.ndarray:
        """Which of the first ``n_kv`` cells each token of the ubatch sees (``n_swa``: only
        the last ``n_swa`` positions of its sequence)."""

    @abstractmethod
    def apply_shift(self, rope, freqs: np.ndarray) -> None:
        """Apply pending position shifts to the stored keys (``rope``: per layer, None
        for a layer whose keys are not rotated)."""

    @abstractmethod
    def forward_arrays(self) -> tuple:
        """What the compiled forward reads and writes (see :mod:`llamacpy.models.compose`)."""

    # ------------------------------------------------------------------ state
    @abstractmethod
    def get_state(self) -> dict[str, np.ndarray]:
        """The memory as named arrays (save)."""

    @abstractmethod
    def set_state(self, state: dict[str, np.ndarray]) -> None:
        """Restore :meth:`get_state`'s arrays (checked against this memory's layout)."""

    @property
    @abstractmethod
    def nbytes(self) -> int:
        """Bytes of storage."""

    @property
    @abstractmethod
    def n_used(self) -> int:
        """Cells (or rows) in use."""
