"""Model weights in the form the kernels read: matrices repacked into one buffer, vectors in
another, and the reading of tensor bytes from the GGUF shards.

Tensor bytes are read in file-order chunks of about 4 MiB, through a memory map (default)
or ``read()`` (``use_mmap=False``); each chunk is repacked in one parallel call and its file
pages are then dropped from the process (``MADV_DONTNEED``), so loading never holds the file
and the repacked copy at once. The
repacked buffer is the only copy of the weights the engine keeps; ``mlock`` pins it.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
from dataclasses import dataclass, replace
from pathlib import Path

import numba
import numpy as np

from .._startup import libc_madvise, take_memory
from ..errors import ModelError
from ..gguf import GGMLType, GGUFModelFile, TensorInfo
from ..gguf.constants import GGML_BLOCK_SIZES
from ..ops import formats, traits

_ALIGN = 64
_PAGE = mmap.PAGESIZE
# Linux 5.14+: fault a whole range in with one call instead of one page fault per 4 KiB
_MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)
_CHUNK = 4 << 20  # bytes of file repacked per parallel call (bounds the mapped pages held)
# The repacked weights live in transparent huge pages: decode reads every weight once a
# token and is ~11% faster than from 4 KiB pages (SmolLM2, 2 threads: 307 vs 276 t/s; fewer
# TLB misses). Getting ~50 fresh huge pages at once can wait for compaction or, in a VM that
# hands free memory back to its host, for the host to back it again: here 96 MiB took
# 12-185 ms that way and the whole VM stalled with it (`llamacpy run -n 1`: 0.40-0.42 s, a
# quarter of runs 0.61 s), against 22-30 ms in 4 KiB pages (0.40-0.44 s every run). So the
# console command, whose start-up is the measure, reserves 4 KiB pages (``_startup``), and
# a library load (the server, benchmarks, API users) takes huge pages up front. Either way
# the filled buffer is marked for huge pages, and khugepaged collapses what is not yet
# (~16 MiB per 10 s by default).
_MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", 14)


def _advise_array(arr: np.ndarray, advice: int) -> None:
    """``madvise`` the whole pages inside a (large) array's memory; failures ignored (older
    kernels and other platforms: the memory behaves as by default)."""
    fn = libc_madvise()
    if fn and arr.nbytes >= 2 * _PAGE:
        start = -arr.ctypes.data % _PAGE + arr.ctypes.data
        end = (arr.ctypes.data + arr.nbytes) // _PAGE * _PAGE
        fn(start, end - start, advice)


class TensorSource:
    """Reads the bytes of tensors of an opened model file, from its shards."""

    def __init__(self, model: GGUFModelFile, use_mmap: bool = True, background: bool = False):
        self.model = model
        self.use_mmap = use_mmap
        self.background = background  # WeightStore.build's default
        self._files: dict[int, object] = {}
        self._maps: dict[int, mmap.mmap] = {}
        self._views: dict[int, np.ndarray] = {}  # whole-map views: their address for madvise

    def _advise(self, shard: int, start: int, length: int, advice: int) -> None:
        """``madvise`` a page-aligned range of a mapped shard, through libc when possible
        (ctypes drops the GIL, so populating pages does not stall the other threads)."""
        fn = libc_madvise()
        if fn:
            view, base = self.whole(shard)
            length = min(length, view.size - start)
            if length > 0:
                fn(base + start, length, advice)  # failures: pages fault in lazily
            return
        try:
            self._maps[shard].madvise(advice, start, length)
        except (OSError, ValueError, AttributeError):
            pass  # older kernels and platforms: pages fault in one by one

    def _shard(self, name: str) -> int:
        return self.model.shard_of(name)

    def raw(self, info: TensorInfo) -> np.ndarray:
        """The tensor's bytes (uint8, read-only view of the map or a fresh array)."""
        return self.span(self._shard(info.name), info.data_offset, info.nbytes)

    def span(self, shard: int, offset: int, nbytes: int) -> np.ndarray:
        """Bytes ``offset .. offset+nbytes`` of a shard (a view of the map, its pages mapped
        in one call, or a fresh array read from the file)."""
        path = self.model.paths[shard]
        if self.use_mmap:
            mm = self._map(shard)
            start = offset - offset % _PAGE
            # the caller reads all of it right away: fault it in with one call
            self._advise(shard, start, offset + nbytes - start, _MADV_POPULATE_READ)
            return np.frombuffer(mm, np.uint8, count=nbytes, offset=offset)
        f = self._files.get(shard)
        if f is None:
            f = self._files[shard] = open(path, "rb")  # noqa: SIM115 (closed in close())
        buf = np.empty(nbytes, np.uint8)
        f.seek(offset)
        if f.readinto(memoryview(buf)) != nbytes:
            raise ModelError(f"{path}: truncated data at byte {offset} ({nbytes} bytes)")
        return buf

    def _map(self, shard: int) -> mmap.mmap:
        mm = self._maps.get(shard)
        if mm is None:
            with open(self.model.paths[shard], "rb") as f:
                mm = self._maps[shard] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        return mm

    def whole(self, shard: int) -> tuple[np.ndarray, int]:
        """A mapped shard as one read-only array (no page faulted in yet) and its address."""
        view = self._views.get(shard)
        if view is None:
            view = self._views[shard] = np.frombuffer(self._map(shard), np.uint8)
        return view, view.ctypes.data

    def release(self, info: TensorInfo) -> None:
        """Drop the tensor's file pages from this process (they stay in the page cache)."""
        self.release_span(self._shard(info.name), info.data_offset, info.nbytes)

    def release_span(self, shard: int, offset: int, nbytes: int) -> None:
        if shard not in self._maps or not hasattr(mmap, "MADV_DONTNEED"):
            return
        start = offset - offset % _PAGE
        self._advise(shard, start, offset + nbytes - start, mmap.MADV_DONTNEED)

    def close(self) -> None:
        self._views.clear()
        for f in self._files.values():
            f.close()
        for mm in self._maps.values():
            try:
                mm.close()
            except BufferError:  # a view is still alive; it unmaps when freed
                pass
        self._files.clear()
        self._maps.clear()


@dataclass(frozen=True)
class Matrix:
    """A 2-D weight in the store: ``nrows`` outputs x ``ncols`` inputs (GGUF ``ne[1]``,
    ``ne[0]``), row ``desc`` of :attr:`WeightStore.desc`."""

    index: int
    name: str
    type: GGMLType
    nrows: int
    ncols: int

    @property
    def n_groups(self) -> int:
        return formats.n_groups(self.nrows)


@dataclass(frozen=True)
class Experts:
    """A 3-D weight ``[n_expert, nrows, ncols]`` (GGUF ``ne[2], ne[1], ne[0]``): one
    :class:`Matrix` per expert, at consecutive store indices from ``index``, so expert ``e``
    is matrix ``index + e`` (each repacked on its own, like any 2-D weight)."""

    index: int
    name: str
    type: GGMLType
    n_expert: int
    nrows: int
    ncols: int


@dataclass(frozen=True)
class Vector:
    """A 1-D float32 weight at ``offset`` in :attr:`WeightStore.fbuf`."""

    offset: int
    name: str
    size: int


class WeightStore:
    """Collects matrices and vectors, then :meth:`build` repacks them into two buffers.

    ``buf`` (uint8) holds every matrix repacked (see :mod:`llamacpy.ops.formats`), ``desc``
    (int64 ``[n, 4]``: type, byte offset, nrows, ncols) describes them, ``fbuf`` (float32)
    holds the vectors.
    """

    def __init__(self) -> None:
        self.matrices: list[tuple[Matrix, TensorInfo]] = []
        self.vectors: list[tuple[Vector, TensorInfo]] = []
        self._fsize = 0
        self._buf = np.zeros(0, np.uint8)
        self._desc = np.zeros((0, 4), np.int64)
        self._fbuf = np.zeros(0, np.float32)
        self._job: threading.Thread | None = None
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._after: list = []  # called once the build is over
        self._ctl = np.zeros(4, np.int64)  # read by the compiled copy, see formats

    # the buffers, complete: reading one waits for a build still running in the background
    @property
    def buf(self) -> np.ndarray:
        self.wait()
        return self._buf

    @property
    def desc(self) -> np.ndarray:
        self.wait()
        return self._desc

    @property
    def fbuf(self) -> np.ndarray:
        self.wait()
        return self._fbuf

    @property
    def pending(self) -> bool:
        """True while a background build is still filling the buffers."""
        return self._job is not None

    def arrays_unchecked(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(buf, desc, fbuf)`` without waiting: for typing a kernel call ahead of time."""
        return self._buf, self._desc, self._fbuf

    def wait(self) -> None:
        """Wait for a background build; raise what it raised."""
        job = self._job
        if job is not None:
            self._ctl[0] = 1  # the copy may use every thread from its next chunk on
            job.join()
            self._job = None
        if self._error is not None:
            raise ModelError(f"loading the weights failed: {self._error}") from self._error

    def after_build(self, fn) -> None:
        """Call ``fn()`` once the build is over (now, when none is running)."""
        with self._lock:
            if self._job is not None and self._job.is_alive():
                self._after.append(fn)
                return
        fn()

    def matrix(self, info: TensorInfo) -> Matrix:
        if len(info.shape) != 2:
            raise ModelError(f"tensor {info.name!r} must be 2-D, has shape {info.shape}")
        traits.get(info.type, tensor=info.name)
        m = Matrix(len(self.matrices), info.name, GGMLType(info.type), info.shape[1], info.shape[0])
        self.matrices.append((m, info))
        return m

    def experts(self, info: TensorInfo, r0: int = 0, n: int = 0) -> Experts:
        """A 3-D tensor as one matrix per expert (the rows of expert ``e`` are rows
        ``e * nrows ..`` of the tensor seen as 2-D: ggml rows are contiguous); with ``n``,
        rows ``r0 .. r0+n`` of each expert (a part of fused experts)."""
        if len(info.shape) != 3:
            raise ModelError(f"tensor {info.name!r} must be 3-D, has shape {info.shape}")
        ncols, nrows, n_expert = info.shape
        n = n or nrows
        flat = replace(info, shape=(ncols, nrows * n_expert))
        first = len(self.matrices)
        for e in range(n_expert):
            self.matrix(row_slice(flat, e * nrows + r0, n))
        return Experts(first, info.name, GGMLType(info.type), n_expert, n, ncols)

    def vector(self, info: TensorInfo) -> Vector:
        """A 1-D F32 tensor, or a 2-D one as its rows one after another (experts' biases)."""
        if info.type != GGMLType.F32 or len(info.shape) > 2:
            raise ModelError(f"tensor {info.name!r} must be a 1-D or 2-D F32 tensor")
        size = int(np.prod(info.shape))
        v = Vector(self._fsize, info.name, size)
        self._fsize += -(-size // 16) * 16
        self.vectors.append((v, info))
        return v

    @property
    def types(self) -> set[GGMLType]:
        return {m.type for m, _ in self.matrices}

    def build(self, source: TensorSource, background: bool | None = None) -> None:
        """Read, repack and place every queued tensor: file-order chunks of about
        :data:`_CHUNK` bytes, each repacked in one parallel call, then its pages dropped.

        Every tensor is checked first; with ``background`` the copying then runs in a
        thread (the kernels release the GIL) while the caller goes on with what does not
        need the weights (the tokenizer, the other kernels); reading :attr:`buf`,
        :attr:`desc` or :attr:`fbuf` waits for it."""
        offsets, total = [], 0
        for m, info in self.matrices:
            formats.check_tensor(info.nbytes, m.type, m.nrows, m.ncols, info.name)
            offsets.append(total)
            size = formats.repacked_nbytes(m.type, m.nrows, m.ncols)
            total += size + (-size % _ALIGN)
        for v, info in self.vectors:
            if info.nbytes < 4 * v.size:
                raise ModelError(
                    f"tensor {info.name!r} has {info.nbytes} bytes, {4 * v.size} needed"
                )
        size = max(total, _ALIGN)
        reserved = take_memory(size)  # faulted in early by the console command
        if reserved is not None:
            self._buf = np.frombuffer(reserved, np.uint8, count=size)
        else:
            self._buf = np.empty(size, np.uint8)
            _advise_array(self._buf, _MADV_HUGEPAGE)
        self._desc = np.zeros((len(self.matrices), 4), np.int64)
        self._fbuf = np.zeros(max(self._fsize, 16), np.float32)
        todo = sorted(
            ((source.model.shard_of(info.name), info.data_offset, m, info, off)
             for (m, info), off in zip(self.matrices, offsets)),
            key=lambda x: (x[0], x[1]),
        )  # fmt: skip
        if not (source.background if background is None else background):
            self._ctl[0] = 1  # every thread from the start
            self._copy(source, todo)
            _advise_array(self._buf, _MADV_HUGEPAGE)  # for khugepaged, see the note on top
            return
        self._ctl[0] = 0  # one thread until someone waits
        self._error = None
        self._job = threading.Thread(
            target=self._background,
            args=(source, todo, numba.get_num_threads()),
            name="llamacpy-weights",
            daemon=True,
        )
        self._job.start()

    def _background(self, source: TensorSource, todo: list, n_threads: int) -> None:
        try:
            self._copy(source, todo, n_threads)
            _advise_array(self._buf, _MADV_HUGEPAGE)  # for khugepaged, see the note on top
        except BaseException as e:  # re-raised by wait()
            self._error = e
        finally:
            with self._lock:
                after, self._after = self._after, []
            for fn in after:
                fn()

    def _copy(self, source: TensorSource, todo: list, n_threads: int = 0) -> None:
        """The copy, in file-order chunks of about :data:`_CHUNK` bytes. A mapped file is
        repacked by one compiled call per shard (it faults each chunk's pages in and drops
        them again itself, without the GIL); otherwise chunk by chunk from Python. In the
        background (``n_threads`` > 0) it runs on one thread while the caller works (the
        caller has the other cores) and on ``n_threads`` from the next chunk once the caller
        waits for it (numba's thread count is per calling thread)."""
        chunks, i = [], 0
        while i < len(todo):
            shard, start = todo[i][0], todo[i][1]
            j, end = i, start
            while j < len(todo) and todo[j][0] == shard and (j == i or end - start < _CHUNK):
                end = max(end, todo[j][1] + todo[j][3].nbytes)
                j += 1
            chunks.append((shard, start, end, i, j))
            i = j
        ctl = self._ctl
        ctl[1:] = (_MADV_POPULATE_READ, mmap.MADV_DONTNEED, n_threads or numba.get_num_threads())
        if n_threads and not ctl[0]:
            numba.set_num_threads(1)
        if source.use_mmap and libc_madvise():
            for shard in sorted({c[0] for c in chunks}):
                mine = [c for c in chunks if c[0] == shard]
                raw, base = source.whole(shard)
                i0 = mine[0][3]
                plan = np.array(
                    [(st - st % _PAGE, en - (st - st % _PAGE), i - i0, j - i0)
                     for _, st, en, i, j in mine],
                    np.int64,
                )  # fmt: skip
                items = [(info.data_offset, m.type, m.nrows, m.ncols, off)
                         for _, _, m, info, off in todo[i0 : mine[-1][4]]]  # fmt: skip
                formats.repack_mapped(raw, plan, items, self._buf, libc_madvise(), base, ctl)
                del raw
        else:
            for shard, start, end, i, j in chunks:
                if n_threads and ctl[0] and numba.get_num_threads() != n_threads:
                    numba.set_num_threads(n_threads)
                raw = source.span(shard, start, end - start)
                items = [(info.data_offset - start, m.type, m.nrows, m.ncols, off)
                         for _, _, m, info, off in todo[i:j]]  # fmt: skip
                formats.repack_many(raw, items, self._buf)
                del raw
                source.release_span(shard, start, end - start)
        for _, _, m, _, off in todo:
            self._desc[m.index] = (int(m.type), off, m.nrows, m.ncols)
        for v, info in self.vectors:
            self._fbuf[v.offset : v.offset + v.size] = source.raw(info).view(np.float32)
            source.release(info)  # a large page-cache folio maps whole: drop it again

    @property
    def nbytes(self) -> int:
        return self.buf.nbytes + self.fbuf.nbytes

    def mlock(self) -> None:
        """Pin the weights in RAM (``mlock``); raises ``OSError`` when the limit refuses."""
        libc = ctypes.CDLL(None, use_errno=True)
        for a in (self.buf, self.fbuf):
            if libc.mlock(ctypes.c_void_p(a.ctypes.data), ctypes.c_size_t(a.nbytes)) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"mlock of {a.nbytes} bytes failed: {os.strerror(err)}")


def model_file(path: str | os.PathLike[str]) -> GGUFModelFile:
    """Open a model (first shard of a split model, or a single file) for loading."""
    return GGUFModelFile(Path(path))


def row_slice(info: TensorInfo, r0: int, n: int) -> TensorInfo:
    """Rows ``r0 .. r0+n`` of a 2-D tensor (ggml rows are contiguous, whole blocks)."""
    ncols = info.shape[0]
    qk, size = GGML_BLOCK_SIZES[info.type]
    if ncols % qk:
        raise ModelError(f"tensor {info.name!r}: rows of {ncols} are not whole {qk}-blocks")
    rb = ncols // qk * size
    return replace(
        info,
        shape=(ncols, n),
        offset=info.offset + r0 * rb,
        data_offset=info.data_offset + r0 * rb,
        nbytes=n * rb,
        n_elements=n * ncols,
    )
