"""Mutation fuzzing of the GGUF reader: seed files, mutators and the per-variant check.

Shared by ``tests/test_gguf_fuzz.py`` (a short deterministic run) and ``scripts/fuzz_gguf.py``
(long runs). A variant passes when :class:`GGUFReader` either loads it, and every field value
and tensor view can be used and obeys the reader's guarantees, or raises
:class:`GGUFError`. Anything else (another exception, a hang) is a bug.
"""

from __future__ import annotations

import os
import random
import signal
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from llamacpy.errors import GGUFError
from llamacpy.gguf import GGUFReader, GGUFWriter, copy_to_writer
from llamacpy.gguf.constants import (
    GGML_BLOCK_SIZES,
    GGML_MAX_NAME,
    GGML_NUMPY_DTYPES,
    SCALAR_DTYPES,
    SCALAR_SIZES,
    GGMLType,
    GGUFValueType,
)

VT = GGUFValueType
U32_BOUNDARIES = (0, 1, 2**31, 2**32 - 1)
U64_BOUNDARIES = (0, 1, 2**31, 2**32 - 1, 2**63, 2**64 - 1)
TIMEOUT_S = 2.0


class Timeout(BaseException):
    """Raised by the SIGALRM handler when one variant takes longer than its budget.

    A BaseException, so that no ``except Exception`` on the way can swallow it.
    """


# ---------------------------------------------------------------------------- seeds
def _tensor_bytes(rng: np.random.Generator, gtype: GGMLType, shape: tuple[int, ...]) -> bytes:
    block, block_bytes = GGML_BLOCK_SIZES[gtype]
    n = 1
    for d in shape:
        n *= d
    return rng.integers(0, 256, n // block * block_bytes, dtype=np.uint8).tobytes()


def build_seeds(directory: str | os.PathLike[str]) -> list[bytes]:
    """Four small valid GGUF files, written by our writer, returned as bytes."""
    rng = np.random.default_rng(1234)
    directory = Path(directory)
    seeds = []

    # 1: every value type, string arrays, nested arrays, unicode; one tensor
    w = GGUFWriter(directory / "seed_strings.gguf")
    w.add("general.architecture", "llama")
    w.add("general.name", "fuzz seed ✓ ünïcødé")
    w.add("s.empty", "")
    for i, t in enumerate(SCALAR_DTYPES):
        value = True if t == VT.BOOL else 1.5 if t in (VT.FLOAT32, VT.FLOAT64) else 7
        w.add(f"scalar.{i}", value, type=t)
        w.add(f"array.{i}", np.arange(3).astype(SCALAR_DTYPES[t]), type=VT.ARRAY, elem_type=t)
    w.add("tokenizer.ggml.tokens", ["<s>", "</s>", "hello", "", "wörld", "日本"])
    w.add("a.empty_strings", [], type=VT.ARRAY, elem_type=VT.STRING)
    w.add("a.nested", [np.array([1, 2, 3], np.int32), ["x", "yz"], [np.array([0.5], np.float32)]])
    w.add("a.nested_empty", [np.zeros(0, np.uint8)], type=VT.ARRAY, elem_type=VT.ARRAY)
    w.add("tokenizer.ggml.scores", np.linspace(-1, 1, 6, dtype=np.float32))
    w.add_tensor(
        "token_embd.weight", GGMLType.F32, (8, 2), _tensor_bytes(rng, GGMLType.F32, (8, 2))
    )
    w.write()
    seeds.append(Path(w.path).read_bytes())

    # 2: several tensor types and shapes
    w = GGUFWriter(directory / "seed_tensors.gguf")
    w.add("general.architecture", "llama")
    w.add("llama.block_count", 2, type=VT.UINT32)
    tensors = [
        ("a.f32", GGMLType.F32, (5,)),
        ("b.f16", GGMLType.F16, (4, 3)),
        ("c.bf16", GGMLType.BF16, (2, 2, 2)),
        ("d.q4_0", GGMLType.Q4_0, (32, 2)),
        ("e.q8_0", GGMLType.Q8_0, (64,)),
        ("f.q4_k", GGMLType.Q4_K, (256, 1, 1, 1)),
        ("g.i8", GGMLType.I8, (3, 1)),
        ("h.i32", GGMLType.I32, (2, 3)),
    ]
    for name, gtype, shape in tensors:
        w.add_tensor(name, gtype, shape, _tensor_bytes(rng, gtype, shape))
    w.write()
    seeds.append(Path(w.path).read_bytes())

    # 3: version 2
    w = GGUFWriter(directory / "seed_v2.gguf", version=2)
    w.add("general.architecture", "gpt2")
    w.add("gpt2.context_length", 128, type=VT.UINT64)
    w.add("x.flags", [True, False, True])
    w.add_tensor("w", GGMLType.F16, (6, 2), _tensor_bytes(rng, GGMLType.F16, (6, 2)))
    w.add_tensor("v", GGMLType.Q8_0, (32,), _tensor_bytes(rng, GGMLType.Q8_0, (32,)))
    w.write()
    seeds.append(Path(w.path).read_bytes())

    # 4: custom alignment, tensor sizes that need padding
    w = GGUFWriter(directory / "seed_align.gguf")
    w.add("general.alignment", 64, type=VT.UINT32)
    w.add("general.architecture", "llama")
    w.add_tensor("p", GGMLType.F32, (3,), _tensor_bytes(rng, GGMLType.F32, (3,)))
    w.add_tensor("q", GGMLType.I16, (5, 3), _tensor_bytes(rng, GGMLType.I16, (5, 3)))
    w.add_tensor("r", GGMLType.Q4_0, (32,), _tensor_bytes(rng, GGMLType.Q4_0, (32,)))
    w.write()
    seeds.append(Path(w.path).read_bytes())
    return seeds


def numeric_fields(data: bytes) -> list[tuple[int, int]]:
    """(offset, size) of every count, length, type, dim and offset field of a *valid* file.

    A small independent walker (trusted only on the seeds) that lets the mutators hit the
    fields that matter instead of tensor bytes.
    """
    out = [(4, 4), (8, 8), (16, 8)]
    n_tensors, n_kv = struct.unpack_from("<QQ", data, 8)
    pos = 24

    def value(vtype: int, pos: int) -> int:
        if vtype == VT.STRING:
            out.append((pos, 8))
            return pos + 8 + struct.unpack_from("<Q", data, pos)[0]
        if vtype == VT.ARRAY:
            etype, count = struct.unpack_from("<IQ", data, pos)
            out.extend([(pos, 4), (pos + 4, 8)])
            pos += 12
            if etype in (VT.STRING, VT.ARRAY):
                for _ in range(count):
                    pos = value(etype, pos)
                return pos
            return pos + count * SCALAR_SIZES[VT(etype)]
        out.append((pos, SCALAR_SIZES[VT(vtype)]))
        return pos + SCALAR_SIZES[VT(vtype)]

    for _ in range(n_kv):
        out.append((pos, 8))
        pos += 8 + struct.unpack_from("<Q", data, pos)[0]
        out.append((pos, 4))
        pos = value(struct.unpack_from("<I", data, pos)[0], pos + 4)
    for _ in range(n_tensors):
        out.append((pos, 8))
        pos += 8 + struct.unpack_from("<Q", data, pos)[0]
        n_dims = struct.unpack_from("<I", data, pos)[0]
        out.append((pos, 4))
        pos += 4
        out.extend((pos + 8 * d, 8) for d in range(n_dims))
        pos += 8 * n_dims
        out.extend([(pos, 4), (pos + 4, 8)])
        pos += 12
    return out


# ---------------------------------------------------------------------------- mutators
class Mutator:
    """Deterministic corruption of the seeds: variant ``i`` of run ``seed`` is always the same."""

    def __init__(self, seeds: list[bytes]) -> None:
        self.seeds = seeds
        self.fields = [numeric_fields(s) for s in seeds]
        self.header_sizes = [max(p + n for p, n in f) for f in self.fields]
        self.ops: list[Callable[[random.Random, bytearray, int], bytearray]] = [
            self.truncate,
            self.flip_bytes,
            self.boundary_field,
            self.boundary_anywhere,
            self.duplicate_range,
            self.remove_range,
            self.splice,
        ]

    def variant(self, seed: int, index: int) -> tuple[bytes, str]:
        """The corrupted bytes of variant ``index`` and a short description of what was done."""
        rng = random.Random(seed * 1_000_003 + index)
        k = rng.randrange(len(self.seeds))
        data = bytearray(self.seeds[k])
        steps = [f"seed {k}"]
        for _ in range(rng.choice((1, 1, 1, 2, 3))):
            op = rng.choice(self.ops)
            data = op(rng, data, k)
            steps.append(op.__name__)
        return bytes(data), ", ".join(steps)

    def _pos(self, rng: random.Random, data: bytearray, k: int) -> int:
        """A position, usually inside the header (where the parser looks)."""
        if not data:
            return 0
        limit = self.header_sizes[k] if rng.random() < 0.8 else len(data)
        return rng.randrange(max(1, min(limit, len(data))))

    def truncate(self, rng: random.Random, data: bytearray, k: int) -> bytearray:
        return (
            data[: self._pos(rng, data, k)]
            if rng.random() < 0.7
            else data[: rng.randrange(len(data) + 1)]
        )

    def flip_bytes(self, rng: random.Random, data: bytearray, k: int) -> bytearray:
        for _ in range(rng.randint(1, 4)):
            if data:
                pos = self._pos(rng, data, k)
                data[pos] = (
                    rng.randrange(256)
                    if rng.random() < 0.5
                    else data[pos] ^ (1 << rng.randrange(8))
                )
        return data

    def _write_int(self, data: bytearray, pos: int, size: int, value: int) -> bytearray:
        raw = (value % 2 ** (8 * size)).to_bytes(size, "little")
        data[pos : pos + size] = raw[: max(0, len(data) - pos)]
        return data

    def boundary_field(self, rng: random.Random, data: bytearray, k: int) -> bytearray:
        """Overwrite a real count/length/type/dim/offset field with a boundary value."""
        pos, size = rng.choice(self.fields[k])
        if pos >= len(data):
            return data
        values = U32_BOUNDARIES if size == 4 else U64_BOUNDARIES
        old = int.from_bytes(data[pos : pos + size], "little")
        value = rng.choice((*values, old + 1, old - 1, old * 2, old + 32))
        return self._write_int(data, pos, size, value)

    def boundary_anywhere(self, rng: random.Random, data: bytearray, k: int) -> bytearray:
        size = rng.choice((4, 8))
        values = U32_BOUNDARIES if size == 4 else U64_BOUNDARIES
        return self._write_int(data, self._pos(rng, data, k), size, rng.choice(values))

    def duplicate_range(self, rng: random.Random, data: bytearray, k: int) -> bytearray:
        a = self._pos(rng, data, k)
        b = min(len(data), a + rng.randint(1, 64))
        at = self._pos(rng, data, k)
        return data[:at] + data[a:b] + data[at:]

    def remove_range(self, rng: random.Random, data: bytearray, k: int) -> bytearray:
        a = self._pos(rng, data, k)
        return data[:a] + data[a + rng.randint(1, 64) :]

    def splice(self, rng: random.Random, data: bytearray, k: int) -> bytearray:
        other = self.seeds[rng.randrange(len(self.seeds))]
        return data[: self._pos(rng, data, k)] + other[rng.randrange(len(other)) :]


# ---------------------------------------------------------------------------- checking
@contextmanager
def time_limit(seconds: float = TIMEOUT_S) -> Iterator[None]:
    """Raise :class:`Timeout` in the main thread if the body runs longer than ``seconds``."""

    def on_alarm(signum: int, frame: Any) -> None:
        raise Timeout(f"no result after {seconds} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _touch(value: Any, etype: GGUFValueType | None = None) -> int:
    """Use a value completely; check that an array's contents match its element type."""
    if isinstance(value, np.ndarray):
        want = np.dtype(bool) if etype == VT.BOOL else SCALAR_DTYPES[etype]
        assert value.dtype == want, (value.dtype, etype)
        return len(value.tobytes()) + int(value.view(np.uint8).sum())
    if isinstance(value, list):
        assert etype in (VT.STRING, VT.ARRAY), etype
        if etype == VT.STRING:
            return sum(len(v.encode("utf-8", errors="surrogateescape")) for v in value)
        return sum(_touch(v, v.elem_type if isinstance(v, list) else _etype(v)) for v in value)
    if isinstance(value, str):
        return len(value.encode("utf-8", errors="surrogateescape"))
    assert isinstance(value, int | float), type(value)
    return hash(value) & 0xFF


def _etype(arr: np.ndarray) -> GGUFValueType:
    if arr.dtype == bool:
        return VT.BOOL
    return next(t for t, d in SCALAR_DTYPES.items() if d == arr.dtype and t != VT.BOOL)


def exercise(reader: GGUFReader) -> int:
    """Touch every field and tensor of a loaded file and check the reader's guarantees."""
    acc = 0
    for key, f in reader.fields.items():
        assert key and f.key == key
        acc += _touch(f.value, f.elem_type) + len(key)
    assert reader.alignment > 0 and reader.alignment & (reader.alignment - 1) == 0
    names = set()
    prev_end = reader.data_offset
    for t in reader.tensors:
        assert (
            t.name not in names
            and 0 < len(t.name.encode("utf-8", "surrogateescape")) < GGML_MAX_NAME
        )
        names.add(t.name)
        assert t.data_offset % reader.alignment == 0 and t.data_offset >= prev_end
        prev_end = t.data_offset + t.nbytes
        assert prev_end <= reader.file_size
        raw, data = t.raw, t.data
        assert raw.nbytes == t.nbytes == data.nbytes
        dtype = GGML_NUMPY_DTYPES.get(t.type)
        if dtype is not None:
            assert data.dtype == dtype and data.shape == t.np_shape
        else:
            assert data.dtype == np.uint8 and data.shape[:-1] == t.np_shape[:-1]
        acc += (
            int(raw[:8].sum())
            + int(raw[-8:].sum())
            + int(data.reshape(-1)[:1].view(np.uint8).sum())
        )
    return acc


def check_rewrite(reader: GGUFReader, directory: str) -> None:
    """A loaded file, written back by our writer, reads back with the same content."""
    out = os.path.join(directory, "rewrite.gguf")
    copy_to_writer(reader, GGUFWriter(out, version=reader.version)).write()
    with GGUFReader(out) as again:
        assert list(again.fields) == list(reader.fields)
        for f in reader.fields.values():
            g = again.fields[f.key]
            assert (g.type, g.elem_type) == (f.type, f.elem_type), f.key
            assert _canonical(g.value) == _canonical(f.value), f.key
        assert [(t.name, t.type, t.shape) for t in again.tensors] == [
            (t.name, t.type, t.shape) for t in reader.tensors
        ]
        for a, b in zip(again.tensors, reader.tensors):
            assert a.raw.tobytes() == b.raw.tobytes(), a.name


def _canonical(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return (str(value.dtype), value.tobytes())
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    if isinstance(value, float):
        return struct.pack("<d", value)  # NaN-safe
    return (type(value).__name__, value)


def check_variant(path: str, data: bytes, *, use_mmap: bool = True, rewrite: bool = False) -> str:
    """Write ``data`` to ``path`` and open it: ``'ok'`` or ``'error'`` (a GGUFError).

    Anything else propagates: another exception, :class:`Timeout`, a failed assertion.
    The file is replaced, never rewritten in place, so a mapping of an earlier variant that
    is still alive never sees its file shrink.
    """
    tmp = path + ".new"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    with time_limit():
        try:
            reader = GGUFReader(path, use_mmap=use_mmap)
        except GGUFError as e:
            assert str(e) and e.path == path
            return "error"
        with reader:
            exercise(reader)
            if rewrite:
                check_rewrite(reader, os.path.dirname(path))
    return "ok"
