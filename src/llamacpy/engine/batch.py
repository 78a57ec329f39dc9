"""Batches of tokens, as ``llama_batch``: each token has a position, a set of sequence ids and
a flag asking for its logits. A batch is checked against the context before anything runs
and is split into ubatches of at most ``n_ubatch`` tokens, in order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import UsageError


class BatchError(UsageError):
    """A batch cannot be decoded as given (bad token, position, sequence or size)."""


class Batch:
    """Tokens to decode: ``token[i]`` at ``pos[i]`` in the sequences ``seq_ids(i)``; logits are
    returned for the tokens with ``logits[i]`` set, in batch order.

    Build one with :meth:`from_tokens` (one sequence) or :meth:`add` (token by token, like
    ``llama_batch_add``). Arrays: ``token``, ``pos`` (int32), ``logits`` (bool), ``seq_id``
    (int32 ``[n, k]``, padded with -1: a token may belong to several sequences).
    """

    def __init__(self, token=(), pos=(), seq_id=None, logits=None) -> None:
        self.token = np.asarray(token, np.int32).reshape(-1)
        n = len(self.token)
        self.pos = np.asarray(pos, np.int32).reshape(-1)
        if seq_id is None:
            seq_id = np.zeros((n, 1), np.int32)
        seq_id = np.asarray(seq_id, np.int32)
        self.seq_id = seq_id.reshape(n, -1) if seq_id.ndim < 2 else seq_id
        self.logits = (np.zeros(n, bool) if logits is None else np.asarray(logits, bool)).reshape(
            -1
        )
        self._pending: list[tuple[int, int, tuple[int, ...], bool]] = []

    @classmethod
    def from_tokens(
        cls, tokens: Sequence[int], pos0: int = 0, seq_id: int = 0, logits: str = "last"
    ) -> Batch:
        """One sequence's consecutive tokens; ``logits``: ``"last"``, ``"all"`` or ``"none"``."""
        if logits not in ("last", "all", "none"):
            raise BatchError(f"logits must be 'last', 'all' or 'none', not {logits!r}")
        tok = np.asarray(tokens, np.int64)
        n = len(tok)
        if tok.size and (tok.min() < -(2**31) or tok.max() >= 2**31):
            raise BatchError("token ids must fit in 32 bits")
        want = np.full(n, logits == "all")
        if logits == "last" and n:
            want[-1] = True
        return cls(tok, np.arange(pos0, pos0 + n), np.full((n, 1), seq_id), want)

    def add(
        self, token: int, pos: int, seq_ids: int | Iterable[int] = 0, logits: bool = False
    ) -> Batch:
        """Append one token (``llama_batch_add``)."""
        ids = (seq_ids,) if isinstance(seq_ids, int | np.integer) else tuple(seq_ids)
        self._pending.append((int(token), int(pos), tuple(int(s) for s in ids), bool(logits)))
        return self

    def _flush(self) -> None:
        if not self._pending:
            return
        p, self._pending = self._pending, []
        k = max(self.seq_id.shape[1] if len(self.token) else 1, max(len(x[2]) for x in p), 1)
        sid = np.full((len(self.token) + len(p), k), -1, np.int32)
        sid[: len(self.token), : self.seq_id.shape[1]] = self.seq_id
        for i, x in enumerate(p):
            if x[2]:
                sid[len(self.token) + i, : len(x[2])] = x[2]
        self.token = np.concatenate(
            [self.token, np.array([x[0] for x in p], np.int64).astype(np.int32)]
        )
        self.pos = np.concatenate(
            [self.pos, np.array([x[1] for x in p], np.int64).astype(np.int32)]
        )
        self.logits = np.concatenate([self.logits, np.array([x[3] for x in p], bool)])
        self.seq_id = sid

    def arrays(self) -> Batch:
        """Apply pending :meth:`add` calls (done by the context before decoding)."""
        self._flush()
        return self

    def seq_ids(self, i: int) -> tuple[int, ...]:
        self._flush()
        return tuple(int(s) for s in self.seq_id[i] if s >= 0)

    def __len__(self) -> int:
        return len(self.token) + len(self._pending)

    @property
    def n_outputs(self) -> int:
        self._flush()
        return int(self.logits.sum())


@dataclass
class UBatch:
    """A contiguous slice of a checked batch, as arrays."""

    token: np.ndarray  # int32 [n]
    pos: np.ndarray  # int32 [n]
    seq_id: np.ndarray  # int32 [n, k], -1 padded
    out_idx: np.ndarray  # int32 [n_out], tokens of this ubatch whose logits are wanted
    # split_equal: the batch index of each token and the tokens per sequence (the size of
    # ggml's attention rows: llama.cpp's kernel choice reads it)
    src: np.ndarray | None = None
    n_seq_tokens: int = 0

    @property
    def primary_seq(self) -> np.ndarray:
        """The first sequence id of each token (the one the attention mask uses, as ggml)."""
        return self.seq_id[:, 0]

    def __len__(self) -> int:
        return len(self.token)


def distinct(a: np.ndarray) -> np.ndarray:
    """The sorted distinct values of ``a`` (flattened): ``np.unique`` without its first
    call's cost (numpy 2.4 imports ``numpy.ma`` and more on it: ~27 ms of a start)."""
    s = np.sort(a, axis=None)
    if len(s) < 2:
        return s
    keep = np.empty(len(s), np.bool_)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


def _fail(msg: str) -> None:
    raise BatchError(msg)


def check_batch(
    batch: Batch, *, n_vocab: int, n_batch: int, n_ctx: int, n_seq_max: int, seq_pos_max
) -> None:
    """Raise :class:`BatchError` naming the first problem; ``seq_pos_max(s)`` gives sequence
    ``s``'s last position in the cache (-1: none)."""
    batch.arrays()
    n = len(batch)
    if not (len(batch.pos) == len(batch.seq_id) == len(batch.logits) == n):
        _fail("batch fields token/pos/seq_id/logits have different lengths")
    if n == 0:
        _fail("the batch is empty")
    if n > n_batch:
        _fail(
            f"the batch has {n} tokens, more than n_batch = {n_batch}; split it or create "
            "the context with a larger n_batch"
        )
    tok, pos, sid = batch.token, batch.pos, batch.seq_id
    if tok.min() < 0 or tok.max() >= n_vocab:
        i = int(np.nonzero((tok < 0) | (tok >= n_vocab))[0][0])
        _fail(f"token[{i}] = {tok[i]} is not in the vocabulary (0..{n_vocab - 1})")
    if pos.min() < 0 or pos.max() >= n_ctx:
        i = int(np.nonzero((pos < 0) | (pos >= n_ctx))[0][0])
        _fail(
            f"pos[{i}] = {pos[i]} is outside the context (0..{n_ctx - 1}); create the "
            "context with a larger n_ctx or remove tokens from the sequence"
        )
    if (sid[:, 0] < 0).any():
        _fail(f"token {int(np.nonzero(sid[:, 0] < 0)[0][0])} belongs to no sequence")
    if sid.max() >= n_seq_max or (sid < -1).any():
        i, j = (int(v[0]) for v in np.nonzero((sid >= n_seq_max) | (sid < -1)))
        _fail(
            f"seq_id {sid[i, j]} of token {i} is out of range (0..{n_seq_max - 1}); "
            "create the context with a larger n_seq_max"
        )
    if sid.shape[1] == 1:
        seqs = distinct(sid[:, 0]) if n > 1 else sid[:, 0]
        groups = [
            (int(s), np.nonzero(sid[:, 0] == s)[0] if n > 1 else np.zeros(1, int)) for s in seqs
        ]
    else:
        groups = []
        for s in distinct(sid[sid >= 0]):
            rows = np.nonzero((sid == s).any(axis=1))[0]
            groups.append((int(s), rows))
        for i in range(n):
            ids = sid[i][sid[i] >= 0]
            if len(distinct(ids)) != len(ids):
                _fail(f"token {i} lists a sequence id twice: {tuple(int(x) for x in ids)}")
    for s, rows in groups:
        p = pos[rows]
        if len(p) > 1 and (np.diff(p) != 1).any():
            j = int(np.nonzero(np.diff(p) != 1)[0][0])
            _fail(
                f"positions of sequence {s} are not consecutive in the batch: token "
                f"{int(rows[j + 1])} has pos {int(p[j + 1])} after pos {int(p[j])}"
            )
        expected = seq_pos_max(s) + 1
        if int(p[0]) != expected:
            _fail(
                f"sequence {s} continues at pos {int(p[0])}, but the cache holds it up to "
                f"pos {expected - 1}: positions must stay consecutive (next pos {expected})"
            )


def split_equal(batch: Batch, n_ubatch: int) -> list[UBatch]:
    """llama.cpp's ``split_equal`` (sequential), what it uses for a batch of several
    sequences when each sequence has its own cache stream (its default): each ubatch takes
    a run of consecutive sequence ids, the next unused token of each in turn while all
    have one and the ubatch has room, its tokens grouped by sequence. For tokens of one
    sequence each (several: :func:`split_batch`)."""
    batch.arrays()
    n = len(batch)
    seq = batch.seq_id[:, 0]
    if batch.seq_id.shape[1] > 1 and np.any(batch.seq_id[:, 1:] >= 0):
        return split_batch(batch, n_ubatch)
    used = np.zeros(n, np.bool_)
    order = np.argsort(seq, kind="stable")  # each sequence's tokens in batch order
    starts = np.searchsorted(seq[order], distinct(seq))
    by_seq = {int(seq[order[a]]): order[a:b] for a, b in zip(starts, [*starts[1:], n], strict=True)}
    taken = dict.fromkeys(by_seq, 0)
    out = []
    while not used.all():
        cur: list[int] = []
        for i in np.nonzero(~used)[0]:
            s = int(seq[i])
            if (not cur or s == cur[-1] + 1) and s not in cur:
                cur.append(s)
                if len(cur) >= n_ubatch:
                    break
        k = 0
        while all(taken[s] + k < len(by_seq[s]) for s in cur):
            k += 1
            if (k + 1) * len(cur) > n_ubatch:
                break
        idx = np.concatenate([by_seq[s][taken[s] : taken[s] + k] for s in cur])
        for s in cur:
            taken[s] += k
        used[idx] = True
        out.append(
            UBatch(
                token=batch.token[idx],
                pos=batch.pos[idx],
                seq_id=batch.seq_id[idx],
                out_idx=np.nonzero(batch.logits[idx])[0].astype(np.int32),
                src=idx,
                n_seq_tokens=k,
            )
        )
    return out


def split_batch(batch: Batch, n_ubatch: int) -> list[UBatch]:
    """Consecutive ubatches of at most ``n_ubatch`` tokens."""
    batch.arrays()
    out = []
    n = len(batch)
    for a in range(0, n, n_ubatch):
        b = min(a + n_ubatch, n)
        out.append(
            UBatch(
                token=batch.token[a:b],
                pos=batch.pos[a:b],
                seq_id=batch.seq_id[a:b],
                out_idx=np.nonzero(batch.logits[a:b])[0].astype(np.int32),
            )
        )
    return out
