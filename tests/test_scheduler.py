"""The continuous-batching scheduler (engine/scheduler.py).

A fake context checks every batch the way the engine does (size <= n_batch, consecutive
positions per sequence continuing the cache, positions inside the slot) and lets
hypothesis drive random request mixes with aborts: every accepted request ends exactly
once, nothing is lost, slots end idle. The real SmolLM2 context then checks prompt
chunking, prefix reuse, slot choice and abort with real decoding.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llamacpy.engine import Batch, ContextParams
from llamacpy.engine.scheduler import QueueFullError, Request, Scheduler, SchedulerClosedError

N_VOCAB = 50


class FakeContext:
    """Checks batches like ``Context.decode``; the logits make token ``(t + 1) % N_VOCAB``
    the argmax after token ``t``."""

    def __init__(self, n_ctx: int, n_batch: int, n_seq_max: int, window: int = 0) -> None:
        self.n_ctx, self.n_batch, self.n_seq_max = n_ctx, n_batch, n_seq_max
        self.pos: dict[int, int] = {}  # seq -> next position
        self.batches: list[int] = []
        self.window = window  # > 0: only the last ``window`` positions can be gone back to

    def n_keep(self, seq: int, n: int) -> int:
        end = self.pos.get(seq, 0)
        return n if not self.window or n >= end - self.window else 0

    def decode(self, batch: Batch) -> np.ndarray:
        batch.arrays()
        n = len(batch)
        assert 0 < n <= self.n_batch
        self.batches.append(n)
        for i in range(n):
            s, p = int(batch.seq_id[i, 0]), int(batch.pos[i])
            assert 0 <= s < self.n_seq_max
            assert p == self.pos.get(s, 0), (s, p, self.pos.get(s, 0))
            self.pos[s] = p + 1
        assert sum(self.pos.values()) <= self.n_ctx
        rows = batch.token[batch.logits]
        out = np.zeros((len(rows), N_VOCAB), np.float32)
        out[np.arange(len(rows)), (rows + 1) % N_VOCAB] = 1.0
        return out

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        assert p1 == -1
        cur = self.pos.get(seq, 0)
        self.pos[seq] = min(cur, max(p0, 0))
        return True


class Greedy:
    """A handler: argmax for ``n`` tokens; records how it ended."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.tokens: list[int] = []
        self.ends: list[str] = []
        self.prompt_rows = 0

    def on_logits(self, row: np.ndarray) -> int | None:
        if len(self.tokens) >= self.n:
            self.ends.append("done")
            return None
        self.tokens.append(int(np.argmax(row)))
        return self.tokens[-1]

    def on_prompt_logits(self, pos0: int, rows: np.ndarray) -> None:
        self.prompt_rows += len(rows)

    def on_end(self, reason: str, message: str = "") -> None:
        self.ends.append(reason)


def run_until_idle(s: Scheduler, limit: int = 10_000) -> None:
    for _ in range(limit):
        if not s.step() and not s._queue:
            return
    raise AssertionError("the scheduler did not become idle")


request_spec = st.tuples(st.integers(1, 40), st.integers(0, 12), st.booleans(), st.booleans())


@settings(max_examples=60, deadline=None)
@given(
    n_slots=st.integers(1, 4),
    n_batch=st.integers(1, 48),
    reqs=st.lists(request_spec, min_size=1, max_size=10),
    abort_at=st.integers(0, 30),
)
def test_random_mixes_end_every_request_once(n_slots, n_batch, reqs, abort_at):
    n_ctx = 64 * n_slots
    ctx = FakeContext(n_ctx, n_batch, n_slots)
    s = Scheduler(ctx, n_slots, max_queue=len(reqs))
    accepted = []
    for i, (n_prompt, n_gen, cache, abort) in enumerate(reqs):
        prompt = [(i * 7 + k) % N_VOCAB for k in range(n_prompt)]
        h = Greedy(n_gen)
        accepted.append((s.submit(Request(prompt, h, cache_prompt=cache)), h, abort))
    for step in range(10_000):
        if step == abort_at:
            for r, _, abort in accepted:
                if abort:
                    s.abort(r)
        if not s.step() and not s._queue and step > abort_at:
            break
    for r, h, _abort in accepted:
        assert len(h.ends) == 1, h.ends  # exactly one end, nothing lost
        assert r.state == "done"
        if h.ends == ["done"]:
            assert len(h.tokens) == h.n
            # greedy chain of the fake model: each token follows the previous one
            expect = [(r.prompt[-1] + 1 + k) % N_VOCAB for k in range(h.n)]
            assert h.tokens == expect
        else:
            assert h.ends[0] in ("aborted", "context")
    assert s._n_inflight == 0 and not any(sl.busy for sl in s.slots)
    assert max(ctx.batches, default=0) <= n_batch
    for sl in s.slots:  # each slot's token list mirrors what the cache holds
        assert len(sl.tokens) == ctx.pos.get(sl.id, 0)


def test_queue_bound_and_shutdown():
    ctx = FakeContext(128, 16, 2)
    s = Scheduler(ctx, 2, max_queue=1)
    hs = [Greedy(5) for _ in range(3)]
    for h in hs:
        s.submit(Request([1, 2, 3], h))
    with pytest.raises(QueueFullError):
        s.submit(Request([1, 2, 3], Greedy(5)))
    assert s.counters.n_rejected == 1
    s.step()
    s.stop()  # never started: cancels everything still pending
    assert all(h.ends == ["shutdown"] for h in hs)
    with pytest.raises(SchedulerClosedError):
        s.submit(Request([1], Greedy(1)))


def test_generating_tokens_share_the_batch_with_prompt_chunks():
    ctx = FakeContext(256, 8, 2)
    s = Scheduler(ctx, 2)
    a, b = Greedy(10), Greedy(3)
    s.submit(Request([1, 2], a))
    s.step()  # a's prompt
    s.submit(Request(list(range(20)), b))  # 20 tokens: chunks of 7 next to a's token
    s.step()
    assert ctx.batches[-1] == 8
    run_until_idle(s)
    assert a.ends == ["done"] and b.ends == ["done"]
    assert b.tokens == [20, 21, 22]


def test_full_slot_ends_with_context():
    ctx = FakeContext(32, 32, 2)
    s = Scheduler(ctx, 2)  # 16 positions per slot
    h = Greedy(100)
    s.submit(Request(list(range(10)), h))
    run_until_idle(s)
    assert h.ends == ["context"] and len(h.tokens) == 6  # 10 + 6 fill the slot
    too_long = Greedy(1)
    s.submit(Request(list(range(16)), too_long))
    run_until_idle(s)
    assert too_long.ends == ["error"]


def test_a_slot_goes_back_only_as_far_as_its_memory_allows():
    ctx = FakeContext(256, 64, 1, window=8)
    s = Scheduler(ctx, 1)
    first = list(range(1, 41))
    s.submit(Request(first, Greedy(4)))
    run_until_idle(s)
    # the cached sequence (40 prompt + 3 generated tokens) shares 38 tokens with this one:
    # within the last 8 positions, kept
    r = s.submit(Request([*first[:38], 7, 8], Greedy(1)))
    run_until_idle(s)
    assert r.n_cached == 38
    # sharing 20: farther back than the memory can go, so the prompt is decoded again
    r = s.submit(Request([*first[:20], 9], Greedy(1)))
    run_until_idle(s)
    assert r.n_cached == 0 and ctx.batches[-2] == 21  # the whole prompt in one batch


def test_prompt_logits_rows():
    ctx = FakeContext(128, 4, 1)
    s = Scheduler(ctx, 1)
    h = Greedy(2)
    s.submit(Request(list(range(10)), h, prompt_logits=True))
    run_until_idle(s)
    assert h.prompt_rows == 10 and h.ends == ["done"]


# --------------------------------------------------------------------------- real model
@pytest.fixture(scope="module")
def real(smollm2_path):
    from llamacpy.api.model import load_model

    params = ContextParams(n_ctx=512, n_batch=16, n_ubatch=16, n_seq_max=2, n_threads=1,
                           n_threads_batch=1)  # fmt: skip
    return load_model(smollm2_path, params)


def test_real_model_chunking_reuse_and_abort(real):
    ctx, tok = real.ctx, real.tokenizer
    ctx.clear()
    s = Scheduler(ctx, 2)
    sizes = []
    s._hook = lambda b: sizes.append(len(b))
    prompt = tok.encode("The quick brown fox jumps over the lazy dog. " * 3)
    assert len(prompt) > 16
    alone = Greedy(8)
    s.submit(Request(prompt, alone, cache_prompt=False))
    run_until_idle(s)
    assert max(sizes) <= 16 and alone.ends == ["done"]
    # the same prompt again: the slot holding it is chosen and its prefix reused
    again = Greedy(8)
    r = s.submit(Request(prompt, again))
    run_until_idle(s)
    assert again.tokens == alone.tokens
    assert r.n_cached == len(prompt) - 1 and r.slot == 0
    # a different prompt takes the other (least recently used) slot
    other = Greedy(2)
    r2 = s.submit(Request(tok.encode("Hello"), other))
    run_until_idle(s)
    assert r2.slot == 1
    # abort: the slot is free after the next step, and serves the next request
    long = Greedy(1000)
    r3 = s.submit(Request(prompt, long))
    for _ in range(3):
        s.step()
    s.abort(r3)
    s.step()
    assert long.ends == ["aborted"] and not any(sl.busy for sl in s.slots)
    last = Greedy(8)
    s.submit(Request(prompt, last))
    run_until_idle(s)
    assert last.tokens == alone.tokens
