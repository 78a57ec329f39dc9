"""Importance matrices for quantization: llama.cpp's GGUF imatrix files and the legacy ``.dat``.

A GGUF imatrix holds, for every weight matrix ``NAME`` that saw activations, two F32
tensors: ``NAME.in_sum2`` (the sum of squared activations per input column, one row per
expert) and ``NAME.counts`` (how many activations were summed, per expert), plus the keys
``imatrix.datasets``, ``imatrix.chunk_count`` and ``imatrix.chunk_size``. The weights used
for quantization are ``in_sum2 / count`` (1 where the count is 0), exactly as llama-quantize
computes them.

The legacy format is a little-endian binary file: ``int32 n_entries``, then per entry
``int32 name_len, name, int32 ncall, int32 nval, float32[nval]`` (values already divided by
the token count, multiplied by ``ncall``), then optionally ``int32 chunk_count, int32 len,
dataset``.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from ..errors import GGUFError, UsageError
from ..gguf.constants import GGUF_MAGIC, GGMLType, GGUFValueType
from ..gguf.reader import GGUFReader

KEY_DATASETS = "imatrix.datasets"
KEY_CHUNK_COUNT = "imatrix.chunk_count"
KEY_CHUNK_SIZE = "imatrix.chunk_size"
SUFFIX_SUMS = ".in_sum2"
SUFFIX_COUNTS = ".counts"


@dataclass(frozen=True)
class ImportanceMatrix:
    """Per-tensor importance weights: ``data[name]`` is float32 of ``ne[0] * n_expert`` values."""

    path: str
    data: dict[str, np.ndarray]
    datasets: tuple[str, ...] = ()
    chunk_count: int = 0
    is_legacy: bool = False
    # entries dropped by include/exclude filters
    dropped: tuple[str, ...] = field(default=())

    def filtered(
        self, include: Iterable[str] = (), exclude: Iterable[str] = ()
    ) -> ImportanceMatrix:
        """``--include-weights`` / ``--exclude-weights``: keep or drop entries whose name
        contains any of the given strings."""
        include, exclude = list(include), list(exclude)
        if include and exclude:
            raise UsageError("--include-weights and --exclude-weights cannot be used together")
        data = dict(self.data)
        if exclude:
            data = {k: v for k, v in data.items() if not any(s in k for s in exclude)}
        if include:
            data = {k: v for k, v in data.items() if any(s in k for s in include)}
        dropped = tuple(sorted(set(self.data) - set(data)))
        return ImportanceMatrix(
            self.path, data, self.datasets, self.chunk_count, self.is_legacy, dropped
        )


def load_imatrix(path: str | os.PathLike[str]) -> ImportanceMatrix:
    """Read an imatrix file (GGUF, or the legacy binary format when it is not GGUF)."""
    p = os.fspath(path)
    try:
        with open(p, "rb") as f:
            magic = f.read(4)
    except FileNotFoundError:
        raise UsageError(f"{p}: no such imatrix file") from None
    except OSError as e:
        raise UsageError(f"{p}: cannot read the imatrix file: {e.strerror or e}") from None
    im = _load_gguf(p) if magic == GGUF_MAGIC else _load_legacy(p)
    for name, v in im.data.items():
        if not np.isfinite(v).all():
            bad = v[~np.isfinite(v)][0]
            raise UsageError(f"{p}: imatrix entry {name!r} contains a non-finite value {bad}")
    return im


def _load_gguf(path: str) -> ImportanceMatrix:
    try:
        reader = GGUFReader(path)
    except GGUFError as e:
        raise UsageError(f"cannot load the imatrix: {e}") from None
    with reader:
        if not reader.tensors:
            raise UsageError(f"{path}: no data in the imatrix file")
        f = reader.fields.get(KEY_DATASETS)
        datasets: tuple[str, ...] = ()
        if f is not None and f.type == GGUFValueType.ARRAY and f.elem_type == GGUFValueType.STRING:
            datasets = tuple(f.value)
        has_metadata = all(
            k in reader.fields for k in (KEY_DATASETS, KEY_CHUNK_COUNT, KEY_CHUNK_SIZE)
        )
        if not has_metadata:
            raise UsageError(f"{path}: missing imatrix metadata (imatrix.* keys)")
        chunk_count = int(reader.get(KEY_CHUNK_COUNT, 0))

        pairs: dict[str, list] = {}
        for t in reader.tensors:
            if t.name.endswith(SUFFIX_SUMS):
                pairs.setdefault(t.name[: -len(SUFFIX_SUMS)], [None, None])[0] = t
            elif t.name.endswith(SUFFIX_COUNTS):
                pairs.setdefault(t.name[: -len(SUFFIX_COUNTS)], [None, None])[1] = t
        data: dict[str, np.ndarray] = {}
        for name in sorted(pairs):
            sums, counts = pairs[name]
            if sums is None or counts is None:
                raise UsageError(f"{path}: mismatched sums and counts for {name!r}")
            if sums.type != GGMLType.F32 or counts.type != GGMLType.F32:
                raise UsageError(f"{path}: sums and counts for {name!r} must be F32")
            s = np.array(sums.data, dtype=np.float32).reshape(-1)
            # counts are stored as floats; llama.cpp rounds them (lround) and divides in float32
            c = np.floor(np.abs(counts.data.reshape(-1).astype(np.float64)) + 0.5)
            c = np.copysign(c, counts.data.reshape(-1)).astype(np.int64)
            if c.size == 0 or s.size % c.size:
                raise UsageError(
                    f"{path}: {s.size} sums do not split into {c.size} counts ({name!r})"
                )
            s = s.reshape(c.size, -1)
            cf = c.astype(np.float32)[:, None]
            with np.errstate(divide="ignore", invalid="ignore"):
                e = np.where(cf > 0, s / np.where(cf > 0, cf, np.float32(1)), np.float32(1))
            data[name] = e.astype(np.float32).reshape(-1)
    return ImportanceMatrix(path, data, datasets, chunk_count, is_legacy=False)


def _load_legacy(path: str) -> ImportanceMatrix:
    with open(path, "rb") as f:
        buf = f.read()
    pos = 0

    def take(fmt: str, what: str) -> tuple:
        nonlocal pos
        size = struct.calcsize(fmt)
        if pos + size > len(buf):
            raise UsageError(f"{path}: truncated imatrix file while reading {what} at byte {pos}")
        out = struct.unpack_from(fmt, buf, pos)
        pos += size
        return out

    if len(buf) < 4:
        raise UsageError(f"{path}: not an imatrix file (neither GGUF nor the legacy format)")
    (n_entries,) = take("<i", "the entry count")
    if n_entries < 1:
        raise UsageError(f"{path}: no data in the imatrix file")
    data: dict[str, np.ndarray] = {}
    for i in range(n_entries):
        (n,) = take("<i", f"the name length of entry {i + 1}")
        if n < 0 or pos + n > len(buf):
            raise UsageError(f"{path}: failed reading the name of entry {i + 1}")
        name = buf[pos : pos + n].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        pos += n
        ncall, nval = take("<ii", f"the sizes of entry {i + 1}")
        if nval < 1:
            raise UsageError(f"{path}: failed reading the number of values of entry {i + 1}")
        if pos + 4 * nval > len(buf):
            raise UsageError(f"{path}: failed reading the data of entry {i + 1}")
        sums = np.frombuffer(buf, dtype="<f4", count=nval, offset=pos).astype(np.float32)
        pos += 4 * nval
        data[name] = sums / np.float32(ncall) if ncall > 0 else sums
    chunk_count, datasets = 0, ()
    if pos + 4 <= len(buf):
        (chunk_count,) = take("<i", "the chunk count")
        if pos + 4 <= len(buf):
            (n,) = take("<i", "the dataset name length")
            if n > 0 and pos + n <= len(buf):
                datasets = (
                    buf[pos : pos + n].split(b"\0", 1)[0].decode("utf-8", "surrogateescape"),
                )
    return ImportanceMatrix(path, data, datasets, chunk_count, is_legacy=True)


@dataclass(frozen=True)
class RawImatrix:
    """An imatrix file's raw statistics, as llama-imatrix loads them to combine
    (``--in-file``): ``entries[name] = (sums [n_mat, n] float32, counts [n_mat] int64)``.
    A legacy file's averages are turned back into sums and counts of ``chunk_size``-token
    chunks, as llama-imatrix does."""

    path: str
    entries: dict[str, tuple[np.ndarray, np.ndarray]]
    datasets: tuple[str, ...]
    is_legacy: bool


def load_imatrix_raw(path: str | os.PathLike[str], chunk_size: int) -> RawImatrix:
    """Read an imatrix file's sums and counts (GGUF or legacy; see :func:`load_imatrix`
    for the checks)."""
    p = os.fspath(path)
    im = load_imatrix(p)  # checks the file whole (format, sizes, finite values)
    entries: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    if im.is_legacy:
        for name, ncall, sums in _legacy_entries(p):
            n = max(ncall, 0)
            entries[name] = (
                (sums * np.float32(chunk_size))[None, :].astype(np.float32),
                np.array([n * chunk_size], np.int64),
            )
        return RawImatrix(p, entries, im.datasets, True)
    with GGUFReader(p) as reader:
        tensors = {t.name: t for t in reader.tensors}
        for name in im.data:
            s = np.array(tensors[name + SUFFIX_SUMS].data, np.float32).reshape(-1)
            c = tensors[name + SUFFIX_COUNTS].data.reshape(-1).astype(np.float64)
            c = (np.sign(c) * np.floor(np.abs(c) + 0.5)).astype(np.int64)  # lround
            entries[name] = (s.reshape(c.size, -1), c)
    return RawImatrix(p, entries, im.datasets, False)


def _legacy_entries(path: str) -> Iterable[tuple[str, int, np.ndarray]]:
    """(name, ncall, stored values) of a legacy file already checked by
    :func:`_load_legacy`."""
    with open(path, "rb") as f:
        buf = f.read()
    (n_entries,) = struct.unpack_from("<i", buf, 0)
    pos = 4
    for _ in range(n_entries):
        (n,) = struct.unpack_from("<i", buf, pos)
        name = buf[pos + 4 : pos + 4 + n].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        pos += 4 + n
        ncall, nval = struct.unpack_from("<ii", buf, pos)
        pos += 8
        yield name, ncall, np.frombuffer(buf, "<f4", nval, pos).astype(np.float32)
        pos += 4 * nval


def save_imatrix(
    path: str | os.PathLike[str],
    entries: dict[str, tuple[np.ndarray, np.ndarray]],
    datasets: Iterable[str],
    chunk_count: int,
    chunk_size: int,
) -> None:
    """Write a GGUF imatrix as llama-imatrix writes it (atomically): ``general.type``,
    the ``imatrix.*`` keys, then per matrix in name order ``NAME.in_sum2`` (F32, ne =
    [n, n_mat]) and ``NAME.counts`` (F32, ne = [1, n_mat]). Entries whose counts are all
    zero are left out."""
    from ..gguf.writer import GGUFWriter

    w = GGUFWriter(path)
    w.add("general.type", "imatrix")
    w.add(KEY_DATASETS, list(datasets), GGUFValueType.ARRAY, GGUFValueType.STRING)
    w.add(KEY_CHUNK_COUNT, int(chunk_count), GGUFValueType.UINT32)
    w.add(KEY_CHUNK_SIZE, int(chunk_size), GGUFValueType.UINT32)
    for name in sorted(entries):
        sums, counts = entries[name]
        sums = np.ascontiguousarray(sums, np.float32).reshape(len(counts), -1)
        if not np.any(counts):
            continue
        n_mat = len(counts)
        w.add_tensor(name + SUFFIX_SUMS, GGMLType.F32, (sums.shape[1], n_mat), sums)
        cf = np.asarray(counts, np.float32).reshape(n_mat, 1)
        w.add_tensor(name + SUFFIX_COUNTS, GGMLType.F32, (1, n_mat), cf)
    w.write()


def save_imatrix_legacy(
    path: str | os.PathLike[str],
    entries: dict[str, tuple[np.ndarray, np.ndarray]],
    dataset: str,
    chunk_count: int,
    chunk_size: int,
) -> None:
    """Write the legacy ``.dat`` format as llama-imatrix's ``--output-format dat``
    (atomically): per entry in name order ``ncall`` = the largest count in chunks (rounded
    up) and ``sums / count * ncall`` (1 where the count is 0); then the chunk count and the
    dataset."""
    from ..fileio import atomic_write

    chunk_size = max(1, int(chunk_size))
    out = [b""]
    names = [n for n in sorted(entries) if np.any(entries[n][1])]
    out.append(struct.pack("<i", len(names)))
    for name in names:
        sums, counts = entries[name]
        counts = np.asarray(counts, np.int64)
        sums = np.asarray(sums, np.float32).reshape(len(counts), -1)
        raw = name.encode("utf-8", "surrogateescape")
        ncall = int((counts.max() + chunk_size - 1) // chunk_size)
        out.append(struct.pack("<i", len(raw)) + raw + struct.pack("<ii", ncall, sums.size))
        cf = counts.astype(np.float32)[:, None]
        value = np.where(cf == 0, np.float32(1), sums)
        cf = np.where(cf == 0, np.float32(1), cf)
        out.append(((value / cf) * np.float32(ncall)).astype("<f4").tobytes())
    ds = dataset.encode("utf-8", "surrogateescape")
    out.append(struct.pack("<ii", int(chunk_count), len(ds)) + ds)
    with atomic_write(path) as f:
        f.write(b"".join(out))
