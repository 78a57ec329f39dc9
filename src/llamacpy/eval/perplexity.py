"""Perplexity as ``llama-perplexity`` computes it.

The text is tokenized once (BOS per the vocabulary, special tokens not parsed) and cut into
non-overlapping chunks of ``n_ctx`` tokens; the first token of each chunk is replaced by BOS
(when the vocabulary adds one) and only the second half of each chunk is scored: the
negative log-likelihood of token ``i + 1`` given the logits at ``i``, for
``i = n_ctx/2 .. n_ctx-2``. With ``n_batch >= 2 * n_ctx`` several chunks run side by side as
separate sequences. The estimate is ``exp(mean nll)`` with llama.cpp's ``+/-``:
``ppl * sqrt((mean(nll^2) - mean(nll)^2) / (count - 1))``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import numpy as np

from ..engine import Batch
from ..errors import UsageError
from .logits_file import LogitsWriter


@dataclass
class PerplexityResult:
    ppl: float
    ppl_err: float  # llama.cpp's "+/-" (uncertainty of the estimate)
    n_ctx: int
    n_chunks: int
    count: int  # scored tokens
    running: list[float] = field(default_factory=list)  # estimate after each chunk
    seconds_per_pass: float = 0.0


def chunk_nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """``-log softmax(logits[i])[targets[i]]`` per row, as llama.cpp's ``log_softmax``
    (float32 max and exponentials, double sum)."""
    logits = np.asarray(logits, np.float32)
    mx = logits.max(axis=1, keepdims=True)
    sum_exp = np.exp(logits - mx).sum(axis=1, dtype=np.float64)
    picked = logits[np.arange(len(targets)), targets].astype(np.float64)
    return -(picked - mx[:, 0].astype(np.float64) - np.log(sum_exp))


@dataclass
class NllTally:
    """Running sums of the scored tokens' negative log-likelihoods: the running estimate
    ``exp(mean)`` and llama.cpp's ``+/-``, ``ppl * sqrt((mean(nll^2) - mean^2) / (n - 1))``."""

    nll: float = 0.0
    nll2: float = 0.0
    count: int = 0

    def add(self, v: np.ndarray) -> float:
        """Add a chunk's values; returns the running estimate."""
        v = np.asarray(v, np.float64)
        self.nll += float(v.sum())
        self.nll2 += float((v * v).sum())
        self.count += len(v)
        return math.exp(self.nll / self.count)

    def estimate(self) -> tuple[float, float]:
        """(perplexity, its ``+/-``; nan when it cannot be computed)."""
        mean, mean2 = self.nll / self.count, self.nll2 / self.count
        ppl = math.exp(mean)
        var = mean2 - mean * mean
        ok = var > 0 and self.count > 1
        return ppl, math.sqrt(var / (self.count - 1)) * ppl if ok else float("nan")


def n_seq_for(n_ctx: int, n_batch: int) -> int:
    """Chunks evaluated together (llama-perplexity's ``n_parallel``)."""
    return max(1, n_batch // n_ctx)


def chunk_batch(ctx: Any, n_ctx: int, n_batch: int) -> int:
    """The tokens per decode for chunks of ``n_ctx`` (at most the context's ``n_batch``),
    checked as llama.cpp's tools check them."""
    n_batch = min(n_batch, ctx.n_batch)
    if not (n_batch < n_ctx or n_batch % n_ctx == 0):
        raise UsageError(
            f"n_batch ({n_batch}) must be smaller than n_ctx ({n_ctx}) or a multiple of it"
        )
    return n_batch


def chunk_count(n_tokens: int, n_ctx: int, n_chunks: int) -> int:
    """Whole chunks of ``n_ctx`` in ``n_tokens``, at most ``n_chunks`` (< 0: all)."""
    n_chunk_max = n_tokens // n_ctx
    n_chunk = n_chunk_max if n_chunks < 0 else min(n_chunks, n_chunk_max)
    if n_chunk == 0:
        raise UsageError("--chunks 0: nothing to evaluate")
    return n_chunk


class FirstPass:
    """An ``on_first_pass`` callback that keeps the pass's seconds and passes the call on."""

    def __init__(self, then: Callable[[float, int, int], None] | None) -> None:
        self.seconds = 0.0
        self.then = then

    def __call__(self, seconds: float, n_chunk: int, n_seq: int) -> None:
        self.seconds = seconds
        if self.then is not None:
            self.then(seconds, n_chunk, n_seq)


def eval_chunks(
    ctx: Any,
    tokens: np.ndarray,
    *,
    n_ctx: int,
    n_batch: int,
    n_seq: int,
    n_chunk: int,
    bos: int | None,
    on_first_pass: Callable[[float, int, int], None] | None = None,
    outputs: str = "scored",
) -> Iterator[tuple[int, np.ndarray]]:
    """llama-perplexity's evaluation loop: chunks of ``n_ctx`` tokens, ``n_seq`` side by
    side as separate sequences, ``n_batch`` tokens of each per decode, the first token of
    each chunk replaced by ``bos`` (when not None). Yields ``(chunk, logits)`` with the
    logits of positions ``n_ctx/2 .. n_ctx-2`` (the rows that predict the scored tokens).
    ``outputs``: the tokens whose logits are computed: ``"scored"`` those only (as
    llama-perplexity), ``"all"`` every token (as llama-imatrix)."""
    if outputs not in ("scored", "all"):
        raise ValueError(f"outputs must be 'scored' or 'all', not {outputs!r}")
    every = outputs == "all"
    first = n_ctx // 2
    num_batches = (n_ctx + n_batch - 1) // n_batch
    for i in range(0, n_chunk, n_seq):
        start = i * n_ctx
        n_seq_batch = min(n_seq, n_chunk - i)
        t0 = time.perf_counter()
        ctx.clear()
        rows: list[list[np.ndarray]] = [[] for _ in range(n_seq_batch)]
        for j in range(num_batches):
            batch_start = start + j * n_batch
            batch_size = min(start + n_ctx - batch_start, n_batch)
            batch = Batch()
            for seq in range(n_seq_batch):
                seq_start = batch_start + seq * n_ctx
                for k in range(batch_size):
                    tok = tokens[seq_start + k]
                    if bos is not None and j == 0 and k == 0:
                        tok = bos
                    pos = j * n_batch + k
                    batch.add(int(tok), pos, seq, every or pos >= first)
            out = ctx.decode(batch, equal_split=True)  # (ubatches as llama.cpp's)
            # outputs come in batch order: sequence by sequence
            per_seq = batch.n_outputs // n_seq_batch
            for seq in range(n_seq_batch):
                if per_seq:
                    rows[seq].append(out[seq * per_seq : (seq + 1) * per_seq])
        if i == 0 and on_first_pass is not None:
            on_first_pass(time.perf_counter() - t0, n_chunk, n_seq)
        for seq in range(n_seq_batch):
            got = rows[seq][0] if len(rows[seq]) == 1 else np.concatenate(rows[seq])
            yield i + seq, got[first : n_ctx - 1] if every else got[: n_ctx - 1 - first]


def perplexity(
    ctx: Any,
    tokenizer: Any,
    text: str | bytes,
    *,
    n_ctx: int,
    n_batch: int,
    n_chunks: int = -1,
    on_chunk: Callable[[int, float], None] | None = None,
    on_first_pass: Callable[[float, int, int], None] | None = None,
    logits_out: BinaryIO | None = None,
) -> PerplexityResult:
    """Run llama-perplexity's method on ``text`` with an engine context whose sequences
    hold ``n_ctx`` tokens each (``ctx.n_ctx >= n_seq * n_ctx``, ``ctx.n_seq_max >= n_seq``).

    ``on_chunk(i, running_ppl)`` is called after each chunk (1-based ``i``);
    ``on_first_pass(seconds, n_chunk, n_seq)`` after the first pass. With ``logits_out``
    the log-probabilities are written to it in llama-perplexity's ``--kl-divergence-base``
    format (``eval/logits_file.py``), and the scores are the writer's float32 ones.
    """
    if n_ctx <= 0 or n_ctx % 2:
        raise UsageError(f"perplexity needs a positive, even context size, not {n_ctx}")
    n_batch = chunk_batch(ctx, n_ctx, n_batch)
    n_seq = n_seq_for(n_ctx, n_batch)
    tokens = np.asarray(tokenizer.encode(text, add_special=True, parse_special=False), np.int64)
    if len(tokens) < 2 * n_ctx:
        raise UsageError(
            f"you need at least {2 * n_ctx} tokens to evaluate perplexity with a context of "
            f"{n_ctx}; the text tokenizes to only {len(tokens)} tokens"
        )
    n_chunk = chunk_count(len(tokens), n_ctx, n_chunks)
    writer = None if logits_out is None else LogitsWriter(logits_out, n_ctx, n_chunk, tokens)
    first = n_ctx // 2
    tally = NllTally()
    running: list[float] = []
    first_pass = FirstPass(on_first_pass)

    bos = tokenizer.bos if tokenizer.add_bos else None
    for c, logits in eval_chunks(ctx, tokens, n_ctx=n_ctx, n_batch=n_batch, n_seq=n_seq,
                                 n_chunk=n_chunk, bos=bos, on_first_pass=first_pass):  # fmt: skip
        base = c * n_ctx + first
        targets = tokens[base + 1 : base + n_ctx - first]
        v = chunk_nll(logits, targets) if writer is None else writer.chunk(logits, targets)
        running.append(tally.add(v))
        if on_chunk is not None:
            on_chunk(c + 1, running[-1])
    ppl, err = tally.estimate()
    return PerplexityResult(ppl, err, n_ctx, n_chunk, tally.count, running, first_pass.seconds)
