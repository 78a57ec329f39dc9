"""The shared completion loop (llamacpy.api.generation) on a fake engine: fast, exact.

The fake model predicts ``next = token + 1`` (so a prompt ``[0]`` continues ``b c d ...``),
except that token 25 is followed by the EOG token 31; tokens 27/28 are the two bytes of
"é"; every decode is recorded, so prefix reuse is checked by counting decoded tokens.
"""

from __future__ import annotations

import numpy as np
import pytest

from llamacpy.api.generation import (
    ContextOverflowError,
    GenerationConfig,
    Session,
    StopMatcher,
    Utf8Text,
)

V = 32
EOG = 31


class FakeTokenizer:
    def token_to_piece(self, tid: int, special: bool = True) -> bytes:
        if tid < 26:
            return bytes([ord("a") + tid])
        return {26: b" ", 27: b"\xc3", 28: b"\xa9", 29: b"!", 30: b"?"}.get(tid, b"")

    def is_eog(self, tid: int) -> bool:
        return tid == EOG


def as_lists(batch):
    """token, pos and logits flags of an engine Batch as Python lists."""
    if hasattr(batch, "arrays"):
        batch.arrays()
    return ([int(t) for t in batch.token], [int(p) for p in batch.pos],
            [bool(w) for w in batch.logits])  # fmt: skip


class FakeCtx:
    def __init__(self, n_ctx: int = 64, n_batch: int = 8) -> None:
        self.n_ctx, self.n_batch, self.n_vocab = n_ctx, n_batch, V
        self.cells: dict[int, int] = {}  # pos -> token
        self.decoded: list[int] = []

    @staticmethod
    def next_of(tok: int) -> int:
        if tok == 25:
            return EOG
        if tok == 27:
            return 28
        if tok == 26:
            return 27
        return (tok + 1) % 26

    def decode(self, batch):
        token, pos_, logits = as_lists(batch)
        assert len(token) <= self.n_batch
        start = max(self.cells, default=-1) + 1
        assert pos_ == list(range(start, start + len(token))), "positions must continue"
        rows = []
        for tok, pos, want in zip(token, pos_, logits):
            assert pos < self.n_ctx
            self.cells[pos] = tok
            self.decoded.append(tok)
            if want:
                row = np.zeros(V, np.float32)
                row[self.next_of(tok)] = 10.0
                row[(tok + 2) % 26] = 5.0  # a runner-up for processors to promote
                rows.append(row)
        return np.array(rows, np.float32)

    def n_keep(self, seq, n):
        return n  # a plain KV cache: any prefix can be kept

    def seq_rm(self, seq, p0, p1):
        p1 = 1 << 30 if p1 < 0 else p1
        p0 = 0 if p0 < 0 else p0
        self.cells = {p: t for p, t in self.cells.items() if not p0 <= p < p1}

    def seq_add(self, seq, p0, p1, delta):
        self.cells = {(p + delta if p0 <= p < p1 else p): t for p, t in self.cells.items()}

    def clear(self):
        self.cells = {}


class Argmax:
    def __init__(self) -> None:
        self.accepted: list[int] = []

    def sample(self, logits):
        t = int(np.argmax(logits))
        self.accepted.append(t)
        return t

    def accept(self, token):
        self.accepted.append(token)


def run(session, prompt, **kw):
    gen = session.generate(prompt, Argmax(), GenerationConfig(**kw))
    steps = list(gen)
    return gen, steps


@pytest.fixture
def session():
    return Session(FakeCtx(), FakeTokenizer())


def test_greedy_until_max_tokens(session):
    gen, steps = run(session, [0], max_tokens=5)
    assert gen.tokens == [1, 2, 3, 4, 5]
    assert gen.text == "bcdef" == "".join(s.text for s in steps)
    assert (gen.finish_reason, gen.stop_cause) == ("length", "max_tokens")
    # the last token is never decoded: the cache holds the prompt + 4 tokens
    assert session.tokens == [0, 1, 2, 3, 4]


def test_eog_stops_and_is_not_part_of_the_completion(session):
    gen, _ = run(session, [22], max_tokens=10)
    assert gen.tokens == [23, 24, 25]
    assert (gen.finish_reason, gen.stop_cause) == ("stop", "eog")


def test_ignore_eos_keeps_going(session):
    gen, _ = run(session, [24], max_tokens=4, stop_at_eog=False)
    assert gen.tokens == [25, EOG, 6, 7]  # the fake continues (31 + 1) % 26 = 6


def test_stop_string_across_tokens_is_held_back(session):
    gen, steps = run(session, [0], max_tokens=20, stop=["def"])
    assert gen.text == "bc"
    assert (gen.finish_reason, gen.stop_cause) == ("stop", "stop")
    # "d" and "de" could start the stop string: nothing after "bc" was ever released
    assert [s.text for s in steps] == ["b", "c", "", "", ""]
    assert gen.tokens == [1, 2, 3, 4, 5]  # tokens up to the one completing the stop string


def test_false_stop_prefix_is_released(session):
    gen, steps = run(session, [0], max_tokens=4, stop=["cx"])
    assert gen.text == "bcde"
    assert [s.text for s in steps] == ["b", "", "cd", "e"]


def test_held_back_tail_is_flushed_at_the_end(session):
    gen, steps = run(session, [0], max_tokens=2, stop=["cd"])
    assert gen.text == "bc"
    assert steps[-1].token is None and steps[-1].text == "c"


def test_earliest_stop_string_wins(session):
    gen, _ = run(session, [0], max_tokens=20, stop=["fgh", "de"])
    assert gen.text == "bc"


def test_utf8_is_released_whole(session):
    gen, steps = run(session, [26], max_tokens=2)  # " " -> 27 -> 28
    assert gen.tokens == [27, 28]
    assert [s.text for s in steps] == ["", "é"]


def test_utf8_helpers():
    u = Utf8Text()
    assert u.feed(b"a\xe2\x82") == "a"
    assert u.feed(b"\xac") == "€"
    assert u.feed(b"\xff") == "\ufffd"
    m = StopMatcher(["</s>"])
    assert m.feed("hello <") == "hello "
    assert m.feed("/") == ""
    assert m.feed("x") == "</x"
    assert m.matched is None


def test_context_full_finishes_with_length():
    s = Session(FakeCtx(n_ctx=8), FakeTokenizer())
    gen, _ = run(s, [0, 1, 2], max_tokens=-1)
    # prompt + completion fill the context exactly
    assert len(gen.tokens) == 5
    assert (gen.finish_reason, gen.stop_cause) == ("length", "context")


def test_context_shift_keeps_going():
    ctx = FakeCtx(n_ctx=8)
    s = Session(ctx, FakeTokenizer())
    gen, _ = run(s, [0, 1, 2], max_tokens=12, context_shift=True, n_keep=1)
    assert len(gen.tokens) == 12 and gen.finish_reason == "length"
    assert gen.n_shifted >= 1
    assert s.tokens[0] == 0  # the kept token
    # the session mirrors the fake cache (positions 0..n-1)
    assert [ctx.cells[p] for p in sorted(ctx.cells)] == s.tokens


def test_prompt_longer_than_context_names_both_lengths():
    s = Session(FakeCtx(n_ctx=8), FakeTokenizer())
    with pytest.raises(ContextOverflowError, match=r"9 tokens.*n_ctx = 8"):
        run(s, list(range(9)))
    with pytest.raises(ValueError):  # also a ValueError, as llama-cpp-python raises
        run(s, list(range(8)))


def test_prefix_reuse_decodes_only_the_new_suffix(session):
    ctx = session.ctx
    gen, _ = run(session, [0, 1, 2], max_tokens=3)
    assert ctx.decoded == [0, 1, 2, 3, 4]  # prompt, then all but the last generated token
    ctx.decoded.clear()
    prompt2 = [0, 1, 2, *gen.tokens, 9, 10]
    run(session, prompt2, max_tokens=1)
    assert ctx.decoded == [5, 9, 10]  # cached: 0 1 2 3 4
    ctx.decoded.clear()
    run(session, [0, 1, 7], max_tokens=1)
    assert ctx.decoded == [7]  # diverges after two tokens


def test_same_prompt_twice_decodes_at_most_one_token(session):
    run(session, [0, 1, 2], max_tokens=1)  # the cache holds exactly the prompt
    session.ctx.decoded.clear()
    gen, _ = run(session, [0, 1, 2], max_tokens=2)
    assert session.ctx.decoded == [3]  # exact hit: only the new token
    session.ctx.decoded.clear()
    gen, _ = run(session, [0, 1, 2], max_tokens=1)  # the cache holds the prompt + 1 token
    assert session.ctx.decoded == [2]  # the last prompt token again, for its logits
    assert gen.tokens == [3]


def test_batches_respect_n_batch():
    s = Session(FakeCtx(n_batch=4), FakeTokenizer())
    gen, _ = run(s, list(range(10)), max_tokens=2)
    assert gen.tokens == [10, 11]
    assert s.timings.n_p_eval == 10 and s.timings.n_eval == 1


def test_logits_processor_sees_history_and_changes_choice(session):
    seen = []

    def promote_runner_up(input_ids, scores):
        seen.append(input_ids.tolist())
        out = scores.copy()
        out[int(np.argmax(scores))] = -np.inf
        return out

    gen, _ = run(session, [0, 1], max_tokens=2, logits_processors=[promote_runner_up])
    assert gen.tokens == [3, 5]  # runner-up = token + 2
    assert seen == [[0, 1], [0, 1, 3]]
    assert seen[0][0] == 0 and isinstance(seen[0], list)


def test_stopping_criteria_drop_the_token(session):
    calls = []

    def after_three(input_ids, logits):
        calls.append(len(input_ids))
        return len(input_ids) >= 4

    gen, _ = run(session, [0, 1], max_tokens=10, stopping_criteria=[after_three])
    # llama-cpp-python semantics: input_ids are the decoded tokens; the token sampled when
    # the criterion fires is not part of the completion
    assert gen.tokens == [2, 3]
    assert (gen.finish_reason, gen.stop_cause) == ("stop", "criteria")
    assert calls == [2, 3, 4]


def test_keep_logits_and_prompt_logits():
    s = Session(FakeCtx(), FakeTokenizer(), keep_logits=True)
    gen, steps = run(s, [0, 1, 2], max_tokens=2, keep_logits=True, prompt_logits=True)
    assert gen.prompt_logits.shape == (3, V)
    assert [int(np.argmax(r)) for r in gen.prompt_logits] == [1, 2, 3]
    assert [int(np.argmax(s.logits)) for s in steps] == [3, 4]
    # reused prefix keeps its logits: no re-decode of the prompt
    s.ctx.decoded.clear()
    gen2, _ = run(s, [0, 1, 2, 3, 9], max_tokens=1, prompt_logits=True)
    assert s.ctx.decoded == [9]
    assert [int(np.argmax(r)) for r in gen2.prompt_logits] == [1, 2, 3, 4, 10]


def test_prompt_logits_without_kept_logits_redecode(session):
    run(session, [0, 1, 2], max_tokens=1)
    session.ctx.decoded.clear()
    gen, _ = run(session, [0, 1, 2], max_tokens=1, prompt_logits=True)
    assert session.ctx.decoded == [0, 1, 2]
    assert gen.prompt_logits.shape == (3, V)


def test_accept_prompt_feeds_the_sampler(session):
    sampler = Argmax()
    list(session.generate([4, 5], sampler, GenerationConfig(max_tokens=1, accept_prompt=True)))
    assert sampler.accepted == [4, 5, 6]


def test_closing_early_leaves_the_cache_consistent(session):
    gen = session.generate([0], Argmax(), GenerationConfig(max_tokens=10))
    next(gen), next(gen)
    gen.close()
    assert gen.finish_reason is None
    assert session.tokens == [0, 1]
    assert sorted(session.ctx.cells) == [0, 1]


def test_timings_report_has_llama_cpp_lines(session):
    run(session, [0, 1, 2], max_tokens=3)
    report = session.timings.report("common_perf_print")
    for key in ("sampling time", "load time", "prompt eval time", "eval time", "total time"):
        assert f"common_perf_print: {key:>16} = " in report
    assert "/     3 tokens" in report and "/     2 runs" in report


def test_timings_reset_keeps_the_load_time(session):
    session.timings.t_load = 1.5
    run(session, [0, 1], max_tokens=2)
    session.timings.reset()
    t = session.timings
    assert (t.n_p_eval, t.n_eval, t.n_sample, t.t_load) == (0, 0, 0, 1.5)
