"""The completion loop shared by the ``Llama`` facade and the CLI (and later the server).

A :class:`Session` owns one sequence (``seq_id`` 0) of an engine context and remembers which
tokens its KV cache holds, so that consecutive requests decode only what differs from the
cached prefix. :meth:`Session.generate` runs llama.cpp's per-token loop::

    logits -> logits processors -> sampler chain -> stopping criteria -> EOG / stop strings
           -> max tokens / full context (or context shift) -> decode the token -> ...

and yields one :class:`Step` per generated token; the :class:`Generation` object it returns
holds the finish reason, the completion tokens and text once iteration ends.

Text is the concatenation of each token's piece (``token_to_piece``, as llama-completion and
llama-cpp-python print it), released only as complete UTF-8 and never while it could still be
the beginning of a stop string.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ..engine import Batch
from ..engine.scheduler import CHECKPOINT_BACK, add_checkpoint, latest_checkpoint
from ..errors import LlamacpyError, UsageError

# (input_ids int32 [n], logits float32 [n_vocab]) -> new logits
LogitsProcessor = Callable[[np.ndarray, np.ndarray], np.ndarray]
# (input_ids int32 [n], logits float32 [n_vocab]) -> stop now
StoppingCriterion = Callable[[np.ndarray, np.ndarray], bool]


class ContextOverflowError(UsageError, ValueError):
    """A prompt does not fit in the context (also a ``ValueError``, as in llama-cpp-python)."""


class NotSupportedError(LlamacpyError, NotImplementedError):
    """A feature the engine does not offer yet."""


class Sampler(Protocol):
    def sample(self, logits: np.ndarray) -> int: ...

    def accept(self, token: int) -> None: ...


class TokenText(Protocol):
    """What the loop needs of a tokenizer."""

    def token_to_piece(self, tid: int, special: bool = True) -> bytes: ...

    def is_eog(self, tid: int) -> bool: ...


@dataclass
class Timings:
    """llama.cpp's perf counters (seconds); ``n_p_eval`` counts tokens decoded in batches of
    more than one token, ``n_eval`` single-token decodes."""

    t_load: float = 0.0
    t_start: float = field(default_factory=time.perf_counter)
    t_p_eval: float = 0.0
    n_p_eval: int = 0
    t_eval: float = 0.0
    n_eval: int = 0
    t_sample: float = 0.0
    n_sample: int = 0
    n_drafted: int = 0  # speculative decoding: proposed tokens, accepted ones
    n_accepted: int = 0

    def reset(self) -> None:
        """Start counting again (the load time is kept)."""
        load = self.t_load
        self.__dict__.update(vars(Timings()))
        self.t_load = load

    def report(self, prefix: str = "common_perf_print") -> str:
        """llama.cpp's perf lines (sampling, load, prompt eval, eval, total)."""

        def div(a: float, b: float) -> float:
            return a / b if b else float("nan")

        ms_s, ms_p, ms_e = 1e3 * self.t_sample, 1e3 * self.t_p_eval, 1e3 * self.t_eval
        total = 1e3 * (time.perf_counter() - self.t_start)
        spec = []
        if self.n_drafted:
            spec = [
                f"{prefix}:   draft acceptance = {div(self.n_accepted, self.n_drafted):10.5f} "
                f"({self.n_accepted:5d} accepted / {self.n_drafted:5d} generated)"
            ]
        return "\n".join(
            [
                f"{prefix}:    sampling time = {ms_s:10.2f} ms / {self.n_sample:5d} runs   "
                f"({div(ms_s, self.n_sample):8.2f} ms per token, "
                f"{div(1e3 * self.n_sample, ms_s):8.2f} tokens per second)",
                f"{prefix}:        load time = {1e3 * self.t_load:10.2f} ms",
                f"{prefix}: prompt eval time = {ms_p:10.2f} ms / {self.n_p_eval:5d} tokens "
                f"({div(ms_p, self.n_p_eval):8.2f} ms per token, "
                f"{div(1e3 * self.n_p_eval, ms_p):8.2f} tokens per second)",
                f"{prefix}:        eval time = {ms_e:10.2f} ms / {self.n_eval:5d} runs   "
                f"({div(ms_e, self.n_eval):8.2f} ms per token, "
                f"{div(1e3 * self.n_eval, ms_e):8.2f} tokens per second)",
                f"{prefix}:       total time = {total:10.2f} ms / "
                f"{self.n_p_eval + self.n_eval:5d} tokens",
                *spec,
            ]
        )


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def warm_up(ctx: Any, tok: Any) -> None:
    """llama.cpp's warm-up run: a two-token decode and a one-token decode (so the kernels of
    both paths are loaded), then an empty cache; the first prompt's timing is then the
    prompt's alone."""
    first = tok.bos if tok.bos >= 0 else 0
    last = tok.eos if tok.eos >= 0 else first
    ctx.decode(Batch.from_tokens([first, last]))
    ctx.decode(Batch().add(first, 2, 0, True))
    ctx.clear()


class Utf8Text:
    """Bytes in, text out: releases only complete UTF-8 characters (invalid bytes -> U+FFFD)."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> str:
        self._buf += data
        buf = self._buf
        cut = len(buf)
        # an incomplete multi-byte character at the end waits for its continuation bytes
        for back in range(1, min(4, len(buf)) + 1):
            c = buf[-back]
            if c & 0xC0 == 0x80:
                continue
            need = (
                2 if c & 0xE0 == 0xC0 else 3 if c & 0xF0 == 0xE0 else 4 if c & 0xF8 == 0xF0 else 1
            )
            if need > back:
                cut = len(buf) - back
            break
        text = bytes(buf[:cut]).decode("utf-8", "replace")
        del buf[:cut]
        return text

    @property
    def pending(self) -> bool:
        """Bytes of an unfinished character are waiting."""
        return bool(self._buf)

    def flush(self) -> str:
        text = bytes(self._buf).decode("utf-8", "replace")
        self._buf.clear()
        return text


class StopMatcher:
    """Finds stop strings in streamed text; holds back a tail that may start one."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self.pending = ""
        self.matched: str | None = None

    def feed(self, text: str) -> str:
        """Text that is now safe to release; sets :attr:`matched` when a stop string occurs
        (what precedes it is released, the rest is dropped)."""
        self.pending += text
        if not self.stops:
            out, self.pending = self.pending, ""
            return out
        hits = [(i, s) for s in self.stops if (i := self.pending.find(s)) >= 0]
        if hits:
            i, s = min(hits)
            self.matched = s
            out, self.pending = self.pending[:i], ""
            return out
        hold = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(self.pending)), hold, -1):
                if self.pending.endswith(s[:k]):
                    hold = k
                    break
        cut = len(self.pending) - hold
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


@dataclass
class Step:
    """One generated token: ``text`` is what this step releases (possibly ``""`` while held
    back, possibly text of earlier tokens); ``logits`` is the raw row the token was sampled
    from when the generation asked for them."""

    token: int | None  # None: trailing text released at the end, no token
    text: str
    logits: np.ndarray | None = None


@dataclass
class GenerationConfig:
    """Per-request settings of :meth:`Session.generate`.

    ``max_tokens < 0``: until end of generation or full context. ``stop_at_eog``: an EOG
    token ends the generation (it is not part of the completion). ``accept_prompt``: feed the
    prompt tokens to the sampler's ``accept`` first (llama-completion does, for penalties).
    ``context_shift``: when the context is full, drop half of the tokens after the first
    ``n_keep`` (llama.cpp's shift) instead of finishing with ``length``.
    """

    max_tokens: int = -1
    stop: Sequence[str] = ()
    stop_at_eog: bool = True
    logits_processors: Sequence[LogitsProcessor] = ()
    stopping_criteria: Sequence[StoppingCriterion] = ()
    keep_logits: bool = False
    prompt_logits: bool = False
    accept_prompt: bool = False
    context_shift: bool = False
    n_keep: int = 0
    special: bool = False
    # speculative decoding (api.speculative.Speculator; None: one token per decode)
    speculator: Any = None


class Session:
    """One sequence of an engine context plus the tokens its cache holds.

    ``ctx`` needs ``decode(Batch)``, ``seq_rm``, ``seq_add``, ``clear``, ``n_ctx``,
    ``n_batch`` and ``n_vocab`` (:class:`llamacpy.engine.Context` has them).
    ``keep_logits`` stores the logits of every decoded position (llama-cpp-python's
    ``logits_all``), so that prompt logprobs survive prefix reuse.
    """

    def __init__(self, ctx: Any, tokenizer: TokenText, *, keep_logits: bool = False) -> None:
        self.ctx = ctx
        self.tokenizer = tokenizer
        self.tokens: list[int] = []  # tokens in the cache, position i at index i
        self.last_logits: np.ndarray | None = None  # row after tokens[-1], when known
        self.keep_logits = keep_logits
        self._scores: np.ndarray | None = None  # float32 [n_ctx, n_vocab], lazily
        self.n_scored = 0  # positions 0..n_scored-1 have kept logits
        self.n_decoded = 0  # tokens decoded since creation (tests and stats)
        self.timings = Timings()
        # a memory whose state cannot be rewound (recurrent layers): copies of the state
        # taken CHECKPOINT_BACK tokens before the end of each prompt, (positions, snapshot)
        self.checkpoints: list[tuple[int, Any]] = []
        self._snapshots = bool(getattr(ctx, "can_snapshot", False))

    @property
    def n_ctx(self) -> int:
        return int(self.ctx.n_ctx)

    # ------------------------------------------------------------------ cache
    def reset(self) -> None:
        """Forget everything the cache holds."""
        self.ctx.clear()
        self.tokens = []
        self.last_logits = None
        self.n_scored = 0
        self.checkpoints = []

    def truncate(self, n: int) -> None:
        """Keep only the first ``n`` cached tokens (fewer when the cache can no longer
        continue from ``n``: a sliding-window cache past its window keeps none, a recurrent
        state goes back to its latest checkpoint at or before ``n``, else to none)."""
        if n < len(self.tokens):
            want, n = n, self.ctx.n_keep(0, n)
            snap = latest_checkpoint(self.checkpoints, want) if n < want else None
            if snap is not None:
                n = int(self.ctx.seq_restore(0, snap))
            else:
                self.ctx.seq_rm(0, n, -1)
            del self.tokens[n:]
            self.last_logits = None
        self.checkpoints = [c for c in self.checkpoints if c[0] <= n]
        self.n_scored = min(self.n_scored, n)

    def scores(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Stored logits of positions ``start:stop`` (row i predicts token i + 1)."""
        stop = self.n_scored if stop is None else stop
        if self._scores is None or stop > self.n_scored:
            raise UsageError("the logits of these positions were not kept")
        return self._scores[start:stop]

    def store_logits(self, pos0: int, rows: np.ndarray) -> None:
        if self._scores is None:
            self._scores = np.empty((self.n_ctx, self.ctx.n_vocab), np.float32)
        if pos0 != self.n_scored:
            return  # a gap: the earlier positions were decoded without logits
        self._scores[pos0 : pos0 + len(rows)] = rows
        self.n_scored = pos0 + len(rows)

    def decode(
        self, tokens: Sequence[int], *, all_logits: bool = False, verify: bool = False
    ) -> np.ndarray:
        """Append ``tokens`` to the sequence in ``n_batch`` chunks; returns the logits of the
        last token (``all_logits``: of every token, ``[len(tokens), n_vocab]``).
        ``verify``: a speculative verification batch, computed with single-token numerics
        (each row's logits as decoding the tokens one by one would give) and timed as
        generation."""
        tokens = [int(t) for t in tokens]
        if len(self.tokens) + len(tokens) > self.n_ctx:
            raise ContextOverflowError(
                f"cannot decode {len(tokens)} more tokens: the cache holds {len(self.tokens)} "
                f"of n_ctx = {self.n_ctx}"
            )
        want_all = all_logits or self.keep_logits
        rows: list[np.ndarray] = []
        last = None
        n_batch = int(self.ctx.n_batch)
        for a in range(0, len(tokens), n_batch):
            chunk = tokens[a : a + n_batch]
            pos0 = len(self.tokens)
            batch = Batch.from_tokens(chunk, pos0=pos0, logits="all" if want_all else "last")
            t0 = time.perf_counter()
            try:
                out = (
                    self.ctx.decode(batch, single_numerics=True)
                    if verify
                    else self.ctx.decode(batch)
                )
            except BaseException:
                # an interrupted or failed decode may leave some of the batch in the cache;
                # a recurrent state cannot give it back and is forgotten whole
                if not self.ctx.seq_rm(0, pos0, -1) or self.ctx.n_keep(0, pos0) < pos0:
                    self.reset()
                raise
            dt = time.perf_counter() - t0
            if len(chunk) > 1 and not verify:
                self.timings.t_p_eval += dt
                self.timings.n_p_eval += len(chunk)
            else:
                self.timings.t_eval += dt
                self.timings.n_eval += len(chunk)
            self.tokens.extend(chunk)
            self.n_decoded += len(chunk)
            if want_all:
                if self.keep_logits:
                    self.store_logits(pos0, out)
                if all_logits:
                    rows.append(np.array(out, np.float32))
            last = out[-1]
        self.last_logits = np.array(last, np.float32) if last is not None else self.last_logits
        if all_logits:
            return np.concatenate(rows) if rows else np.empty((0, self.ctx.n_vocab), np.float32)
        assert self.last_logits is not None
        return self.last_logits

    def ingest(self, prompt: Sequence[int], *, prompt_logits: bool = False) -> np.ndarray | None:
        """Make the cache hold exactly ``prompt``, reusing the cached common prefix.

        Returns the prompt's logits ``[len(prompt), n_vocab]`` when ``prompt_logits`` (all
        rows decoded again unless they were kept), else None; :attr:`last_logits` is then
        the row to sample the next token from.
        """
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise UsageError("the prompt is empty: there is nothing to continue from")
        if len(prompt) > self.n_ctx:
            raise ContextOverflowError(
                f"the prompt has {len(prompt)} tokens but the context holds only "
                f"n_ctx = {self.n_ctx}; shorten the prompt or use a larger context"
            )
        n = common_prefix(self.tokens, prompt)
        if prompt_logits and not self.keep_logits:
            self.truncate(0)  # the cached prefix has no logits: decode all of it again
            return self.decode(prompt, all_logits=True)
        if prompt_logits:
            n = min(n, self.n_scored)
        if not (n == len(prompt) == len(self.tokens) and self.last_logits is not None):
            if n == len(prompt):
                n -= 1  # decode the last prompt token again to get its logits
            self.truncate(n)  # may keep fewer (a sliding-window cache past its window)
            at = len(prompt) - CHECKPOINT_BACK
            if self._snapshots and at > len(self.tokens):  # as the server's slots do
                self.decode(prompt[len(self.tokens) : at])
                add_checkpoint(self.checkpoints, at, self.ctx.seq_snapshot(0))
            self.decode(prompt[len(self.tokens) :])
        return np.array(self.scores(0, len(prompt))) if prompt_logits else None

    def context_shift(self, n_keep: int) -> int:
        """llama.cpp's context shift: drop half of the tokens after the first ``n_keep`` and
        move the rest down; returns the number of tokens discarded."""
        n_past = len(self.tokens)
        n_keep = max(0, min(n_keep, n_past))
        n_discard = (n_past - n_keep) // 2
        if n_discard <= 0:
            return 0
        self.ctx.seq_rm(0, n_keep, n_keep + n_discard)
        self.ctx.seq_add(0, n_keep + n_discard, n_past, -n_discard)
        del self.tokens[n_keep : n_keep + n_discard]
        self.n_scored = min(self.n_scored, n_keep)
        self.checkpoints = [c for c in self.checkpoints if c[0] <= n_keep]
        return n_discard

    # ------------------------------------------------------------------ generation
    def generate(
        self, prompt: Sequence[int], sampler: Sampler, config: GenerationConfig | None = None
    ) -> Generation:
        """Continue ``prompt``; iterate the result for :class:`Step` events."""
        return Generation(self, list(prompt), sampler, config or GenerationConfig())


class Generation:
    """An iterator of :class:`Step`; afterwards :attr:`finish_reason` is ``"stop"`` or
    ``"length"`` and :attr:`stop_cause` says why (``eog``, ``stop``, ``criteria``,
    ``max_tokens``, ``context``). Closing it early (``close()``, or breaking out of a
    ``for``) leaves the cache consistent; the finish reason is then ``None``."""

    def __init__(
        self, session: Session, prompt: list[int], sampler: Sampler, config: GenerationConfig
    ) -> None:
        self.session = session
        self.prompt = prompt
        self.sampler = sampler
        self.config = config
        self.tokens: list[int] = []  # the completion (without a final EOG token)
        self.text = ""  # released text (stop string excluded)
        self.finish_reason: str | None = None
        self.stop_cause: str | None = None
        self.prompt_logits: np.ndarray | None = None
        self.step_logits: list[np.ndarray] = []  # raw rows of the tokens (keep_logits)
        self.n_shifted = 0
        self._it = self._run()

    def __iter__(self) -> Iterator[Step]:
        return self

    def __next__(self) -> Step:
        return next(self._it)

    def close(self) -> None:
        self._it.close()

    def run(self) -> Generation:
        """Consume all steps."""
        for _ in self:
            pass
        return self

    def _finish(self, reason: str, cause: str) -> None:
        self.finish_reason, self.stop_cause = reason, cause

    def _run(self) -> Iterator[Step]:
        s, cfg = self.session, self.config
        if len(self.prompt) >= s.n_ctx:
            raise ContextOverflowError(
                f"the prompt has {len(self.prompt)} tokens but the context holds n_ctx = "
                f"{s.n_ctx}; leave room for at least one generated token"
            )
        self.prompt_logits = s.ingest(self.prompt, prompt_logits=cfg.prompt_logits)
        if cfg.accept_prompt:
            for t in self.prompt:
                self.sampler.accept(t)
        utf8, stops = Utf8Text(), StopMatcher(cfg.stop)
        timings = s.timings
        logits = s.last_logits
        n_ctx = s.n_ctx
        spec = cfg.speculator
        if spec is not None and not self._can_speculate():
            spec = None
        if spec is not None:
            spec.begin(self.prompt)
        # verified proposals: (proposed token, the logits row after it); their tokens are
        # in the cache past the last sampled token
        self._queue: list[tuple[int, np.ndarray]] = []
        self._round = 0  # tokens proposed in the current verification round
        try:
            yield from self._loop(logits, utf8, stops, timings, n_ctx, spec)
        finally:
            self._drop_queue(spec)
        if self.stop_cause != "stop":
            tail = stops.feed(utf8.flush()) + stops.flush()
            if tail:
                self.text += tail
                yield Step(None, tail)

    def _can_speculate(self) -> bool:
        """Proposed tokens that are rejected must leave the cache: a memory that cannot be
        rewound (recurrent layers) decodes one token at a time."""
        return bool(getattr(self.session.ctx, "can_rewind", True))

    def _drop_queue(self, spec: Any, keep_row: np.ndarray | None = None) -> None:
        """End a verification round: the proposals not consumed leave the cache."""
        s = self.session
        if spec is not None and self._round:
            spec.record(self._round, self._round - len(self._queue))
            s.timings.n_drafted += self._round
            s.timings.n_accepted += self._round - len(self._queue)
        self._round = 0
        if self._queue:
            row = self._last_row if keep_row is None else keep_row
            s.truncate(len(s.tokens) - len(self._queue))
            self._queue.clear()
            s.last_logits = row

    def _loop(self, logits, utf8, stops, timings, n_ctx, spec) -> Iterator[Step]:
        s, cfg, tok = self.session, self.config, self.session.tokenizer
        queue = self._queue
        while True:
            assert logits is not None
            self._last_row = logits
            if 0 <= cfg.max_tokens <= len(self.tokens):
                self._finish("length", "max_tokens")
                break
            row = logits
            n_done = len(s.tokens) - len(queue)  # the cache without unconsumed proposals
            ids = np.array(s.tokens[:n_done], np.intc) if cfg.logits_processors else None
            t0 = time.perf_counter()
            if cfg.logits_processors:
                row = np.array(logits, np.float32)
                for proc in cfg.logits_processors:
                    row = np.asarray(proc(ids, row), np.float32)
            token = int(self.sampler.sample(row))
            timings.t_sample += time.perf_counter() - t0
            timings.n_sample += 1
            if cfg.stopping_criteria:
                ids = np.array(s.tokens[:n_done], np.intc)
                if any(crit(ids, logits) for crit in cfg.stopping_criteria):
                    self._finish("stop", "criteria")  # as llama-cpp-python: token dropped
                    break
            if cfg.stop_at_eog and tok.is_eog(token):
                self._finish("stop", "eog")
                break
            self.tokens.append(token)
            if cfg.keep_logits:
                self.step_logits.append(logits)
            text = stops.feed(utf8.feed(tok.token_to_piece(token, cfg.special)))
            self.text += text
            step = Step(token, text, logits if cfg.keep_logits else None)
            if stops.matched is not None:
                self._finish("stop", "stop")
                yield step
                break
            yield step
            if 0 <= cfg.max_tokens <= len(self.tokens):
                self._finish("length", "max_tokens")
                break
            if queue and queue[0][0] == token:  # a verified proposal: its row is ready
                logits = queue.pop(0)[1]
                continue
            self._drop_queue(spec, logits)  # (a rejected proposal ends the round)
            if len(s.tokens) + 1 >= n_ctx:  # no room to decode this token and sample another
                if not cfg.context_shift or s.context_shift(cfg.n_keep) == 0:
                    self._finish("length", "context")
                    break
                self.n_shifted += 1
            draft: list[int] = []
            if spec is not None:
                room = n_ctx - len(s.tokens) - 2  # this token, proposals, one more sample
                if cfg.max_tokens >= 0:
                    room = min(room, cfg.max_tokens - len(self.tokens) - 1)
                draft = spec.propose([*self.prompt, *self.tokens], room) if room > 0 else []
            t0 = time.perf_counter()
            if draft:
                rows = s.decode([token, *draft], all_logits=True, verify=True)
                logits = rows[0]
                queue.extend(zip(draft, rows[1:]))
                self._round = len(draft)
            else:
                logits = s.decode([token])
            if spec is not None:
                spec.timed(1 + len(draft), time.perf_counter() - t0)
