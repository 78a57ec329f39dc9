"""Split models: llama.cpp's ``gguf-split`` convention, and opening a model from any shard set.

A split model is a set of GGUF files named ``PREFIX-00001-of-00003.gguf``,
``PREFIX-00002-of-00003.gguf``, ... Every shard carries three keys:

* ``split.no`` (u16): the shard's index, 0-based;
* ``split.count`` (u16): the number of shards;
* ``split.tensors.count`` (i32): the number of tensors in the whole model.

The first shard holds all of the model's metadata (with the split keys appended, or replaced
in place if the original already had them); the others hold only the split keys (plus
``general.alignment`` when the original uses a non-default alignment) and their tensors.
Tensors keep the original order across shards.

:func:`merge_gguf` drops the ``split.*`` keys again, so splitting a file that has no split keys
and merging the shards gives back the original file byte for byte (for files laid out the way
ggml writes them: tensors packed in order, each padded to the alignment). llama.cpp's merge
instead keeps the keys with ``split.count = 0``; a file that carries such stale keys comes back
from split + merge without them.

:class:`GGUFModelFile` opens a model from its first (or only) file, finding and validating
the other shards the way llama.cpp's model loader does.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import GGUFError, UsageError
from .constants import (
    KEY_ALIGNMENT,
    KEY_SPLIT_COUNT,
    KEY_SPLIT_NO,
    KEY_SPLIT_TENSORS_COUNT,
    GGUFValueType,
)
from .reader import Field, FieldsAndTensors, GGUFReader, TensorInfo
from .writer import GGUFWriter

SPLIT_KEYS = (KEY_SPLIT_NO, KEY_SPLIT_COUNT, KEY_SPLIT_TENSORS_COUNT)
DEFAULT_MAX_TENSORS = 128
MAX_SHARDS = 2**16 - 1  # split.count is a u16
_INT_TYPES = {
    GGUFValueType.UINT8,
    GGUFValueType.INT8,
    GGUFValueType.UINT16,
    GGUFValueType.INT16,
    GGUFValueType.UINT32,
    GGUFValueType.INT32,
    GGUFValueType.UINT64,
    GGUFValueType.INT64,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


# --------------------------------------------------------------------------- file names
def split_path(prefix: str | os.PathLike[str], split_no: int, split_count: int) -> Path:
    """The file name of shard ``split_no`` (0-based): ``PREFIX-%05d-of-%05d.gguf``."""
    return Path(f"{os.fspath(prefix)}-{split_no + 1:05d}-of-{split_count:05d}.gguf")


def split_prefix(path: str | os.PathLike[str], split_no: int, split_count: int) -> str | None:
    """The prefix of a shard's file name, or None if the name does not match its index/count."""
    s = os.fspath(path)
    postfix = f"-{split_no + 1:05d}-of-{split_count:05d}.gguf"
    if len(s) <= len(postfix) or not s.endswith(postfix):
        return None
    return s[: -len(postfix)]


def parse_size(text: str) -> int:
    """A size like ``500M``, ``2G``, ``1.5G``, ``64K`` or ``12345`` (bytes) in bytes.

    Units are decimal as in llama.cpp's ``gguf-split`` (``M`` = 1000*1000 bytes); a trailing
    ``B`` or ``iB`` is accepted and ignored.
    """
    m = _SIZE_RE.match(text)
    if not m:
        raise UsageError(
            f"invalid size {text!r}: expected a number with an optional unit K, M, G or T "
            "(e.g. 500M, 2G)"
        )
    n = int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])
    if n <= 0:
        raise UsageError(f"invalid size {text!r}: must be positive")
    return n


def _split_int(f: Field | None, path: str, key: str) -> int | None:
    if f is None:
        return None
    if f.type not in _INT_TYPES:
        raise GGUFError(f"must be an integer, not {f.type.name}", path=path, key=key)
    return int(f.value)


def _split_info(reader: GGUFReader) -> tuple[int | None, int | None, int | None]:
    """(split.no, split.count, split.tensors.count) of one file; None where a key is absent."""
    no, count, n_tensors = (_split_int(reader.fields.get(k), reader.path, k) for k in SPLIT_KEYS)
    return no, count, n_tensors


def _is_split(count: int | None) -> bool:
    return count is not None and count >= 1


def _shard_paths_of(reader: GGUFReader) -> list[Path]:
    no, count, _ = _split_info(reader)
    if not _is_split(count):
        return [Path(reader.path)]
    assert count is not None
    no = 0 if no is None else no
    if count == 1 and no == 0:
        return [Path(reader.path)]
    if no != 0:
        prefix = split_prefix(reader.path, no, count)
        first = f" ({split_path(prefix, 0, count)})" if prefix is not None else ""
        raise GGUFError(
            f"this is shard {no + 1} of {count} of a split model; open the first shard{first}",
            path=reader.path,
        )
    prefix = split_prefix(reader.path, 0, count)
    if prefix is None:
        raise GGUFError(
            f"this is the first of {count} shards of a split model, but its file name does not "
            f"end in '-00001-of-{count:05d}.gguf', so the other shards cannot be found",
            path=reader.path,
        )
    return [split_path(prefix, i, count) for i in range(count)]


def shard_paths(first_shard: str | os.PathLike[str]) -> list[Path]:
    """All files of the model whose first (or only) file is ``first_shard``.

    An unsplit model gives ``[first_shard]``. The paths are derived from the first shard's
    ``split.count`` and its name; whether the other files exist is not checked here
    (:class:`GGUFModelFile` does that).
    """
    with GGUFReader(first_shard) as r:
        return _shard_paths_of(r)


# --------------------------------------------------------------------------- opening models
class GGUFModelFile(FieldsAndTensors):
    """A model opened from its GGUF file, or from the first shard of a split model.

    * ``fields``: the model's metadata, in file order. For a split model these are the first
      shard's fields *without* the ``split.*`` keys, i.e. the metadata of the merged model;
      ``readers[0].fields`` has the first shard's fields as they are on disk. An unsplit file is
      shown as is (including stale split keys with ``split.count = 0``).
    * ``tensors``: every tensor of every shard, in order; ``tensor(name)`` finds one anywhere.
    * ``readers`` / ``paths``: one per shard.

    Each shard is memory-mapped; nothing is loaded. ``any_shard=True`` opens a shard other than
    the first on its own instead of raising (for inspecting single files).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        use_mmap: bool = True,
        any_shard: bool = False,
    ) -> None:
        self.path = str(path)
        self.readers: list[GGUFReader] = []
        first = GGUFReader(path, use_mmap=use_mmap)
        self.readers.append(first)
        try:
            self._open(first, use_mmap, any_shard)
        except BaseException:
            self.close()
            raise

    def _open(self, first: GGUFReader, use_mmap: bool, any_shard: bool) -> None:
        no, count, n_total = _split_info(first)
        self.is_split = _is_split(count) and not (any_shard and (no or 0) != 0)
        self.split_count = count if self.is_split else 1
        if not self.is_split:
            self.paths = [Path(first.path)]
            self.fields = dict(first.fields)
        else:
            if count is not None and count > 1 and no is None:
                raise GGUFError(
                    f"{KEY_SPLIT_COUNT} is {count} but {KEY_SPLIT_NO} is missing", path=first.path
                )
            self.paths = _shard_paths_of(first)
            self.fields = {k: f for k, f in first.fields.items() if k not in SPLIT_KEYS}
            for i, p in enumerate(self.paths[1:], start=1):
                if not p.is_file():
                    raise GGUFError(
                        f"split model is missing shard {i + 1} of {count}: {p} "
                        "(all shards must be in the same directory)",
                        path=first.path,
                    )
                r = GGUFReader(p, use_mmap=use_mmap)
                self.readers.append(r)
                r_no, r_count, _ = _split_info(r)
                if r_no != i or r_count != count:
                    raise GGUFError(
                        f"expected shard {i + 1} of {count}, but the file says it is "
                        f"{KEY_SPLIT_NO}={r_no}, {KEY_SPLIT_COUNT}={r_count}",
                        path=str(p),
                    )
        self.tensors: list[TensorInfo] = []
        self._tensor_index: dict[str, TensorInfo] = {}
        self._shard_no: dict[str, int] = {}
        for i, r in enumerate(self.readers):
            for t in r.tensors:
                if t.name in self._shard_no:
                    other = self.paths[self._shard_no[t.name]]
                    raise GGUFError(
                        f"duplicate tensor: it is also in {other}", path=r.path, tensor=t.name
                    )
                self._tensor_index[t.name] = t
                self._shard_no[t.name] = i
                self.tensors.append(t)
        if self.is_split and n_total is not None and n_total != len(self.tensors):
            raise GGUFError(
                f"corrupted split model: {KEY_SPLIT_TENSORS_COUNT} says {n_total} tensors but "
                f"the {len(self.readers)} shards hold {len(self.tensors)}",
                path=first.path,
            )

    # ----------------------------------------------------------------- public API
    @property
    def version(self) -> int:
        return self.readers[0].version

    @property
    def alignment(self) -> int:
        return self.readers[0].alignment

    def shard_of(self, name: str) -> int:
        """Index of the shard that holds tensor ``name``."""
        self.tensor(name)
        return self._shard_no[name]

    def close(self) -> None:
        for r in self.readers:
            r.close()


# --------------------------------------------------------------------------- split
@dataclass
class ShardPlan:
    """One output shard: its file, its tensors and its exact size in bytes."""

    path: Path
    tensors: list[TensorInfo] = field(default_factory=list)
    size: int = 0


def _padded(n: int, align: int) -> int:
    return n + (-n % align)


def _tensor_info_nbytes(t: TensorInfo) -> int:
    return 8 + len(t.name.encode("utf-8", errors="surrogateescape")) + 4 + 8 * len(t.shape) + 4 + 8


def _shard_writer(
    model: GGUFModelFile, path: Path, i: int, count: int, n_tensors: int
) -> GGUFWriter:
    w = GGUFWriter(path, version=model.version)
    if i == 0:
        for f in model.fields.values():
            w.add_field(f)
    elif KEY_ALIGNMENT in model.fields:
        w.add_field(model.fields[KEY_ALIGNMENT])
    # replacing a key keeps its position (dict order); new keys are appended
    w.add(KEY_SPLIT_NO, i, GGUFValueType.UINT16)
    w.add(KEY_SPLIT_COUNT, count, GGUFValueType.UINT16)
    w.add(KEY_SPLIT_TENSORS_COUNT, n_tensors, GGUFValueType.INT32)
    return w


def _assign_tensors(
    model: GGUFModelFile,
    max_tensors: int | None,
    max_size: int | None,
    no_tensor_first_split: bool,
) -> list[list[TensorInfo]]:
    align = model.alignment
    groups: list[list[TensorInfo]] = [[]]
    if no_tensor_first_split:
        groups.append([])
    if max_size is None:
        n = max_tensors or DEFAULT_MAX_TENSORS
        for i, t in enumerate(model.tensors):
            if i > 0 and i % n == 0:
                groups.append([])
            groups[-1].append(t)
        return groups
    # by size: the whole shard file (header + padded data) must fit; the header of a shard
    # grows with every tensor info, and the first shard also holds all metadata
    kv0 = len(_shard_writer(model, Path("x"), 0, 1, 0).header_bytes())
    kvn = len(_shard_writer(model, Path("x"), 1, 2, 0).header_bytes())
    kv = kv0 if len(groups) == 1 else kvn
    infos = data = 0
    for t in model.tensors:
        info, nbytes = _tensor_info_nbytes(t), _padded(t.nbytes, align)
        size = _padded(kv + infos + info, align) + data + nbytes
        if groups[-1] and size > max_size:
            groups.append([])
            kv, infos, data = kvn, 0, 0
        groups[-1].append(t)
        infos += info
        data += nbytes
    return groups


def plan_split(
    model: GGUFModelFile,
    out_prefix: str | os.PathLike[str],
    *,
    max_tensors: int | None = None,
    max_size: int | None = None,
    no_tensor_first_split: bool = False,
) -> list[ShardPlan]:
    """Decide which tensors go to which shard (nothing is written).

    By tensor count (the default, 128 per shard) this matches llama.cpp's ``gguf-split``.
    By size, unlike llama.cpp (which counts tensor data only), the limit bounds the whole
    shard file, header included; a tensor larger than the limit gets a shard of its own.
    """
    if max_tensors is not None and max_size is not None:
        raise UsageError("give either a maximum tensor count or a maximum size, not both")
    if max_tensors is not None and max_tensors < 1:
        raise UsageError(f"the maximum number of tensors per shard must be >= 1, not {max_tensors}")
    if max_size is not None and max_size < 1:
        raise UsageError(f"the maximum shard size must be positive, not {max_size}")
    groups = _assign_tensors(model, max_tensors, max_size, no_tensor_first_split)
    count = len(groups)
    if count > MAX_SHARDS:
        raise UsageError(f"the split would need {count} shards; at most {MAX_SHARDS} are possible")
    n_tensors = len(model.tensors)
    if n_tensors > 2**31 - 1:
        raise GGUFError("too many tensors for split.tensors.count (i32)", path=model.path)
    plans = []
    for i, tensors in enumerate(groups):
        p = split_path(out_prefix, i, count)
        w = _shard_writer(model, p, i, count, n_tensors)
        for t in tensors:
            w.add_tensor_info(t)
        size = len(w.header_bytes()) + sum(_padded(t.nbytes, w.alignment) for t in tensors)
        plans.append(ShardPlan(p, tensors, size))
    return plans


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def split_gguf(
    path: str | os.PathLike[str],
    out_prefix: str | os.PathLike[str],
    max_tensors: int | None = DEFAULT_MAX_TENSORS,
    max_size: int | None = None,
    no_tensor_first_split: bool = False,
    dry_run: bool = False,
    *,
    progress: Callable[[str, int], None] | None = None,
) -> list[Path]:
    """Split a model into ``OUT_PREFIX-0000i-of-0000n.gguf`` shards; return their paths.

    ``max_size`` (bytes; see :func:`parse_size`) selects splitting by size and overrides
    ``max_tensors``. The input may itself be a split model (given by its first shard): it is
    re-split. All shards are written to temporary files first and renamed into place only
    once all of them are complete, so a failure leaves no shard behind. ``dry_run`` writes
    nothing and returns the paths that would be written (see :func:`plan_split` for sizes).
    """
    if max_size is not None:
        max_tensors = None
    with GGUFModelFile(path) as model:
        plans = plan_split(
            model,
            out_prefix,
            max_tensors=max_tensors,
            max_size=max_size,
            no_tensor_first_split=no_tensor_first_split,
        )
        outs = [p.path for p in plans]
        for o in outs:
            for src in model.paths:
                if _same_file(o, src):
                    raise UsageError(f"output shard {o} would overwrite the input file {src}")
        if dry_run:
            return outs
        for o in outs:
            if not o.parent.is_dir():
                raise UsageError(f"output directory {o.parent} does not exist")
        n_tensors = len(model.tensors)
        writers = []
        for i, plan in enumerate(plans):
            w = _shard_writer(model, plan.path, i, len(plans), n_tensors)
            for t in plan.tensors:
                w.add_tensor_info(t)
            writers.append(w)
        write_shards(writers, outs, progress)
    return outs


def write_shards(
    writers: list[GGUFWriter], outs: list[Path], progress: Callable[[str, int], None] | None
) -> None:
    """Write every writer to a staging file beside its output, then rename all into place
    (only when all are written: on any error no output is left behind)."""
    staged: list[Path] = []
    placed: list[tuple[Path, int]] = []
    try:
        for w, out in zip(writers, outs):
            fd, tmp = tempfile.mkstemp(
                prefix=f".{out.name}.", suffix=".part", dir=out.parent if str(out.parent) else "."
            )
            os.close(fd)
            staged.append(Path(tmp))
            w.path = tmp  # the writer itself writes atomically onto the staging name
            w.write(progress)
        for tmp, out in zip(staged, outs):
            ino = os.stat(tmp).st_ino
            os.replace(tmp, out)
            placed.append((out, ino))
    except BaseException:
        for tmp in staged:
            with contextlib.suppress(OSError):
                tmp.unlink()
        for out, ino in placed:  # only remove files that are ours (same inode)
            with contextlib.suppress(OSError):
                if os.stat(out).st_ino == ino:
                    out.unlink()
        raise


# --------------------------------------------------------------------------- merge
def merge_gguf(first_shard: str | os.PathLike[str], out_path: str | os.PathLike[str]) -> Path:
    """Merge a split model into one file (written atomically); return its path.

    The ``split.*`` keys are dropped and the first shard's other keys kept in order, so a
    split of a file without split keys merges back to exactly the original bytes.
    """
    out = Path(out_path)
    with GGUFModelFile(first_shard) as model:
        if not model.is_split:
            count = _split_info(model.readers[0])[1]
            why = (
                f"{KEY_SPLIT_COUNT} is {count}"
                if count is not None
                else f"it has no {KEY_SPLIT_COUNT} key"
            )
            raise GGUFError(f"not a split model ({why}); nothing to merge", path=model.path)
        for src in model.paths:
            if _same_file(out, src):
                raise UsageError(f"the output {out} would overwrite the input shard {src}")
        if not (out.parent if str(out.parent) else Path(".")).is_dir():
            raise UsageError(f"output directory {out.parent} does not exist")
        w = GGUFWriter(out, version=model.version)
        for f in model.fields.values():
            w.add_field(f)
        for t in model.tensors:
            w.add_tensor_info(t)
        w.write()
    return out


__all__ = [
    "DEFAULT_MAX_TENSORS",
    "SPLIT_KEYS",
    "GGUFModelFile",
    "ShardPlan",
    "merge_gguf",
    "parse_size",
    "plan_split",
    "shard_paths",
    "split_gguf",
    "split_path",
    "split_prefix",
]
