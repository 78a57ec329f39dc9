"""Context settings (llama.cpp's ``llama_context_params`` names) and thread setup."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numba

from ..errors import UsageError
from ..models.common import RopeOverrides

THREADING_LAYERS = ("default", "omp", "workqueue", "tbb")
KERNEL_FORMATS_ENV = "LLAMACPY_KERNEL_FORMATS"


@dataclass(frozen=True)
class ContextParams:
    """How to run a model. ``0`` means "from the model" (``n_ctx``) or "auto" (threads)."""

    n_ctx: int = 4096
    n_batch: int = 2048  # most tokens one decode() call accepts
    n_ubatch: int = 512  # most tokens one forward pass computes
    n_seq_max: int = 1
    n_threads: int = 0  # decode (single-token ubatches)
    n_threads_batch: int = 0  # prompt processing
    type_k: str = "f16"
    type_v: str = "f16"
    # sliding-window layers keep every cell (n_ctx) instead of the window plus a ubatch
    swa_full: bool = False
    # batch-invariant results: a sequence's logits do not depend on the other sequences of
    # its batches, on where its cells are, on the ubatch size or the thread count (one
    # attention kernel, cells in order of position); costs prompt speed (see the README)
    deterministic: bool = False
    use_mmap: bool = True
    use_mlock: bool = False
    threading_layer: str = "omp"
    # which matmul kernels the compiled forward pass links: "model" (only the formats of the
    # loaded model: the fastest first start) or "all" (one compiled forward per architecture
    # serves a model of any format: no new compile when switching quantizations). The
    # default is the environment's LLAMACPY_KERNEL_FORMATS, else "model".
    kernel_formats: str = field(
        default_factory=lambda: os.environ.get(KERNEL_FORMATS_ENV) or "model"
    )
    backend: str = "cpu"  # where weights, cache and forward live (llamacpy.models.backend)
    rope: RopeOverrides = field(default_factory=RopeOverrides)
    # embeddings: hidden states after the final norm, pooled per sequence (Context.embed)
    embeddings: bool = False
    pooling_type: str = "unspecified"  # none | mean | cls | last; unspecified: the model's

    def check(self) -> None:
        for name in ("n_batch", "n_ubatch", "n_seq_max"):
            if getattr(self, name) < 1:
                raise UsageError(f"{name} must be at least 1, not {getattr(self, name)}")
        if self.n_ctx < 0 or self.n_threads < 0 or self.n_threads_batch < 0:
            raise UsageError("n_ctx and thread counts must not be negative")
        if self.kernel_formats not in ("model", "all"):
            raise UsageError(
                f"kernel_formats must be 'model' or 'all', not {self.kernel_formats!r}"
                + (f" (from {KERNEL_FORMATS_ENV})" if os.environ.get(KERNEL_FORMATS_ENV) else "")
            )
        from ..models.backend import backend

        backend(self.backend)  # a UsageError naming the available backends
        if self.pooling_type not in ("unspecified", "none", "mean", "cls", "last", "rank"):
            raise UsageError(
                f"unknown pooling type {self.pooling_type!r}; "
                "choose one of none, mean, cls, last, rank (or unspecified)"
            )
        if self.threading_layer not in THREADING_LAYERS:
            raise UsageError(
                f"unknown threading layer {self.threading_layer!r}; "
                f"choose one of {', '.join(THREADING_LAYERS)}"
            )


def physical_cores() -> int:
    """Physical cores available to this process (llama.cpp's default thread count)."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
    cores = set()
    for c in cpus:
        base = Path(f"/sys/devices/system/cpu/cpu{c}/topology")
        try:
            cores.add(
                (base / "physical_package_id").read_text().strip()
                + ":"
                + (base / "core_id").read_text().strip()
            )
        except OSError:
            cores.add(str(c))
    return max(1, len(cores))


def setup_threads(layer: str, n_threads: int) -> int:
    """Select numba's threading layer (effective before its first parallel call) and return
    the usable thread count (at most numba's pool size)."""
    from numba.np.ufunc import parallel

    if not parallel._is_initialized:
        numba.config.THREADING_LAYER = layer
    return max(1, min(n_threads, numba.config.NUMBA_NUM_THREADS))
