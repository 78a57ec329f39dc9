"""The memory interface between the engine and a model (llama.cpp's ``llama_memory_i``).

What a context keeps between ubatches for its sequences, behind one contract, so that the
engine (``Context.decode``, the server's slots, state save/restore) does not depend on the
kind of memory a model needs:

* **sequences**: ``seq_rm``, ``seq_cp``, ``seq_keep``, ``seq_add``, ``seq_div`` (positions
  shifted or divided), ``seq_pos_min`` / ``seq_pos_max`` / ``seq_pos_max_all``, ``clear``;
* **a ubatch**: ``prepare(ub)`` places its tokens and returns their :class:`Slots` (the
  cells each token's keys and values go to, the cells the forward looks at, which of them
  each token sees; for the global layers and for the sliding-window layers; a
  ``KVCacheFullError`` when no cells are left), ``apply_shift(rope, freqs)`` (pending
  position changes applied to the stored keys before the next forward),
  ``forward_arrays()`` (what the compiled forward reads and writes);
* **state**: ``get_state()`` / ``set_state(state)`` (arrays, for save / restore),
  ``nbytes``, ``n_used``.

The kinds:

* :class:`~.kv_cache.KVCache`, the unified KV cache: every layer's keys and values in
  ``n_ctx`` shared cells;
* :class:`~.iswa.ISWACache` (llama.cpp's iSWA), for models with sliding-window layers
  (gemma3): the global layers in a unified cache of ``n_ctx`` cells, the window layers in
  a second one of only the window plus a ubatch (rounded up to 256), whose cells are taken
  again once they left their sequence's window; ``Slots`` and ``forward_arrays`` come in
  two parts, which the forward picks per layer (``L.swa``). A continuation of a cached
  sequence can keep only what the window part still holds (``n_keep``);

* :class:`~.recurrent.RecurrentMemory` (llama.cpp's recurrent memory, for hybrid and
  state-space models): one fixed-size convolution row and SSM row per sequence per
  recurrent layer instead of cells; ``seq_cp`` copies the rows, ``seq_rm`` of a sequence's
  tail returns False unless it removes the whole sequence, ``seq_add`` / ``seq_div`` move
  only its last position; ``Slots.rows`` gives each token's state row;
* :class:`~.recurrent.HybridMemory`: a KV cache for the attention layers and a recurrent
  memory for the others (``seq_rm`` tried on the recurrent part first).

The two-part kinds derive from :class:`PairedMemory`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from ..errors import UsageError
from .batch import UBatch


@dataclass
class Slots:
    """Where a ubatch went: per layer kind (global, sliding-window) the cell of each token
    (int32 ``[n]``), the cells the forward's attention looks at (``n_kv``: the first ones)
    and the mask (uint8 ``[n, n_kv]``, 1 where token ``t`` sees cell ``c``); with
    ``prepare(ub, ordered=True)`` also the ``n_kv`` cells in order of position (int32),
    the order a deterministic forward attends them in (None otherwise)."""

    cells: np.ndarray
    n_kv: int
    mask: np.ndarray
    cells_swa: np.ndarray
    n_kv_swa: int
    mask_swa: np.ndarray
    order: np.ndarray | None = None
    order_swa: np.ndarray | None = None
    # int32 [n]: each token's state row in a recurrent memory (None: no recurrent part)
    rows: np.ndarray | None = None


def state_parts(state: dict[str, np.ndarray], names: tuple[str, ...], kind: str) -> list[dict]:
    """A two-part memory's saved state split by the prefixes ``name.`` (a ``UsageError``
    when a part is missing: the state was not saved from a model with ``kind``)."""
    parts = []
    for name in names:
        sub = {k[len(name) + 1 :]: a for k, a in state.items() if k.startswith(name + ".")}
        if not sub:
            raise UsageError(
                f"the state has no {name!r} part: it was not saved from a model with {kind}"
            )
        parts.append(sub)
    return parts


def state_fields(
    state: dict[str, np.ndarray],
    what: str,
    fields: dict[str, type | None],
    layout: np.ndarray,
    mismatch: str,
) -> list[np.ndarray]:
    """The arrays ``fields`` (name -> dtype, None: as saved) of a saved state, once its
    ``layout`` equals this memory's; a ``UsageError`` (``"{what} state: missing field"``, or
    ``mismatch`` formatted with the saved and this memory's layouts) otherwise."""
    try:
        saved = np.asarray(state["layout"])
        arrays = [np.asarray(state[k], dt) for k, dt in fields.items()]
    except KeyError as e:
        raise UsageError(f"{what} state: missing field {e}") from None
    if not np.array_equal(saved, layout):
        raise UsageError(mismatch.format(saved.tolist(), layout.tolist()))
    return arrays


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

    def n_keep(self, seq_id: int, n: int) -> int:
        """How many of a sequence's first positions a continuation from position ``n`` can
        keep: ``n``, or 0 when the memory no longer holds what the next token needs (a
        sliding-window part that dropped the positions inside its window)."""
        return n

    # ------------------------------------------------------------------ one ubatch
    @abstractmethod
    def prepare(self, ub: UBatch, ordered: bool = False) -> Slots:
        """Place the ubatch's tokens (taking cells for them) and say where they went;
        ``ordered``: with the attended cells in order of position."""

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

    def get_seq_state(self, seq_id: int) -> dict[str, np.ndarray]:
        """One sequence's part of the memory as named arrays (a slot save); memories that
        cannot single a sequence out raise ``UsageError``."""
        raise UsageError(f"saving one sequence is not supported for a {type(self).__name__}")

    def set_seq_state(self, seq_id: int, state: dict[str, np.ndarray]) -> None:
        """Replace sequence ``seq_id`` by a :meth:`get_seq_state` snapshot (checked first:
        nothing changes on a ``UsageError``)."""
        raise UsageError(f"restoring one sequence is not supported for a {type(self).__name__}")

    @property
    @abstractmethod
    def nbytes(self) -> int:
        """Bytes of storage."""

    def describe(self) -> list[str]:
        """Lines on the storage, as llama.cpp logs its caches when it creates them."""
        return []

    @property
    @abstractmethod
    def n_used(self) -> int:
        """Cells (or rows) in use."""


class PairedMemory(Memory):
    """Two memories behind one (an iSWA cache's global and window parts, a hybrid memory's
    attention and recurrent parts): ``PARTS`` names the attributes holding them, which are
    also the prefixes of their saved states, and ``KIND`` the models such a state comes from.
    Sequence changes go to both parts in order; ``nbytes`` is both parts', ``n_used`` the
    first's."""

    PARTS: tuple[str, str]
    KIND: str

    def _both(self) -> tuple[Memory, Memory]:
        return getattr(self, self.PARTS[0]), getattr(self, self.PARTS[1])

    @staticmethod
    def _split_ropes(rope, second: tuple[bool, ...]) -> tuple[list, list]:
        """A per-layer rope list (or one rope for every layer) split into the layers of the
        first part and those of the second (``second[il]``)."""
        ropes = list(rope) if isinstance(rope, list | tuple) else [rope] * len(second)
        return [r for r, s in zip(ropes, second) if not s], [r for r, s in zip(ropes, second) if s]

    # ------------------------------------------------------------------ sequences
    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        for m in self._both():
            m.seq_cp(src, dst, p0, p1)

    def seq_keep(self, seq_id: int) -> None:
        for m in self._both():
            m.seq_keep(seq_id)

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        for m in self._both():
            m.seq_add(seq_id, p0, p1, delta)

    def seq_div(self, seq_id: int, p0: int, p1: int, d: int) -> None:
        for m in self._both():
            m.seq_div(seq_id, p0, p1, d)

    def clear(self) -> None:
        for m in self._both():
            m.clear()

    # ------------------------------------------------------------------ state
    def get_state(self) -> dict[str, np.ndarray]:
        out = {}
        for name, m in zip(self.PARTS, self._both()):
            out.update({f"{name}.{k}": a for k, a in m.get_state().items()})
        return out

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        parts = state_parts(state, self.PARTS, self.KIND)
        mems = self._both()
        checked = [m.check_state(st) for m, st in zip(mems, parts)]  # both before either
        for m, arrays in zip(mems, checked):
            m._load(arrays)

    def get_seq_state(self, seq_id: int) -> dict[str, np.ndarray]:
        out = {}
        for name, m in zip(self.PARTS, self._both()):
            out.update({f"{name}.{k}": a for k, a in m.get_seq_state(seq_id).items()})
        return out

    def set_seq_state(self, seq_id: int, state: dict[str, np.ndarray]) -> None:
        parts = state_parts(state, self.PARTS, self.KIND)
        mems = self._both()
        checked = [m.check_seq_state(st) for m, st in zip(mems, parts)]  # both before either
        for m, arrays in zip(mems, checked):
            m._load_seq(seq_id, arrays)

    @property
    def nbytes(self) -> int:
        return sum(m.nbytes for m in self._both())

    def describe(self) -> list[str]:
        return [line for m in self._both() for line in m.describe()]

    @property
    def n_used(self) -> int:
        return self._both()[0].n_used
