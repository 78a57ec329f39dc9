"""Safetensors checkpoints read with numpy: memory-mapped, one tensor at a time.

A ``.safetensors`` file is ``u64 header_len | JSON header | raw bytes``; the header maps
each tensor name to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets relative
to the end of the header) plus an optional ``"__metadata__"`` entry. Every entry is checked
against the file before anything is read, so a truncated or inconsistent file gives a
:class:`ConvertError` naming the file and the tensor.

A checkpoint is ``model.safetensors`` or ``model-0000i-of-0000n.safetensors`` with
``model.safetensors.index.json``; tensors are listed the way llama.cpp's converter walks
them: file by file (sorted by name), and by name within each file.
"""

from __future__ import annotations

import json
import mmap
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .common import ConvertError, read_json

MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors library's own limit

# safetensors dtype -> numpy storage dtype (BF16 is kept as its raw uint16 bits)
DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"),
    "U32": np.dtype("<u4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("u1"),
}
# known to safetensors but not convertible without their quantization scales
_UNSUPPORTED = {"F8_E4M3", "F8_E5M2", "F8_E8M0", "F4", "F6_E2M3", "F6_E3M2"}


@dataclass(frozen=True)
class SourceTensor:
    """One tensor of a checkpoint: where its bytes are and what they are (nothing loaded)."""

    name: str
    dtype: str  # safetensors dtype name
    shape: tuple[int, ...]  # numpy order (the last axis is contiguous)
    file: SafetensorsFile
    offset: int  # absolute byte offset in the file
    nbytes: int

    def raw(self) -> np.ndarray:
        """The stored values as a read-only numpy view of the mapped file (BF16 as uint16)."""
        return self.file.view(self.offset, DTYPES[self.dtype], self.shape)

    def load(self) -> np.ndarray:
        """The values as llama.cpp's converter sees them: F16/F32 as stored, anything else
        widened to float32 (BF16 exactly, by shifting its bits)."""
        a = self.raw()
        if self.dtype in ("F32", "F16"):
            return a
        if self.dtype == "BF16":
            return (a.astype(np.uint32) << 16).view(np.float32)
        return a.astype(np.float32)


class SafetensorsFile:
    """A parsed safetensors file; the data are mapped on first access."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._mm: mmap.mmap | None = None
        self.metadata: dict[str, str] = {}
        self.tensors: dict[str, SourceTensor] = {}
        self._parse()

    def _err(self, msg: str) -> ConvertError:
        return ConvertError(f"{self.path}: {msg}")

    def _parse(self) -> None:
        try:
            size = self.path.stat().st_size
            with open(self.path, "rb") as f:
                head = f.read(8)
                if len(head) < 8:
                    raise self._err("not a safetensors file (shorter than 8 bytes)")
                n = int.from_bytes(head, "little")
                if n > size - 8 or n > MAX_HEADER_BYTES:
                    raise self._err(
                        f"truncated or not a safetensors file: header length {n} but the "
                        f"file has {size} bytes"
                    )
                raw = f.read(n)
        except OSError as e:
            raise self._err(f"cannot read: {e.strerror or e}") from None
        try:
            header = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise self._err(f"invalid safetensors header: {e}") from None
        if not isinstance(header, dict):
            raise self._err("invalid safetensors header: not a JSON object")
        data_start, data_len = 8 + n, size - 8 - n
        for name, meta in header.items():
            if name == "__metadata__":
                if isinstance(meta, dict):
                    self.metadata = {str(k): str(v) for k, v in meta.items()}
                continue
            self.tensors[name] = self._entry(name, meta, data_start, data_len)

    def _entry(self, name: str, meta: object, data_start: int, data_len: int) -> SourceTensor:
        where = f"tensor {name!r}"
        if not isinstance(meta, dict):
            raise self._err(f"{where}: header entry is not an object")
        dtype, shape, offs = meta.get("dtype"), meta.get("shape"), meta.get("data_offsets")
        if dtype in _UNSUPPORTED:
            raise self._err(
                f"{where}: dtype {dtype} (a quantized checkpoint) is not supported; "
                "convert from the unquantized weights"
            )
        if dtype not in DTYPES:
            raise self._err(f"{where}: unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            raise self._err(f"{where}: invalid shape {shape!r}")
        if (
            not isinstance(offs, list)
            or len(offs) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offs)
        ):
            raise self._err(f"{where}: invalid data_offsets {offs!r}")
        begin, end = offs
        count = 1
        for d in shape:
            count *= d
        need = count * DTYPES[dtype].itemsize
        if not 0 <= begin <= end <= data_len:
            raise self._err(
                f"{where}: data_offsets [{begin}, {end}] outside the {data_len} data bytes "
                "(truncated file?)"
            )
        if end - begin != need:
            raise self._err(
                f"{where}: shape {tuple(shape)} of {dtype} needs {need} bytes but data_offsets "
                f"span {end - begin}"
            )
        return SourceTensor(name, dtype, tuple(shape), self, data_start + begin, need)

    def view(self, offset: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        count = 1
        for d in shape:
            count *= d
        if count == 0:
            return np.zeros(shape, dtype=dtype)
        if self._mm is None:
            with open(self.path, "rb") as f:  # the mapping keeps its own handle
                self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        return np.frombuffer(self._mm, dtype=dtype, count=count, offset=offset).reshape(shape)

    def close(self) -> None:
        # numpy views may still reference the mapping; it is unmapped when the last one goes
        self._mm = None


class Checkpoint:
    """Every tensor of a Hugging Face checkpoint directory, in llama.cpp's converter order."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory)
        self.files: list[SafetensorsFile] = []
        self.tensors: dict[str, SourceTensor] = {}
        try:
            self._open()
        except BaseException:
            self.close()
            raise

    def _open(self) -> None:
        parts = sorted(
            p.name
            for p in self.dir.iterdir()
            if p.name.startswith("model") and p.name.endswith(".safetensors") and p.is_file()
        )
        index_path = self.dir / "model.safetensors.index.json"
        weight_map: dict[str, str] = {}
        if index_path.is_file():
            index = read_json(index_path)
            weight_map = index.get("weight_map") if isinstance(index, dict) else None
            if not isinstance(weight_map, dict):
                raise ConvertError(f"{index_path}: no 'weight_map' object")
            parts = sorted(set(weight_map.values()))
        if not parts:
            bins = sorted(p.name for p in self.dir.glob("pytorch_model*.bin"))
            if bins:
                raise ConvertError(
                    f"{self.dir}: only PyTorch pickles ({bins[0]}) found; llamacpy converts "
                    "safetensors checkpoints (save the model with safe_serialization=True)"
                )
            raise ConvertError(f"{self.dir}: no model weights found (model*.safetensors)")
        missing_files = [p for p in parts if not (self.dir / p).is_file()]
        if missing_files:
            raise ConvertError(
                f"{self.dir}: missing model files named in {index_path.name}: "
                f"{', '.join(missing_files)}"
            )
        for part in parts:
            f = SafetensorsFile(self.dir / part)
            self.files.append(f)
            for name in sorted(f.tensors):
                if name in self.tensors:
                    other = self.tensors[name].file.path.name
                    raise ConvertError(f"{self.dir}: tensor {name!r} is in both {other} and {part}")
                self.tensors[name] = f.tensors[name]
        if weight_map:
            missing = sorted(set(weight_map) - set(self.tensors))
            extra = sorted(set(self.tensors) - set(weight_map))
            if missing or extra:
                raise ConvertError(
                    f"{self.dir}: {index_path.name} does not match the model files: "
                    f"missing tensors {missing[:5]}{' ...' if len(missing) > 5 else ''}, "
                    f"unexpected tensors {extra[:5]}{' ...' if len(extra) > 5 else ''}"
                )

    def close(self) -> None:
        for f in self.files:
            f.close()

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
