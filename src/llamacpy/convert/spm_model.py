"""SentencePiece ``tokenizer.model`` files, read with a small protobuf decoder of our own.

The file is a serialized ``ModelProto`` (sentencepiece_model.proto); the fields the
converter needs are::

    ModelProto      1: repeated SentencePiece pieces   2: TrainerSpec   3: NormalizerSpec
    SentencePiece   1: string piece   2: float score   3: Type type (default NORMAL)
    TrainerSpec     3: model_type (UNIGRAM=1, BPE=2, WORD=3, CHAR=4)   35: byte_fallback
                    40..43: unk_id, bos_id, eos_id, pad_id
    NormalizerSpec  1: name   2: bytes precompiled_charsmap   3: add_dummy_prefix (default true)
                    4: remove_extra_whitespaces (default true)   5: escape_whitespaces

Unknown fields are skipped, as protobuf requires.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

from .common import ConvertError

# SentencePiece.Type; the same numbers as llama.cpp's token types
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
MODEL_TYPES = {1: "UNIGRAM", 2: "BPE", 3: "WORD", 4: "CHAR"}

_F32 = struct.Struct("<f")


class _Reader:
    def __init__(self, buf: bytes, what: str) -> None:
        self.buf, self.pos, self.what = buf, 0, what

    def varint(self) -> int:
        shift = result = 0
        while True:
            if self.pos >= len(self.buf):
                raise ValueError(f"truncated varint in {self.what}")
            b = self.buf[self.pos]
            self.pos += 1
            result |= (b & 0x7F) << shift
            if b < 0x80:
                return result
            shift += 7
            if shift >= 70:
                raise ValueError(f"varint too long in {self.what}")

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise ValueError(f"truncated field in {self.what}")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out


def decode_fields(buf: bytes, what: str = "message") -> dict[int, list[int | bytes]]:
    """Every field of one protobuf message: field number -> values in order (varints and
    fixed-width values as ints, length-delimited ones as bytes)."""
    r = _Reader(buf, what)
    out: dict[int, list[int | bytes]] = {}
    while r.pos < len(buf):
        key = r.varint()
        number, wire = key >> 3, key & 7
        if number == 0:
            raise ValueError(f"invalid field number 0 in {what}")
        value: int | bytes
        if wire == 0:
            value = r.varint()
        elif wire == 1:
            value = int.from_bytes(r.take(8), "little")
        elif wire == 2:
            value = r.take(r.varint())
        elif wire == 5:
            value = int.from_bytes(r.take(4), "little")
        else:
            raise ValueError(f"unsupported wire type {wire} (field {number}) in {what}")
        out.setdefault(number, []).append(value)
    return out


def _last(fields: dict[int, list[int | bytes]], number: int, default: object) -> object:
    values = fields.get(number)
    return values[-1] if values else default


def _int32(v: object) -> int:
    n = int(v)  # type: ignore[call-overload]
    n &= 0xFFFFFFFFFFFFFFFF
    return n - (1 << 64) if n >= 1 << 63 else n


def _f32(v: object) -> float:
    return _F32.unpack(int(v).to_bytes(4, "little"))[0]  # type: ignore[call-overload]


def _text(v: object) -> str:
    return bytes(v).decode("utf-8", errors="surrogateescape")  # type: ignore[call-overload]


@dataclass
class SentencePieceModel:
    """The parts of a ``ModelProto`` that conversion uses."""

    pieces: list[str] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    types: list[int] = field(default_factory=list)
    model_type: int = 1  # UNIGRAM
    byte_fallback: bool = False
    unk_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    pad_id: int = -1
    normalizer_name: str = ""
    precompiled_charsmap: bytes = b""
    add_dummy_prefix: bool = True
    remove_extra_whitespaces: bool = True
    escape_whitespaces: bool = True

    @classmethod
    def parse(cls, data: bytes) -> SentencePieceModel:
        top = decode_fields(data, "ModelProto")
        m = cls()
        for i, raw in enumerate(top.get(1, [])):
            if not isinstance(raw, bytes):
                raise ValueError(f"piece {i} is not a message")
            f = decode_fields(raw, f"piece {i}")
            m.pieces.append(_text(_last(f, 1, b"")))
            m.scores.append(_f32(_last(f, 2, 0)))
            m.types.append(_int32(_last(f, 3, NORMAL)))
        trainer = _last(top, 2, b"")
        if isinstance(trainer, bytes) and trainer:
            t = decode_fields(trainer, "trainer_spec")
            m.model_type = _int32(_last(t, 3, 1))
            m.byte_fallback = bool(_last(t, 35, 0))
            m.unk_id = _int32(_last(t, 40, 0))
            m.bos_id = _int32(_last(t, 41, 1))
            m.eos_id = _int32(_last(t, 42, 2))
            m.pad_id = _int32(_last(t, 43, -1))
        norm = _last(top, 3, b"")
        if isinstance(norm, bytes) and norm:
            n = decode_fields(norm, "normalizer_spec")
            m.normalizer_name = _text(_last(n, 1, b""))
            m.precompiled_charsmap = bytes(_last(n, 2, b""))  # type: ignore[arg-type]
            m.add_dummy_prefix = bool(_last(n, 3, 1))
            m.remove_extra_whitespaces = bool(_last(n, 4, 1))
            m.escape_whitespaces = bool(_last(n, 5, 1))
        return m

    @classmethod
    def load(cls, path: str | Path) -> SentencePieceModel:
        path = Path(path)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise ConvertError(f"{path}: file not found") from None
        try:
            m = cls.parse(data)
        except (ValueError, struct.error) as e:
            raise ConvertError(f"{path}: not a SentencePiece model: {e}") from None
        if not m.pieces:
            raise ConvertError(f"{path}: not a SentencePiece model: it has no pieces")
        return m

    def __len__(self) -> int:
        return len(self.pieces)
