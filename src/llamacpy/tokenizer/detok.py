"""Token ids back to text: pieces, whole-sequence detokenization and a streaming decoder.

All byte-exact with llama.cpp's ``token_to_piece`` / ``llama_detokenize`` (including the
``clean_up_tokenization_spaces`` passes some BPE vocabularies enable). Results are bytes at
this level; :class:`StreamDecoder` turns them into text without ever splitting a UTF-8
character.
"""

from __future__ import annotations

from . import unicode as uni
from .errors import TokenizerError
from .vocab import (
    ATTR_BYTE,
    ATTR_CONTROL,
    ATTR_NORMAL,
    ATTR_UNKNOWN,
    ATTR_USER_DEFINED,
    Vocab,
)

_SPECIAL = ATTR_UNKNOWN | ATTR_CONTROL
_ESCAPED_SPACE = "\u2581"
_HEX = frozenset(b"0123456789abcdefABCDEF")


def _strtol_hex(data: bytes) -> int:
    """C ``strtol(s, NULL, 16)`` on a (short) byte string: leading hex digits, else 0."""
    digits = bytearray()
    for b in data:
        if b not in _HEX:
            break
        digits.append(b)
    return int(digits, 16) if digits else 0


class Detokenizer:
    """Pieces of one vocabulary (computed lazily, cached)."""

    def __init__(self, vocab: Vocab) -> None:
        self.vocab = vocab
        self._pieces: dict[int, bytes] = {}

    def _check(self, tid: int) -> None:
        if not 0 <= tid < self.vocab.n_tokens:
            raise TokenizerError(f"token id {tid} out of range (vocab has {self.vocab.n_tokens})")

    def piece(self, tid: int) -> bytes:
        """``token_to_piece(special=True)``: the bytes a token stands for."""
        p = self._pieces.get(tid)
        if p is None:
            self._check(tid)
            p = self._pieces[tid] = self._compute(tid)
        return p

    def _compute(self, tid: int) -> bytes:
        v = self.vocab
        attr = int(v.attrs[tid])
        text = v.tokens[tid]
        raw = text.encode("utf-8", "surrogateescape")
        if attr & (_SPECIAL | ATTR_USER_DEFINED):
            return raw
        if attr & ATTR_NORMAL:
            if v.type in ("spm", "wpm", "ugm") or (v.type == "bpe" and v.escape_whitespaces):
                return raw.replace(_ESCAPED_SPACE.encode(), b" ")
            if v.type == "bpe":
                return _decode_byte_level(text)
            return b""
        if attr & ATTR_BYTE:
            if v.type == "wpm":
                raise TokenizerError(f"byte token {tid} in a WPM vocabulary")
            return bytes([_strtol_hex(raw[3:5]) & 0xFF])
        return b""

    def token_to_piece(self, tid: int, special: bool = True, lstrip: int = 0) -> bytes:
        if not special:
            self._check(tid)
            if self.vocab.attrs[tid] & _SPECIAL:
                return b""
        p = self.piece(tid)
        for _ in range(lstrip):
            if not p.startswith(b" "):
                break
            p = p[1:]
        return p

    def detokenize(
        self, ids: list[int], remove_special: bool = False, unparse_special: bool = False
    ) -> bytes:
        """``llama_detokenize``."""
        v = self.vocab
        remove_space = v.add_space_prefix
        bos = v.id("bos")
        eos = v.id("eos")
        ids = list(ids)
        if remove_special and v.add_bos and ids and ids[0] == bos:
            remove_space = False
            ids = ids[1:]
        if remove_special and v.add_eos and ids and ids[-1] == eos:
            ids = ids[:-1]
        parts = []
        for tid in ids:
            parts.append(self.token_to_piece(tid, unparse_special, 1 if remove_space else 0))
            remove_space = False
        text = b"".join(parts)
        if v.clean_spaces:
            text = clean_spaces(text)
        return text


def _decode_byte_level(text: str) -> bytes:
    """llama.cpp's ``llama_decode_text``: GPT-2 printable characters back to bytes."""
    table = uni.unicode_to_bytes()
    try:
        return bytes(table[ch] for ch in text)
    except KeyError:
        pass
    raw = text.encode("utf-8", "surrogateescape")
    out = bytearray()
    for ch in uni.decode_utf8(raw):
        b = table.get(ch)
        if b is not None:
            out.append(b)
        else:
            utf8 = uni.encode_utf8(ch)
            out += b"[UNK_BYTE_0x" + utf8.hex().encode() + raw + b"]"
    return bytes(out)


def clean_spaces(data: bytes) -> bytes:
    """The three clean-up passes of ``llama_detokenize`` (in-place semantics kept)."""
    text = bytearray(data)
    total = len(text)
    # pass 1: " ?", " !", " .", " ,"
    t1 = total
    total = 1 if total else 0
    for i in range(1, t1):
        x = text[i]
        if text[i - 1] == 0x20 and x in b"?!.,":
            total -= 1
        text[total] = x
        total += 1
    # pass 2: " ' " -> "'"
    t2 = total
    total = 1 if total else 0
    i = 1
    while i < t2:
        x = text[i]
        if x == 0x27 and i + 1 < t2 and text[i - 1] == 0x20 and text[i + 1] == 0x20:
            total -= 1
            i += 1
            text[i] = 0
        text[total] = x
        total += 1
        i += 1
    # pass 3: " 's", " 'm", " 're", " 've"
    t3 = total
    total = 1 if total else 0
    for i in range(1, t3):
        x = text[i]
        if text[i - 1] == 0x20 and x == 0x27 and i + 1 < t3:
            x1 = text[i + 1]
            if x1 in b"sm" or (x1 not in b"td" and i + 2 < t3 and _re_ve(x1, text[i + 2])):
                total -= 1
        text[total] = x
        total += 1
    return bytes(text[:total])


def _re_ve(x1: int, x2: int) -> bool:
    return (x1 == 0x72 and x2 == 0x65) or (x1 == 0x76 and x2 == 0x65)


def complete_utf8_prefix(data: bytes) -> int:
    """Length of ``data`` without a trailing incomplete UTF-8 sequence (llama-server's
    ``validate_utf8``)."""
    n = len(data)
    for k in range(1, min(4, n) + 1):
        c = data[n - k]
        if (c & 0xE0) == 0xC0 and k < 2:
            return n - k
        if (c & 0xF0) == 0xE0 and k < 3:
            return n - k
        if (c & 0xF8) == 0xF0 and k < 4:
            return n - k
    return n


_UNSAFE = b" '"


class StreamDecoder:
    """Incremental detokenization: :meth:`feed` one id at a time, get the text that is now
    certain; concatenated outputs (plus :meth:`flush`) equal ``decode(all ids)``.

    Never emits part of a UTF-8 character; strips the leading space of the first piece when
    the vocabulary adds a space prefix (as ``llama_detokenize`` does); applies the BPE
    clean-up passes only to text whose neighbours are known.
    """

    def __init__(
        self, detok: Detokenizer, special: bool = False, remove_special: bool = False
    ) -> None:
        self._d = detok
        self._special = special
        self._remove_special = remove_special
        self._clean = detok.vocab.clean_spaces
        self._raw = bytearray()  # not yet cleaned (only when clean-up is on)
        self._out = bytearray()  # cleaned, not yet emitted (incomplete UTF-8 tail)
        self._first = True
        self._remove_space = detok.vocab.add_space_prefix
        self._held_eos = False

    def feed(self, tid: int) -> str:
        v = self._d.vocab
        if self._held_eos:
            self._held_eos = False
            self._push(self._piece(v.id("eos")))
        if self._first:
            self._first = False
            if self._remove_special and v.add_bos and tid == v.id("bos"):
                self._remove_space = False
                return ""
        if self._remove_special and v.add_eos and tid == v.id("eos"):
            self._held_eos = True  # dropped if it turns out to be the last token
            return ""
        self._push(self._piece(tid))
        return self._emit(final=False)

    def _piece(self, tid: int) -> bytes:
        p = self._d.token_to_piece(tid, self._special, 1 if self._remove_space else 0)
        self._remove_space = False
        return p

    def _push(self, piece: bytes) -> None:
        if not self._clean:
            self._out += piece
            return
        self._raw += piece
        raw = self._raw
        # last split point p with raw[p-2], raw[p-1], raw[p] all outside " '": cleaning
        # before p cannot depend on what comes after
        p = len(raw) - 1
        while p >= 2 and (raw[p] in _UNSAFE or raw[p - 1] in _UNSAFE or raw[p - 2] in _UNSAFE):
            p -= 1
        if p >= 2:
            self._out += clean_spaces(bytes(raw[:p]))
            del raw[:p]

    def _emit(self, final: bool) -> str:
        out = self._out
        cut = len(out) if final else complete_utf8_prefix(bytes(out[-4:])) + max(0, len(out) - 4)
        text = bytes(out[:cut]).decode("utf-8", "replace")
        del out[:cut]
        return text

    def flush(self) -> str:
        """Everything still held back (an incomplete character becomes U+FFFD)."""
        if self._clean and self._raw:
            self._out += clean_spaces(bytes(self._raw))
            self._raw.clear()
        return self._emit(final=True)
