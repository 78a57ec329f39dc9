"""llama-perplexity's log-probabilities file (``--kl-divergence-base``).

Layout (little-endian, no padding between fields):

* ``_logits_`` (8 bytes), ``n_ctx`` (uint32), ``n_vocab`` (int32), ``n_chunk`` (int32);
* the evaluated text's tokens, ``n_chunk * n_ctx`` int32 (as tokenized: the first is BOS
  when the vocabulary adds one; chunks are not BOS-substituted here);
* per chunk, one row per scored position (``n_ctx - 1 - n_ctx/2`` rows) of
  ``nv = 2 * ((n_vocab + 1) / 2) + 4`` uint16: the row's ``scale`` and ``min_log_prob`` as
  two float32, then every token's log-probability quantized to 16 bits,
  ``round((logit - min_logit) / scale)`` with ``min_logit = max(min(logits), max - 16)``
  and ``scale = (max - min_logit) / 65535`` (0 for logits at or below ``min_logit``), so
  ``log p = scale * q + min_log_prob``; a zero pad when ``n_vocab`` is odd.

Arithmetic is float32 as llama.cpp's (the log of the double sum of ``expf`` cast to
float), which makes a file written from the same logits byte-identical to its.
"""

from __future__ import annotations

import mmap
import os
import struct
from typing import BinaryIO

import numpy as np

from ..errors import LogitsFileError

MAGIC = b"_logits_"
HEADER_BYTES = 20  # magic, n_ctx, n_vocab, n_chunk
F32 = np.float32


def row_width(n_vocab: int) -> int:
    """uint16 per stored row: two float32 and ``n_vocab`` values padded to an even count."""
    return 2 * ((n_vocab + 1) // 2) + 4


def scored_rows(n_ctx: int) -> int:
    """Positions scored per chunk (the second half, less the last)."""
    return n_ctx - 1 - n_ctx // 2


def expf(x: np.ndarray) -> np.ndarray:
    """float32 ``exp`` rounded from double, as a correctly rounded ``expf``."""
    return np.exp(np.asarray(x, np.float64)).astype(F32)


def log_sum_exp(logits: np.ndarray, mx: np.ndarray) -> np.ndarray:
    """Per row ``(float) log(sum_double(expf(logit - max)))``."""
    return np.log(expf(logits - mx[:, None]).sum(axis=1, dtype=np.float64)).astype(F32)


def compress_rows(logits: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The stored rows ``[n, row_width]`` uint16 of ``logits [n, n_vocab]`` and each row's
    negative log-likelihood of its target (float32 arithmetic, as the writer's)."""
    logits = np.asarray(logits, F32)
    n, n_vocab = logits.shape
    rows = np.zeros((n, row_width(n_vocab)), np.uint16)
    mx = logits.max(axis=1)
    mn = np.maximum(logits.min(axis=1), mx - F32(16))
    lse = log_sum_exp(logits, mx)
    head = np.empty((n, 2), F32)
    head[:, 0] = (mx - mn) / F32(65535)
    head[:, 1] = (mn - mx) - lse
    rows[:, :4] = head.view(np.uint16)
    scale = head[:, :1]
    inv = np.divide(F32(1), scale, out=np.zeros_like(scale), where=scale != 0)
    q = np.rint(inv * (logits - mn[:, None])).astype(np.int64) & 0xFFFF
    q[(logits <= mn[:, None]) | (scale == 0)] = 0
    rows[:, 4 : 4 + n_vocab] = q
    nll = (mx + lse) - logits[np.arange(n), targets]
    return rows, nll


class LogitsWriter:
    """Writes the file to ``f`` as chunks come: the header with the first chunk (its width
    is the vocabulary), then each chunk's rows."""

    def __init__(self, f: BinaryIO, n_ctx: int, n_chunk: int, tokens: np.ndarray) -> None:
        self.f, self.n_ctx, self.n_chunk = f, n_ctx, n_chunk
        self.tokens = np.asarray(tokens[: n_chunk * n_ctx], "<i4")
        self.started = False

    def chunk(self, logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
        """Store one chunk's scored rows; returns their negative log-likelihoods."""
        if not self.started:
            self.f.write(MAGIC + struct.pack("<Iii", self.n_ctx, logits.shape[1], self.n_chunk))
            self.f.write(self.tokens.tobytes())
            self.started = True
        rows, nll = compress_rows(logits, targets)
        self.f.write(rows.astype("<u2").tobytes())
        return nll


class LogitsFile:
    """A log-probabilities file, checked whole before anything is computed: the header, the
    size its counts imply against the file's (before anything is allocated), the tokens
    against the vocabulary and every row's scale and minimum. Data are read through a
    read-only mapping."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = str(path)
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        except OSError as e:
            raise LogitsFileError(f"cannot read: {e.strerror}", path=self.path, field="file",
                                  offset=0) from e  # fmt: skip
        self.size = size
        buf = self._map
        if size < 8 or buf[:8] != MAGIC:
            raise self.error(f"not a log-probabilities file: magic {bytes(buf[:8])!r}, "
                             f"expected {MAGIC!r}", "magic", 0)  # fmt: skip
        if size < HEADER_BYTES:
            raise self.error(f"truncated header ({size} bytes, {HEADER_BYTES} needed)",
                             ("n_ctx", "n_vocab", "n_chunk")[max(0, size - 8) // 4], size)  # fmt: skip
        self.n_ctx, self.n_vocab, self.n_chunk = struct.unpack_from("<Iii", buf, 8)
        if self.n_ctx < 3:
            raise self.error(f"n_ctx {self.n_ctx} scores no token (at least 3)", "n_ctx", 8)
        if self.n_vocab <= 0:
            raise self.error(f"n_vocab {self.n_vocab} is not positive", "n_vocab", 12)
        if self.n_chunk <= 0:
            raise self.error(f"n_chunk {self.n_chunk} is not positive", "n_chunk", 16)
        self.rows = scored_rows(self.n_ctx)
        self.nv = row_width(self.n_vocab)
        n_tok = self.n_chunk * self.n_ctx
        self.data_offset = HEADER_BYTES + 4 * n_tok
        self.chunk_bytes = 2 * self.rows * self.nv
        expected = self.data_offset + self.n_chunk * self.chunk_bytes
        if size != expected:
            what = (f"{self.n_chunk} chunks of {self.n_ctx} tokens with {self.n_vocab} "
                    f"log-probabilities need {expected} bytes, the file has {size}")  # fmt: skip
            if size > expected:
                raise self.error(what, "end of the last chunk", expected)
            raise self.error(what, self._field_at(size), size)
        self.tokens = np.frombuffer(buf, "<i4", n_tok, HEADER_BYTES)
        bad = np.flatnonzero((self.tokens < 0) | (self.tokens >= self.n_vocab))
        if len(bad):
            raise self.error(f"token {int(self.tokens[bad[0]])} is outside the vocabulary of "
                             f"{self.n_vocab}", f"tokens[{bad[0]}]", HEADER_BYTES + 4 * int(bad[0]))  # fmt: skip
        data = np.frombuffer(buf, "<u2", self.n_chunk * self.rows * self.nv, self.data_offset)
        self._data = data.reshape(self.n_chunk * self.rows, self.nv)
        head = np.ascontiguousarray(self._data[:, :4]).view("<f4")  # scale, min_log_prob
        bad = np.flatnonzero(~np.isfinite(head).all(axis=1) | (head[:, 0] < 0))
        if len(bad):
            r = int(bad[0])
            raise self.error(f"row {r % self.rows} of chunk {r // self.rows} has scale "
                             f"{head[r, 0]} and minimum {head[r, 1]}",
                             f"log-probs of chunk {r // self.rows}", self._row_offset(r))  # fmt: skip

    def error(self, message: str, field: str, offset: int) -> LogitsFileError:
        return LogitsFileError(message, path=self.path, field=field, offset=offset)

    def _row_offset(self, row: int) -> int:
        return self.data_offset + 2 * self.nv * row

    def _field_at(self, offset: int) -> str:
        if offset < self.data_offset:
            return f"tokens[{(offset - HEADER_BYTES) // 4}]"
        return f"log-probs of chunk {(offset - self.data_offset) // self.chunk_bytes}"

    def check_vocab(self, n_vocab: int) -> None:
        if self.n_vocab != n_vocab:
            raise self.error(f"computed with a vocabulary of {self.n_vocab} tokens, the model "
                             f"has {n_vocab}", "n_vocab", 12)  # fmt: skip

    def chunk(self, i: int) -> np.ndarray:
        """Chunk ``i``'s stored rows ``[rows, nv]`` uint16 (a view of the mapping)."""
        return self._data[i * self.rows : (i + 1) * self.rows]
