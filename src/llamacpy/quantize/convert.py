"""Tensor data conversion: input rows -> float32 -> the target type, on a pool of threads.

Each tensor is cut into row chunks of about :data:`CHUNK_ELEMENTS` values (never across a
matrix of a stacked 3-D tensor, so a chunk has one imatrix row). A chunk is dequantized
(llama.cpp's ``to_float``; F32 rows are used in place) and quantized with
:mod:`llamacpy.quants` (``ggml_quantize_chunk``'s bytes); the float32 rows of a chunk stay in
cache.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import GGUFError
from ..gguf.constants import GGML_BLOCK_SIZES, GGMLType
from ..gguf.reader import TensorInfo
from .policy import Category
from .validate import invalid_data

# values converted per work item
CHUNK_ELEMENTS = 1 << 17
# converted tensors may run this far ahead of the writer
LOOKAHEAD_BYTES = 64 << 20


@dataclass(frozen=True)
class TensorJob:
    """One tensor of the output: where it comes from and what it becomes."""

    index: int
    tensor: TensorInfo
    shape: tuple[int, ...]  # ggml order, trailing 1s dropped (as ggml writes it)
    category: Category
    target: GGMLType
    imatrix: np.ndarray | None  # (n_matrices, ne[0]) float32

    @property
    def name(self) -> str:
        return self.tensor.name

    @property
    def convert(self) -> bool:
        return self.target != self.tensor.type

    @property
    def nbytes_out(self) -> int:
        block, size = GGML_BLOCK_SIZES[self.target]
        return self.tensor.n_elements // block * size


def _check_input(t: TensorInfo, raw: np.ndarray) -> None:
    problem = invalid_data(t.type, raw)
    if problem:
        raise GGUFError(f"tensor has invalid data: {problem}", tensor=t.name)


def _rows_f32(t: TensorInfo, row0: int, nrows: int) -> np.ndarray:
    """Rows ``[row0, row0 + nrows)`` of a tensor as float32 of shape (nrows, ne[0]), after
    checking the input bytes as llama.cpp's loader does."""
    from .. import quants

    ne0 = t.shape[0]
    row_bytes = t.nbytes // (t.n_elements // ne0)
    raw = t.raw[row0 * row_bytes : (row0 + nrows) * row_bytes]
    _check_input(t, raw)
    if t.type == GGMLType.F32:
        return raw.view(np.float32).reshape(nrows, ne0)
    fmt = quants.get(t.type, tensor=t.name)
    return fmt.dequantize(raw, nrows * ne0, _scratch(nrows * ne0)).reshape(nrows, ne0)


_SCRATCH = threading.local()


def _scratch(n: int) -> np.ndarray:
    """This thread's float32 buffer of ``n`` values for dequantized input rows (reused from
    chunk to chunk instead of faulting in fresh memory each time)."""
    buf = getattr(_SCRATCH, "buf", None)
    if buf is None or buf.size < n:
        buf = _SCRATCH.buf = np.empty(max(n, CHUNK_ELEMENTS), np.float32)
    return buf[:n]


def chunks(job: TensorJob, chunk_elements: int | None = None) -> list[tuple[int, int, int]]:
    """(first row, rows, matrix) pieces of a tensor of about ``chunk_elements`` values."""
    chunk_elements = chunk_elements or CHUNK_ELEMENTS
    t = job.tensor
    ne0 = t.shape[0]
    nrows = t.n_elements // ne0
    n_mat = job.imatrix.shape[0] if job.imatrix is not None else 1
    per_mat = nrows // n_mat
    step = max(1, min(per_mat, chunk_elements // ne0))
    return [
        (r, min(step, (m + 1) * per_mat - r), m)
        for m in range(n_mat)
        for r in range(m * per_mat, (m + 1) * per_mat, step)
    ]


def _convert_rows(job: TensorJob, out: np.ndarray, row0: int, nrows: int, mat: int) -> None:
    from .. import quants

    qw = job.imatrix[mat] if job.imatrix is not None else None
    x = _rows_f32(job.tensor, row0, nrows)
    q = out[row0 : row0 + nrows]  # whole rows: contiguous, written in place
    try:
        quants.get(job.target).quantize(x, qw, q)
    except quants.QuantError as err:  # input llama.cpp's quantizer aborts on (IQ3 types)
        where = f" (rows counted from row {row0} of the tensor)" if row0 else ""
        raise GGUFError(f"{err}{where}", tensor=job.name) from None
    problem = invalid_data(job.target, q)
    if problem:
        raise GGUFError(f"quantized data validation failed: {problem}", tensor=job.name)


def _copy(job: TensorJob) -> Any:
    """A tensor written unchanged (checked first, as llama.cpp reads it)."""
    _check_input(job.tensor, job.tensor.raw)
    return job.tensor.raw


def _new_output(job: TensorJob) -> np.ndarray:
    from .. import quants

    ne0 = job.tensor.shape[0]
    nrows = job.tensor.n_elements // ne0
    return np.empty((nrows, quants.get(job.target).row_nbytes(ne0)), dtype=np.uint8)


def convert_tensor(job: TensorJob, chunk_elements: int | None = None) -> Any:
    """The output bytes of one tensor, converted on the calling thread (the input bytes
    themselves when the type does not change)."""
    if not job.convert:
        return _copy(job)
    out = _new_output(job)
    for piece in chunks(job, chunk_elements):
        _convert_rows(job, out, *piece)
    return out


def resolve_nthread(n: int) -> int:
    """``nthread <= 0`` means every CPU, as in llama-quantize."""
    return n if n > 0 else (os.cpu_count() or 1)


def _numba_threads(n: int) -> None:
    import numba

    numba.set_num_threads(max(1, min(n, numba.config.NUMBA_NUM_THREADS)))


def _threading_layer() -> str:
    """numba's threading layer (running one tiny parallel kernel first, which also pays
    numba's one-time start-up cost before the workers start)."""
    import numba

    from .. import quants

    try:
        return numba.threading_layer()
    except ValueError:  # no parallel kernel has run yet
        quants.get(GGMLType.F16).quantize(np.zeros((1, 32), dtype=np.float32))
    try:
        return numba.threading_layer()
    except ValueError:
        return "unknown"


class Pipeline:
    """Converts tensors on ``nthread`` worker threads, ahead of the writer.

    The chunks of the next tensors are queued while the writer (the calling thread) waits for
    the tensor it needs and writes it: small tensors never leave a thread idle, and disk
    writes overlap the computing. The numba kernels release the GIL; each worker runs them
    single-threaded, because numba's own parallel regions stall badly when other processes
    share the CPUs, while a pool pulling chunks keeps going.
    """

    def __init__(
        self, jobs: Sequence[TensorJob], nthread: int, lookahead_bytes: int = LOOKAHEAD_BYTES
    ) -> None:
        self.jobs = list(jobs)
        self.lookahead_bytes = lookahead_bytes
        nthread = resolve_nthread(nthread)
        if _threading_layer() == "workqueue":
            # numba's fallback layer cannot run kernels from several threads at once: one
            # worker, and numba's own threads inside the kernels
            init, args, nworkers = _numba_threads, (nthread,), 1
        else:
            init, args, nworkers = _numba_threads, (1,), nthread
        self.pool = ThreadPoolExecutor(nworkers, "quantize", initializer=init, initargs=args)
        self.pending: dict[int, tuple[Any, list[Future[Any]]]] = {}
        self.next_submit = 0
        self.in_flight = 0
        self.compiled: set[tuple[Any, bool]] = set()  # (target type, with imatrix)

    def _submit_until(self, index: int) -> None:
        while self.next_submit < len(self.jobs) and (
            self.next_submit <= index or self.in_flight < self.lookahead_bytes
        ):
            job = self.jobs[self.next_submit]
            self.next_submit += 1
            if not job.convert:
                self.pending[self.next_submit - 1] = (None, [self.pool.submit(_copy, job)])
                continue
            out = _new_output(job)
            pieces = chunks(job)
            key = (job.target, job.imatrix is not None)
            if key not in self.compiled:
                # the first row here: the format's kernels compile (or load) on this thread,
                # not in several workers at once
                _convert_rows(job, out, pieces[0][0], 1, pieces[0][2])
                self.compiled.add(key)
            futures = [self.pool.submit(_convert_rows, job, out, *p) for p in pieces]
            self.pending[self.next_submit - 1] = (out, futures)
            self.in_flight += out.nbytes

    def result(self, position: int) -> Any:
        """The output bytes of ``jobs[position]`` (waits for its chunks)."""
        self._submit_until(position)
        out, futures = self.pending.pop(position)
        for f in futures:
            f.result()
        if out is None:  # copied unchanged
            return futures[0].result()
        self.in_flight -= out.nbytes
        return out

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.pending.clear()

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
