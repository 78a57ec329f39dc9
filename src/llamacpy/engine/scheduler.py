"""Continuous batching over parallel slots: llama-server's engine loop.

One engine thread owns the :class:`~.context.Context`. Each of the ``n_slots`` slots is one
KV sequence (``seq_id`` = slot id) with at most ``n_ctx_slot`` positions. Every step:

1. drop aborted and expired requests (their slots are free again before the next decode);
2. admit queued requests into idle slots, choosing the slot whose cached tokens share the
   longest prefix with the prompt (``cache_prompt``), else the least recently used one;
3. build ONE batch: the next token of every generating sequence, then prompt chunks of the
   slots still reading their prompt, at most ``n_batch`` tokens in all;
4. decode it and hand each logits row to its request's :class:`SeqHandler`, which samples
   the next token (or says the request is finished).

With speculative decoding (``speculator``: a factory of
:class:`~llamacpy.api.speculative.Speculator`, one per slot, sharing one cost model
``spec.cost``), a
generating slot adds the tokens its proposer guesses after its next token; the chosen
lengths maximise the step's expected tokens per second. A step with proposals decodes its
generation rows with single-token numerics (and the prompt chunks, if any, in a second
batch); the handler samples from the row after the next token and, while its token equals
the next proposal, from that proposal's row; the rest leave the cache.

The scheduler deals only in token ids, positions and logits rows; text, sampling and stop
strings belong to the handler (``llamacpy.api.serving``). The API is small and thread-safe:
:meth:`Scheduler.submit`, :meth:`Scheduler.abort`, :meth:`Scheduler.info`, :meth:`Scheduler.stop`.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ..errors import LlamacpyError, UsageError
from .batch import Batch
from .request_stats import RequestStats

_ENDED = object()  # a sample that ended its request

# hybrid models: a prompt's state is kept this many tokens before its end (where the next
# turn of a chat usually departs from it: the re-rendered reply), at most this many per slot
CHECKPOINT_BACK = 8
MAX_CHECKPOINTS = 2


def latest_checkpoint(checkpoints: list[tuple[int, Any]], want: int) -> Any:
    """The snapshot of the latest ``(positions, snapshot)`` checkpoint holding at most
    ``want`` tokens; None when none fits."""
    fit = [c for c in checkpoints if c[0] <= want]
    return max(fit, key=lambda c: c[0])[1] if fit else None


def add_checkpoint(checkpoints: list[tuple[int, Any]], n: int, snap: Any) -> None:
    """Keep a snapshot taken at ``n`` tokens, the oldest dropped beyond MAX_CHECKPOINTS."""
    checkpoints.append((n, snap))
    del checkpoints[:-MAX_CHECKPOINTS]


class QueueFullError(LlamacpyError):
    """Every slot is busy and the wait queue is full: retry later."""


class SchedulerClosedError(LlamacpyError):
    """The scheduler is shutting down and accepts no new requests."""


class SeqHandler(Protocol):
    """What a request does with its logits (implemented above the engine)."""

    def on_logits(self, row: np.ndarray) -> int | None:
        """Sample from ``row`` (float32 ``[n_vocab]``); return the token to decode next, or
        None when the request is finished (the handler has reported its result)."""
        ...

    def on_prompt_logits(self, pos0: int, rows: np.ndarray) -> None:
        """Logits of prompt positions ``pos0..`` (only for ``prompt_logits`` requests)."""
        ...

    def on_end(self, reason: str, message: str = "") -> None:
        """The scheduler ended the request: ``context`` (the slot is full), ``timeout``,
        ``aborted``, ``shutdown`` or ``error`` (``message`` says what failed)."""
        ...


_ids = itertools.count()


@dataclass(eq=False)
class Request:
    """One generation request. The scheduler fills the fields after ``handler``."""

    prompt: list[int]
    handler: SeqHandler
    cache_prompt: bool = True
    # llama-server's n_cache_reuse: after the common prefix, cached chunks of at least this
    # many tokens that the prompt repeats further on are moved there (0: off)
    n_cache_reuse: int = 0
    prompt_logits: bool = False  # logits of every prompt token (no prefix reuse)
    id_slot: int = -1  # a slot to use (-1: any)
    deadline: float | None = None  # time.monotonic() after which generation stops
    id: int = field(default_factory=lambda: next(_ids))
    slot: int = -1
    n_cached: int = 0  # prompt tokens reused from the slot's cache
    n_shifted: int = 0  # ... of which moved to another position (n_cache_reuse)
    n_decoded: int = 0  # tokens generated (sampled)
    state: str = "new"  # queued -> prompt -> generating -> done
    t_submit: float = 0.0
    t_start: float = 0.0  # admitted into a slot
    t_prompt: float = 0.0  # prompt decoded (first token sampled)
    t_end: float = 0.0
    t_last_token: float = 0.0  # when its latest token was sampled
    aborted: bool = False
    n_drafted: int = 0  # proposals verified for this request, accepted ones
    n_accepted: int = 0
    # n > 1: requests that continue this one's prompt in slots of their own; they wait
    # ("wait") until its prompt is decoded, then get a copy of its cache and its last
    # logits row, and generate on their own
    followers: list[Request] = field(default_factory=list)


@dataclass(eq=False)
class Slot:
    """One KV sequence and the request using it."""

    id: int
    n_ctx: int
    tokens: list[int] = field(default_factory=list)  # what the cache holds, pos i at i
    request: Request | None = None
    pending: list[int] = field(default_factory=list)  # prompt tokens still to decode
    next_token: int | None = None  # sampled, to be decoded in the next step
    t_last_used: float = 0.0
    # a memory whose states cannot be rewound (hybrid models): snapshots of the state
    # after the first n cached tokens, (n, snapshot), and where the prompt being read
    # takes its next one (-1: none)
    checkpoints: list[tuple[int, Any]] = field(default_factory=list)
    checkpoint_at: int = -1
    n_shifted: int = 0  # its latest request's tokens reused from moved chunks
    spec: Any = None  # the slot's Speculator (speculative decoding)
    drafts: list[int] = field(default_factory=list)  # proposals in this step's batch

    @property
    def busy(self) -> bool:
        return self.request is not None


@dataclass
class Counters:
    """llama-server's ``/metrics`` counters (written by the engine thread only)."""

    n_prompt_tokens: int = 0
    t_prompt: float = 0.0
    n_tokens_predicted: int = 0
    t_predicted: float = 0.0
    n_decode: int = 0
    n_busy_slots: int = 0  # summed over decodes
    n_tokens_max: int = 0
    n_requests: int = 0
    n_rejected: int = 0
    n_draft_tokens: int = 0  # speculative decoding: proposals verified, accepted, rounds
    n_draft_accepted: int = 0
    n_draft_steps: int = 0
    n_cache_shifted: int = 0  # prompt tokens reused from moved chunks (n_cache_reuse)


def _batch(tok: list[int], pos: list[int], seq: list[int], want: list[bool]) -> Batch:
    n = len(tok)
    return Batch(np.array(tok, np.int32), np.array(pos, np.int32),
                 np.array(seq, np.int32).reshape(n, 1), np.array(want, bool))  # fmt: skip


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    x = np.asarray(a[:n], np.int64) != np.asarray(b[:n], np.int64)
    return int(np.argmax(x)) if x.any() else n


class Scheduler:
    """Continuous batching over ``n_slots`` sequences of ``ctx`` (see the module docstring).

    ``max_queue`` bounds the requests waiting for a slot: :meth:`submit` raises
    :class:`QueueFullError` at once when ``n_slots + max_queue`` requests are in flight.
    ``n_ctx_slot`` defaults to ``ctx.n_ctx // n_slots``. ``slot_similarity`` is
    llama-server's ``--slot-prompt-similarity``: a cached prefix must cover at least this
    fraction of the prompt for its slot to be preferred over the least recently used one.
    """

    def __init__(
        self,
        ctx: Any,
        n_slots: int = 1,
        *,
        max_queue: int = 64,
        n_ctx_slot: int | None = None,
        slot_similarity: float = 0.1,
        speculator: Any = None,
    ) -> None:
        if n_slots < 1 or n_slots > ctx.n_seq_max:
            raise UsageError(
                f"n_slots = {n_slots} needs a context with n_seq_max >= {n_slots} "
                f"(it has {ctx.n_seq_max})"
            )
        if max_queue < 0:
            raise UsageError(f"max_queue must be >= 0, not {max_queue}")
        self.ctx = ctx
        self.n_batch = int(ctx.n_batch)
        self.n_ctx_slot = int(n_ctx_slot or ctx.n_ctx // n_slots)
        if self.n_ctx_slot < 2 or self.n_ctx_slot * n_slots > ctx.n_ctx:
            raise UsageError(
                f"a context of {ctx.n_ctx} tokens cannot hold {n_slots} slots of "
                f"{self.n_ctx_slot} tokens"
            )
        self.max_queue = max_queue
        self.slot_similarity = slot_similarity
        self.slots = [Slot(i, self.n_ctx_slot) for i in range(n_slots)]
        self.counters = Counters()
        self.stats = RequestStats()  # per-request histograms for /metrics
        self._queue: deque[Request] = deque()
        self._n_inflight = 0
        self._cond = threading.Condition()
        self._aborts = False  # an abort is pending: look at the flags
        self._closing = False
        self._stopped = False
        self._thread: threading.Thread | None = None
        self._hook = None  # tests: called with each batch before decoding
        # (slot, task, callback): slot tasks (erase, save, restore) waiting for the engine
        self._slot_tasks: list[tuple[int, Any, Any]] = []
        self._snapshots = bool(getattr(ctx, "can_snapshot", False))  # prefix checkpoints
        self.spec_cost: Any = None  # the speculators' shared cost model (timed(n, s))
        if speculator is not None and getattr(ctx, "can_rewind", True):
            for sl in self.slots:
                sl.spec = speculator()
            self.spec_cost = self.slots[0].spec.cost

    # ------------------------------------------------------------------ public API
    def start(self) -> Scheduler:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="llamacpy-engine", daemon=True)
            self._thread.start()
        return self

    def submit(self, req: Request) -> Request:
        """Queue a request (thread-safe); raises :class:`QueueFullError` when full and
        :class:`SchedulerClosedError` when stopping. Nothing accepted is ever dropped: every
        accepted request ends with its handler returning None or :meth:`SeqHandler.on_end`."""
        if not req.prompt:
            raise UsageError("the prompt is empty")
        group = 1 + len(req.followers)
        if group > len(self.slots):
            raise UsageError(f"{group} completions of one prompt need as many slots; "
                             f"there are {len(self.slots)}")  # fmt: skip
        with self._cond:
            if self._closing:
                raise SchedulerClosedError("the server is shutting down")
            if self._n_inflight + group > len(self.slots) + self.max_queue:
                self.counters.n_rejected += 1
                raise QueueFullError(
                    f"all {len(self.slots)} slots are busy and {self.max_queue} requests wait"
                )
            self._n_inflight += group
            req.t_submit = time.monotonic()
            for r in (req, *req.followers):
                r.state, r.t_submit = "queued", req.t_submit
            self._queue.append(req)
            self._cond.notify()
        return req

    def abort(self, req: Request) -> None:
        """Cancel a request (thread-safe): its slot is free before the next decode."""
        with self._cond:
            if req.state in ("done", "new") or req.aborted:
                return
            req.aborted = True
            self._aborts = True
            self._cond.notify()

    def erase(self, slot: int, done: Any) -> None:
        """Forget slot ``slot``'s cached tokens (thread-safe), once it is idle;
        ``done(n_erased)`` is then called on the engine thread."""
        self.slot_task(slot, self.erase_slot, done)

    def slot_task(self, slot: int, task: Any, done: Any) -> None:
        """Run ``task(slot)`` on the engine thread once slot ``slot`` is idle (as llama-server
        defers slot actions) and call ``done`` with its result, or with the exception it
        raised, or with -1 when the server shuts down first (thread-safe)."""
        if not 0 <= slot < len(self.slots):
            raise UsageError(f"Invalid slot ID {slot} (the server has {len(self.slots)} slots)")
        with self._cond:
            self._slot_tasks.append((slot, task, done))
            self._cond.notify()

    def erase_slot(self, s: Slot) -> int:
        n = len(s.tokens)
        self._reset_slot(s)
        return n

    def save_slot(self, s: Slot) -> tuple[list[int], dict]:
        """(cached tokens, the slot's sequence in the memory): what a slot file holds."""
        return list(s.tokens), self.ctx.kv.get_seq_state(s.id)

    def restore_slot(self, tokens: list[int], state: dict) -> Any:
        """A slot task: the slot's cache becomes ``tokens`` with their saved sequence (checked
        first; a failure leaves the slot empty, never half-restored)."""

        def task(s: Slot) -> int:
            self._reset_slot(s)
            self.ctx.kv.set_seq_state(s.id, state)  # checked first; on error the slot is empty
            if self.ctx.kv.seq_pos_max(s.id) != len(tokens) - 1:
                self._reset_slot(s)
                raise UsageError("the slot file's tokens do not match its cached cells")
            s.tokens[:] = tokens
            s.t_last_used = time.monotonic()
            return len(tokens)

        return task

    def _service(self) -> None:
        """Run the slot tasks whose slots are idle (the others wait)."""
        with self._cond:
            todo, self._slot_tasks = self._slot_tasks, []
        later = []
        for sid, task, done in todo:
            s = self.slots[sid]
            if s.busy:
                later.append((sid, task, done))
                continue
            try:
                result = task(s)
            except Exception as e:  # handed to the caller, who answers with it
                result = e
            try:
                done(result)
            except Exception:
                pass
        if later:
            with self._cond:
                self._slot_tasks[:0] = later

    @property
    def n_queued(self) -> int:
        return len(self._queue)

    @property
    def n_processing(self) -> int:
        return sum(s.busy for s in self.slots)

    def info(self) -> list[dict[str, Any]]:
        """One dict per slot: id, n_ctx, is_processing, id_task, n_past (cached tokens),
        n_cache_reused (its latest request's prompt tokens reused from moved chunks)."""
        return [
            {
                "id": s.id,
                "n_ctx": s.n_ctx,
                "is_processing": s.busy,
                "id_task": s.request.id if s.request is not None else -1,
                "n_past": len(s.tokens),
                "n_cache_reused": s.n_shifted,
            }
            for s in self.slots
        ]

    def close(self) -> None:
        """Accept no new requests (in-flight ones go on)."""
        with self._cond:
            self._closing = True

    def wait_idle(self, timeout: float) -> bool:
        """Wait until nothing is in flight; False on timeout."""
        end = time.monotonic() + timeout
        with self._cond:
            while self._n_inflight:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.05))
        return True

    def stop(self, timeout: float = 0.0) -> None:
        """Stop accepting, let in-flight work finish for up to ``timeout`` seconds, cancel the
        rest (``on_end("shutdown")``) and end the engine thread."""
        self.close()
        if self._thread is not None:
            self.wait_idle(timeout)
        with self._cond:
            self._stopped = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        # without a thread (or after it), nothing may stay pending
        for s in self.slots:
            if s.request is not None:
                self._end(s.request, "shutdown")
        while self._queue:
            self._end(self._queue.popleft(), "shutdown")
        with self._cond:
            todo, self._slot_tasks = self._slot_tasks, []
        for _, _, done in todo:  # never left waiting: -1 says the server shut down
            try:
                done(-1)
            except Exception:
                pass

    # ------------------------------------------------------------------ engine thread
    def _loop(self) -> None:
        while True:
            with self._cond:
                while not (self._stopped or self._queue or self._aborts or self.n_processing
                           or self._slot_tasks):  # fmt: skip
                    self._cond.wait()
                if self._stopped:
                    break
            try:
                self.step()
            except Exception as e:  # a bug must not leave requests waiting forever
                self._fail_all(f"engine step failed: {type(e).__name__}: {e}")

    def _fail_all(self, message: str) -> None:
        for s in self.slots:
            r = s.request
            try:
                self._reset_slot(s)
            except Exception:
                s.tokens.clear()
            if r is not None:
                self._end(r, "error", message)

    def step(self) -> bool:
        """One scheduling step; returns False when there was nothing to decode."""
        if self._slot_tasks:
            self._service()
        self._reap()
        self._admit()
        parts = self._plan()
        if not parts:
            return False
        for batch, owners, verify in parts:
            self._decode(batch, owners, verify)
        return True

    def _decode(self, batch: Batch, owners: list[tuple[Slot, str, int]], verify: bool) -> None:
        """Decode one planned batch (``verify``: with single-token numerics) and dispatch
        its rows."""
        if self._hook is not None:
            self._hook(batch)
        t0 = time.perf_counter()
        try:
            if verify:
                logits = self.ctx.decode(batch, single_numerics=True)
            else:
                logits = self.ctx.decode(batch)
        except Exception as e:  # fail the requests of this batch, keep serving the others
            for sid in {int(x) for x in batch.seq_id[:, 0]}:
                slot = self.slots[sid]
                self._reset_slot(slot)
                if slot.request is not None:
                    self._end(slot.request, "error", f"decode failed: {e}")
            return
        gen_only = all(kind in ("gen", "draft") for _, kind, _ in owners)
        if self.spec_cost is not None and gen_only and len(owners) == len(batch):
            self.spec_cost.timed(len(batch), time.perf_counter() - t0)  # (what choices need)
        c = self.counters
        c.n_decode += 1
        c.n_busy_slots += len({int(x) for x in batch.seq_id[:, 0]})
        c.n_tokens_max = max(c.n_tokens_max, len(batch))
        if self._snapshots:
            self._checkpoint(self.slots)
        self._dispatch(owners, logits)

    def _reap(self) -> None:
        now = time.monotonic()
        with self._cond:
            if self._aborts:
                self._aborts = False
                for r in [r for r in self._queue if r.aborted]:
                    self._queue.remove(r)
                    self._end_locked(r, "aborted")
            queued_expired = [
                r for r in self._queue if r.deadline is not None and now >= r.deadline
            ]
            for r in queued_expired:
                self._queue.remove(r)
                self._end_locked(r, "timeout")
        for s in self.slots:
            r = s.request
            if r is None:
                continue
            if r.aborted:
                self._end(r, "aborted")
            elif r.deadline is not None and now >= r.deadline:
                self._end(r, "timeout")

    def _admit(self) -> None:
        with self._cond:
            if not self._queue:
                return
            idle = [s for s in self.slots if not s.busy]
            waiting = list(self._queue)
            for r in waiting:
                if len(idle) < 1 + len(r.followers):
                    continue
                slot = self._pick(r, idle)
                if slot is None:
                    continue
                idle.remove(slot)
                self._queue.remove(r)
                for f in r.followers:  # the least recently used slots wait for the prompt
                    fs = min(idle, key=lambda s: s.t_last_used)
                    idle.remove(fs)
                    fs.request, fs.pending, fs.next_token = f, [], None
                    f.slot, f.state, f.t_start = fs.id, "wait", time.monotonic()
                self._assign(slot, r)

    def _pick(self, r: Request, idle: list[Slot]) -> Slot | None:
        if r.id_slot >= 0:
            return next((s for s in idle if s.id == r.id_slot), None)
        if r.cache_prompt:
            best = max(idle, key=lambda s: common_prefix(s.tokens, r.prompt))
            n = common_prefix(best.tokens, r.prompt)
            if n > 0 and n >= self.slot_similarity * len(r.prompt):
                return best
        return min(idle, key=lambda s: s.t_last_used)

    def _assign(self, slot: Slot, r: Request) -> None:
        n_keep = 0
        if r.cache_prompt and not r.prompt_logits:
            n_keep = prefix = common_prefix(slot.tokens, r.prompt)
            if r.n_cache_reuse > 0 and self.ctx.can_shift:
                n_keep = self._reuse_chunks(slot, r, n_keep)
            n_keep = min(n_keep, len(r.prompt) - 1)  # decode the last one again: its logits
            r.n_shifted = max(0, n_keep - prefix)
            self.counters.n_cache_shifted += r.n_shifted
            if n_keep < len(slot.tokens):  # a sliding-window cache may not go back that far
                want, n_keep = n_keep, self.ctx.n_keep(slot.id, n_keep)
                if n_keep < want:  # a state that cannot be rewound: its latest checkpoint
                    n_keep = self._restore(slot, want)
        slot.n_shifted = r.n_shifted
        if n_keep < len(slot.tokens):
            self.ctx.seq_rm(slot.id, n_keep, -1)
            del slot.tokens[n_keep:]
        slot.checkpoints = [c for c in slot.checkpoints if c[0] <= n_keep]
        slot.checkpoint_at = -1
        if self._snapshots and len(r.prompt) - CHECKPOINT_BACK > n_keep:
            slot.checkpoint_at = len(r.prompt) - CHECKPOINT_BACK
        slot.request, slot.pending, slot.next_token = r, list(r.prompt[n_keep:]), None
        r.slot, r.n_cached, r.state = slot.id, n_keep, "prompt"
        r.t_start = time.monotonic()
        if len(r.prompt) >= slot.n_ctx:
            self._end(
                r, "error", f"the prompt ({len(r.prompt)} tokens) does not fit the slot context "
                f"({slot.n_ctx} tokens)"
            )  # fmt: skip

    def _reuse_chunks(self, slot: Slot, r: Request, n_past: int) -> int:
        """llama-server's cache reuse: past the common prefix, every run of at least
        ``r.n_cache_reuse`` cached tokens that the prompt continues with is moved to its
        place in the prompt (the cells between are dropped, the keys re-roped); returns the
        prompt tokens the cache now holds in order. The moved chunks keep what they
        attended to before: an approximation, as in llama.cpp."""
        cache, prompt = slot.tokens, r.prompt
        head_c = head_p = head_c_0 = n_past
        while head_c < len(cache) and head_p < len(prompt):
            n = 0
            while (head_c + n < len(cache) and head_p + n < len(prompt)
                   and cache[head_c + n] == prompt[head_p + n]):  # fmt: skip
                n += 1
            if n < r.n_cache_reuse:
                head_c += 1
                continue
            self.ctx.seq_rm(slot.id, head_p, head_c)
            self.ctx.seq_add(slot.id, head_c, head_c + n, head_p - head_c)
            n_past += n
            head_c += n
            head_p += n
        if n_past > head_c_0:  # the cache holds the prompt's first n_past tokens, leftovers
            self.ctx.seq_rm(slot.id, n_past, -1)
            slot.tokens[:] = prompt[:n_past]
        return n_past

    def _restore(self, slot: Slot, want: int) -> int:
        """Back to the slot's latest checkpoint within the first ``want`` tokens; returns
        the tokens it keeps (0: none fits)."""
        snap = latest_checkpoint(slot.checkpoints, want)
        if snap is None:
            return 0
        held = self.ctx.seq_restore(slot.id, snap)
        del slot.tokens[held:]
        return held

    def _checkpoint(self, slots: list[Slot]) -> None:
        """Snapshot the slots whose prompt reached their checkpoint position."""
        for s in slots:
            if s.request is None or len(s.tokens) != s.checkpoint_at:
                continue
            add_checkpoint(s.checkpoints, len(s.tokens), self.ctx.seq_snapshot(s.id))
            s.checkpoint_at = -1

    def _plan(self) -> list[tuple[Batch, list[tuple[Slot, str, int]], bool]]:
        """The step's batches: each with, per logits row, its slot, kind (``gen``,
        ``draft``: a proposal, ``prompt``: the last prompt token, ``prompt_row``: another
        prompt token) and position, and whether it verifies proposals. One batch, unless
        proposals are verified: then the generation rows and the prompt chunks apart."""
        tok: list[int] = []
        pos: list[int] = []
        seq: list[int] = []
        want: list[bool] = []
        owners: list[tuple[Slot, str, int]] = []
        gen = [s for s in self.slots if s.request is not None and s.next_token is not None]
        self._propose(gen)
        for s in gen:  # generating sequences first: their next token and any proposals
            p = len(s.tokens)
            run = [s.next_token, *s.drafts]
            tok.extend(run)
            pos.extend(range(p, p + len(run)))
            seq.extend([s.id] * len(run))
            want.extend([True] * len(run))
            owners.append((s, "gen", p))
            owners.extend((s, "draft", p + 1 + i) for i in range(len(s.drafts)))
            s.tokens.extend(run)  # the cache holds them once decoded
            s.next_token = None
        verify = any(s.drafts for s in gen)
        parts: list[tuple[Batch, list[tuple[Slot, str, int]], bool]] = []
        if verify:
            parts.append((_batch(tok, pos, seq, want), owners, True))
            tok, pos, seq, want, owners = [], [], [], [], []
        budget = self.n_batch - len(tok) - sum(len(b) for b, _, _ in parts)
        prompt_slots = sorted(
            (s for s in self.slots if s.request is not None and s.pending),
            key=lambda s: s.request.t_start,  # type: ignore[union-attr]
        )
        for s in prompt_slots:
            if budget <= 0:
                break
            r = s.request
            assert r is not None
            room = budget
            if s.checkpoint_at > len(s.tokens):  # end the chunk where a checkpoint is due
                room = min(room, s.checkpoint_at - len(s.tokens))
            chunk = s.pending[:room]
            last = len(chunk) == len(s.pending)
            p0 = len(s.tokens)
            tok.extend(chunk)
            pos.extend(range(p0, p0 + len(chunk)))
            seq.extend([s.id] * len(chunk))
            if r.prompt_logits:
                want.extend([True] * len(chunk))
                owners.extend((s, "prompt_row", p0 + i) for i in range(len(chunk)))
                if last:
                    owners[-1] = (s, "prompt", p0 + len(chunk) - 1)
            else:
                want.extend([False] * (len(chunk) - 1) + [last])
                if last:
                    owners.append((s, "prompt", p0 + len(chunk) - 1))
            s.tokens.extend(chunk)
            del s.pending[: len(chunk)]
            budget -= len(chunk)
        if tok:
            parts.append((_batch(tok, pos, seq, want), owners, False))
        return parts

    def _propose(self, gen: list[Slot]) -> None:
        """Each generating slot's proposals for this step (``Slot.drafts``), their lengths
        chosen in turn for the most expected tokens per second of the whole batch."""
        rows, tokens = len(gen), float(len(gen))
        for s in gen:
            s.drafts = []
            if s.spec is None:
                continue
            room = min(s.n_ctx - len(s.tokens) - 2, self.n_batch - rows)
            if room <= 0:
                continue
            history = [*s.tokens, s.next_token]
            s.drafts = s.spec.propose(history, room, rows=rows, tokens=tokens)
            rows += len(s.drafts)
            tokens += s.spec.expected(len(s.drafts)) - 1.0

    def _dispatch(self, owners: list[tuple[Slot, str, int]], logits: np.ndarray) -> None:
        now = time.monotonic()
        rows: dict[int, tuple[int, list[np.ndarray]]] = {}  # slot -> prompt logits rows
        for k, (s, kind, p) in enumerate(owners):
            r = s.request
            if r is None or r.state == "done":
                continue
            if r.prompt_logits and kind != "gen":
                rows.setdefault(s.id, (p, []))[1].append(logits[k])
                if kind == "prompt_row":
                    continue
                p0, got = rows.pop(s.id)
                self._call(r, "on_prompt_logits", p0, np.stack(got))
                if r.state == "done":
                    continue
            if kind == "draft":
                continue  # (read with its slot's "gen" row)
            if kind == "prompt":
                r.state, r.t_prompt = "generating", now
                c = self.counters
                c.n_prompt_tokens += len(r.prompt) - r.n_cached
                c.t_prompt += now - r.t_start
                self._fork(s, r, logits[k], now)
            if kind == "gen" and s.drafts:
                self._next_verified(s, r, logits[k : k + 1 + len(s.drafts)])
                continue
            self._next(s, r, logits[k])
        for sid, (p0, got) in rows.items():  # prompt rows of a chunk that is not the last
            r = self.slots[sid].request
            if r is not None:
                self._call(r, "on_prompt_logits", p0, np.stack(got))

    def _fork(self, s: Slot, r: Request, row: np.ndarray, now: float) -> None:
        """``r``'s prompt is decoded: its waiting followers get a copy of the slot's cache
        and sample their first token from the same logits row."""
        for f in r.followers:
            if f.state != "wait":
                continue
            fs = self.slots[f.slot]
            self.ctx.seq_rm(fs.id, -1, -1)
            self.ctx.seq_cp(s.id, fs.id, -1, -1)
            fs.tokens = list(s.tokens)
            f.n_cached, f.state, f.t_prompt = r.n_cached, "generating", now
            self._next(fs, f, row)

    def _next(self, s: Slot, r: Request, row: np.ndarray) -> None:
        token = self._sample(r, row)
        if token is not _ENDED:
            self._then(s, r, token)

    def _sample(self, r: Request, row: np.ndarray) -> Any:
        """The handler's token from ``row``, or ``_ENDED`` when the request ended."""
        try:
            token = r.handler.on_logits(row)
        except Exception as e:
            self._end(r, "error", f"sampling failed: {e}")
            return _ENDED
        if r.state == "done":
            return _ENDED
        r.n_decoded += 1
        now = time.monotonic()
        self.stats.token(r.t_submit, r.t_last_token, now, r.n_decoded == 1)
        r.t_last_token = now
        if token is None:
            self._finish(r)
            return _ENDED
        return int(token)

    def _then(self, s: Slot, r: Request, token: int) -> None:
        """After a sampled token: end the request, or decode the token next step."""
        if r.aborted:
            self._end(r, "aborted")
        elif len(s.tokens) + 1 >= s.n_ctx:  # no room to decode it and sample another
            self._end(r, "context")
        elif r.deadline is not None and time.monotonic() >= r.deadline:
            self._end(r, "timeout")
        else:
            s.next_token = int(token)

    def _next_verified(self, s: Slot, r: Request, rows: np.ndarray) -> None:
        """Sample from the row after the slot's next token and, while the sampled token is
        the next proposal, from that proposal's row; the proposals not taken leave the
        cache, and the token sampled last is decoded in the next step."""
        drafts, s.drafts = s.drafts, []
        base = len(s.tokens) - len(drafts)  # the cache up to the decoded next token
        accepted = 0
        token: Any = _ENDED
        for i in range(len(rows)):
            token = self._sample(r, rows[i])
            if token is _ENDED or i == len(drafts) or token != drafts[i]:
                break
            accepted += 1  # (the token is in the cache already)
        if base + accepted < len(s.tokens):
            self.ctx.seq_rm(s.id, base + accepted, -1)
            del s.tokens[base + accepted :]
        if s.spec is not None:
            s.spec.record(len(drafts), accepted)
        r.n_drafted += len(drafts)
        r.n_accepted += accepted
        c = self.counters
        c.n_draft_tokens += len(drafts)
        c.n_draft_accepted += accepted
        c.n_draft_steps += 1
        if token is not _ENDED:  # a token that is not a proposal: decoded next step
            self._then(s, r, token)

    def _call(self, r: Request, method: str, *args: Any) -> None:
        try:
            getattr(r.handler, method)(*args)
        except Exception as e:
            self._end(r, "error", f"{method} failed: {e}")

    # ------------------------------------------------------------------ ending requests
    def _reset_slot(self, s: Slot) -> None:
        self.ctx.seq_rm(s.id, -1, -1)
        s.tokens.clear()
        s.checkpoints.clear()
        s.checkpoint_at = -1
        s.pending.clear()
        s.next_token = None

    def _release(self, r: Request) -> None:
        r.t_end = time.monotonic()
        if r.slot >= 0:
            s = self.slots[r.slot]
            if s.request is r:
                if s.pending:  # an unfinished prompt: the cache holds a useless partial one
                    s.pending.clear()
                s.request, s.next_token = None, None
                s.t_last_used = r.t_end
            if r.state == "generating":
                c = self.counters
                c.n_tokens_predicted += r.n_decoded
                c.t_predicted += r.t_end - r.t_prompt
        r.state = "done"
        self.counters.n_requests += 1
        self.stats.ended(t_submit=r.t_submit, t_start=r.t_start, t_end=r.t_end,
                         n_prompt=len(r.prompt), n_cached=r.n_cached, n_generated=r.n_decoded,
                         aborted=r.aborted)  # fmt: skip

    def _finish(self, r: Request) -> None:
        with self._cond:
            self._release(r)
            self._n_inflight -= 1
            self._cond.notify_all()

    def _end_locked(self, r: Request, reason: str, message: str = "") -> None:
        if r.state == "done":
            return
        self._release(r)
        self._n_inflight -= 1
        self._cond.notify_all()
        try:
            r.handler.on_end(reason, message)
        except Exception:
            pass  # the request is over either way
        for f in r.followers:  # those still waiting for its prompt end with it
            if f.state in ("queued", "wait"):
                self._end_locked(f, reason, message)

    def _end(self, r: Request, reason: str, message: str = "") -> None:
        with self._cond:
            self._end_locked(r, reason, message)
