"""Code point classification and UTF-8 handling exactly as llama.cpp does it.

llama.cpp classifies code points with its own tables (``_unicode_data``), decodes UTF-8
leniently (a bad byte becomes U+FFFD; overlong forms and surrogates are accepted) and maps
bytes to printable characters for GPT-2 style byte-level BPE. Everything here reproduces
those rules; the tables are built once, on first use.
"""

from __future__ import annotations

import base64
import functools
import zlib

import numpy as np
from numba import njit

from . import _unicode_data as _data

# flag bits (same layout as llama.cpp's unicode_cpt_flags)
UNDEFINED = 0x0001
NUMBER = 0x0002
LETTER = 0x0004
SEPARATOR = 0x0008
ACCENT_MARK = 0x0010
PUNCTUATION = 0x0020
SYMBOL = 0x0040
CONTROL = 0x0080
MASK_CATEGORIES = 0x00FF
WHITESPACE = 0x0100
LOWERCASE = 0x0200
UPPERCASE = 0x0400
NFD = 0x0800

MAX_CODEPOINTS = 0x110000
REPLACEMENT = 0xFFFD


def _unpack(packed: tuple[str, ...] | str, width: int) -> np.ndarray:
    text = "".join(packed) if isinstance(packed, tuple) else packed
    raw = zlib.decompress(base64.b64decode(text))
    arr = np.frombuffer(raw, dtype="<i4").astype(np.int64)
    return arr.reshape(-1, width) if width > 1 else arr


@functools.cache
def cpt_flags() -> np.ndarray:
    """uint16 flags for every code point 0..0x10FFFF (read-only)."""
    ranges = _unpack(_data.RANGES_FLAGS, 2)
    starts, flags = ranges[:, 0], ranges[:, 1]
    lengths = np.diff(starts)
    out = np.repeat(flags[:-1].astype(np.uint16), lengths)
    assert out.shape[0] == MAX_CODEPOINTS
    out[_unpack(_data.WHITESPACE, 1)] |= WHITESPACE
    out[_unpack(_data.MAP_LOWERCASE, 2)[:, 1]] |= LOWERCASE
    out[_unpack(_data.MAP_UPPERCASE, 2)[:, 1]] |= UPPERCASE
    out[_unpack(_data.RANGES_NFD, 3)[:, 2]] |= NFD
    out.setflags(write=False)
    return out


@functools.cache
def lowercase_table() -> np.ndarray:
    """uint32 array: code point -> llama.cpp's ``unicode_tolower`` (identity when unmapped)."""
    table = np.arange(MAX_CODEPOINTS, dtype=np.uint32)
    pairs = _unpack(_data.MAP_LOWERCASE, 2)
    table[pairs[:, 0]] = pairs[:, 1]
    table.setflags(write=False)
    return table


@functools.cache
def _nfd_ranges() -> np.ndarray:
    return _unpack(_data.RANGES_NFD, 3)


def flags_of(cpt: int) -> int:
    return int(cpt_flags()[cpt]) if 0 <= cpt < MAX_CODEPOINTS else UNDEFINED


def tolower(cpt: int) -> int:
    return int(lowercase_table()[cpt]) if 0 <= cpt < MAX_CODEPOINTS else cpt


def nfd_first(cpts: np.ndarray) -> np.ndarray:
    """llama.cpp's ``unicode_cpts_normalize_nfd``: each code point -> first code point of its
    NFD decomposition (one code point in, one out)."""
    ranges = _nfd_ranges()
    idx = np.searchsorted(ranges[:, 0], cpts, side="right") - 1
    idx = np.maximum(idx, 0)
    hit = (ranges[idx, 0] <= cpts) & (cpts <= ranges[idx, 1])
    return np.where(hit, ranges[idx, 2], cpts).astype(np.uint32)


# --- UTF-8 -----------------------------------------------------------------------------


@njit(cache=True)
def _decode_lenient(buf: np.ndarray) -> np.ndarray:  # pragma: no cover - numba
    n = buf.shape[0]
    out = np.empty(n, np.uint32)
    k = 0
    i = 0
    while i < n:
        c = np.int64(buf[i])
        cpt = np.int64(REPLACEMENT)
        step = 1
        if c < 0x80:
            cpt = c
        elif (c & 0x40) == 0:
            pass
        elif (c & 0x20) == 0:
            if i + 1 < n and (buf[i + 1] & 0xC0) == 0x80:
                cpt = ((c & 0x1F) << 6) | (buf[i + 1] & 0x3F)
                step = 2
        elif (c & 0x10) == 0:
            if i + 2 < n and (buf[i + 1] & 0xC0) == 0x80 and (buf[i + 2] & 0xC0) == 0x80:
                cpt = ((c & 0x0F) << 12) | ((buf[i + 1] & 0x3F) << 6) | (buf[i + 2] & 0x3F)
                step = 3
        elif (c & 0x08) == 0:  # noqa: SIM102 (one branch per sequence length)
            if (
                i + 3 < n
                and (buf[i + 1] & 0xC0) == 0x80
                and (buf[i + 2] & 0xC0) == 0x80
                and (buf[i + 3] & 0xC0) == 0x80
            ):
                cpt = (
                    ((c & 0x07) << 18)
                    | ((buf[i + 1] & 0x3F) << 12)
                    | ((buf[i + 2] & 0x3F) << 6)
                    | (buf[i + 3] & 0x3F)
                )
                step = 4
                # llama.cpp aborts on code points past U+10FFFF; we substitute U+FFFD
                if cpt >= MAX_CODEPOINTS:
                    cpt = np.int64(REPLACEMENT)
        out[k] = cpt
        k += 1
        i += step
    return out[:k]


def decode_utf8(data: bytes) -> str:
    """Bytes -> str the way llama.cpp's ``unicode_cpts_from_utf8`` reads them.

    Valid UTF-8 decodes as usual. Otherwise each byte that does not start a complete
    sequence becomes U+FFFD; overlong forms and encoded surrogates are accepted (the result
    may then hold lone surrogates, re-encoded by :func:`encode_utf8`). Code points past
    U+10FFFF (on which llama.cpp aborts) become U+FFFD.
    """
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    cpts = _decode_lenient(np.frombuffer(data, dtype=np.uint8))
    return cpts.astype("<u4").tobytes().decode("utf-32-le", "surrogatepass")


def encode_utf8(text: str) -> bytes:
    """str -> bytes; lone surrogates are written as their 3-byte forms (as llama.cpp does)."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")


def utf8_len(lead: int) -> int:
    """llama.cpp's ``unicode_len_utf8``: sequence length from the lead byte's high nibble."""
    return (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4)[lead >> 4]


def str_to_cpts(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)


# --- GPT-2 byte-level mapping -------------------------------------------------------------


@functools.cache
def bytes_to_unicode() -> tuple[str, ...]:
    """byte value -> the printable character GPT-2 byte-level BPE writes for it."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table: dict[int, str] = {b: chr(b) for b in keep}
    n = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + n)
            n += 1
    return tuple(table[b] for b in range(256))


@functools.cache
def unicode_to_bytes() -> dict[str, int]:
    return {ch: b for b, ch in enumerate(bytes_to_unicode())}


@functools.cache
def byte_encode_table() -> dict[int, str]:
    """``str.translate`` table: latin-1 char (one per byte) -> GPT-2 printable char."""
    return {b: ch for b, ch in enumerate(bytes_to_unicode())}


def byte_encode(data: bytes) -> str:
    """Raw bytes -> GPT-2 byte-level string (one character per byte)."""
    return data.decode("latin-1").translate(byte_encode_table())
