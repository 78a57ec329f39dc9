"""Speculative decoding (``api.speculative``, ``Context.decode(single_numerics=True)``): the
proposers, the cost-aware choice of how much to verify, and the one promise that matters --
the generated tokens (greedy, or sampled with a seed) are those of plain decoding, while
proposals are really verified and rejected ones really leave the cache."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from llamacpy import cli
from llamacpy.api.generation import GenerationConfig, Session
from llamacpy.api.speculative import (
    CallableProposer,
    DraftModel,
    NgramMap,
    NgramMod,
    NgramSimple,
    PromptLookup,
    Speculator,
    as_proposer,
    check_draft_vocab,
    make_proposer,
)
from llamacpy.engine import Batch, Context, ContextParams
from llamacpy.errors import UsageError

CLI_CASES = json.loads(
    (Path(__file__).parent / "fixtures" / "generation" / "cli_completions.json").read_text()
)


# ---------------------------------------------------------------------- proposers
def test_ngram_simple_proposes_what_followed_the_last_earlier_occurrence():
    rng = np.random.default_rng(0)
    body = rng.integers(100, 200, 80).tolist()
    # the body twice, then its first 20 tokens: the last 12 tokens occurred at body[8:20]
    # (twice; the later occurrence counts), followed by body[20:]
    hist = [7, *body, *body, *body[:20]]
    got = NgramSimple(size_n=12, size_m=48).propose(hist, 100)
    assert got == body[20:68]
    assert NgramSimple(12, 48).propose(hist, 5) == body[20:25]
    # nothing when the pattern never occurred before, or the history is short
    assert NgramSimple(12, 48).propose([*body, 999], 10) == []
    assert NgramSimple(12, 48).propose(body[:40], 10) == []


def test_prompt_lookup_prefers_the_longest_ngram():
    hist = [1, 2, 3, 9, 9, 5, 2, 3, 4, 6, 7, 1, 2, 3]
    # the 2-gram (2, 3) occurred twice; the later one (index 6) is followed by 4 6 7
    assert PromptLookup(max_ngram_size=2, num_pred_tokens=3).propose(hist, 10) == [4, 6, 7]
    assert PromptLookup(3, 10).propose(hist, 2) == [9, 9]  # (1, 2, 3) at the start
    assert PromptLookup(2, 10).propose([5, 6, 7], 10) == []


def test_ngram_map_follows_the_most_frequent_continuation():
    m = NgramMap(size_n=2, size_m=8, min_hits=2)
    hist = [1, 2, 3, 1, 2, 3, 1, 2, 4, 1, 2]
    assert m.propose(hist, 10)[:1] == [3]  # (1, 2) -> 3 twice, -> 4 once
    assert NgramMap(2, 8, min_hits=3).propose(hist, 10) == []
    k4v = NgramMap(2, 8, 1, values=4)
    assert k4v.name == "ngram-map-k4v" and k4v.propose(hist, 1) == [3]


def test_ngram_mod_chains_and_respects_n_min():
    hist = list(range(30)) + list(range(5))
    mod = NgramMod(n_match=3, n_max=10, n_min=4)
    assert mod.propose(hist, 20) == list(range(5, 15))
    assert NgramMod(n_match=3, n_max=10, n_min=40).propose(hist, 20) == []


def test_proposer_factory_and_bad_settings():
    assert make_proposer("none") is None
    assert isinstance(make_proposer("ngram-simple"), NgramSimple)
    assert isinstance(make_proposer("prompt-lookup"), PromptLookup)
    for bad, what in [("bogus", "expected one of"), ("ngram-cache", "not supported yet"),
                      ("draft-simple", "needs a draft model")]:  # fmt: skip
        with pytest.raises(UsageError, match=what):
            make_proposer(bad)
    with pytest.raises(UsageError, match="size-n"):
        NgramSimple(size_n=0)
    with pytest.raises(UsageError, match="min hits"):
        NgramMap(min_hits=0)
    with pytest.raises(UsageError, match="draft_model must be"):
        as_proposer(42)
    assert isinstance(as_proposer(lambda ids: ids[-3:]), CallableProposer)


def test_speculator_verifies_only_what_pays():
    sp = Speculator(PromptLookup(2, 10))
    hist = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2]
    # cheap batches (a memory-bound decode): most of the ten proposals are worth verifying
    # (at the prior acceptance rate 0.8, the expected gain of the 9th is below its cost)
    for n in range(1, 12):
        sp.timed(n, 0.010 + 0.0005 * (n - 1))
    assert sp.propose(hist, 100) == [3, 4, 5, 6, 7, 8, 9, 10]
    assert sp.propose(hist, 4) == [3, 4, 5, 6]  # (room)
    # a batch costs as much as its tokens one by one: never worth it
    for n in range(1, 12):
        for _ in range(20):
            sp.timed(n, 0.010 * n)
    assert sp.propose(hist, 100) == []
    # proposals that keep failing make even cheap batches not worth it
    sp2 = Speculator(PromptLookup(2, 10))
    for n in range(1, 12):
        sp2.timed(n, 0.010 + 0.005 * (n - 1))
    for _ in range(30):
        sp2.record(4, 0)
    assert sp2.propose(hist, 100) == []
    assert sp2.stats.n_drafted == 120 and sp2.stats.acceptance == 0.0
    # ... and the evidence fades while it does not speculate: it tries again
    for _ in range(200):
        sp2.propose(hist, 100)
    assert sp2.propose(hist, 100)
    # a spike (first use of a kernel) is not taken as the cost of that size
    sp3 = Speculator(PromptLookup(2, 10))
    sp3.timed(1, 0.01)
    sp3.timed(3, 5.0)
    assert sp3.cost(3) < 0.05


# ---------------------------------------------------------------------- real models


class _Greedy:
    def sample(self, row: np.ndarray) -> int:
        return int(np.argmax(row))

    def accept(self, token: int) -> None:
        pass


def _repetitive_prompt(tok, n_lines: int = 12) -> list[int]:
    src = Path(__file__).read_text().splitlines()[:n_lines]
    text = "Copy this file:\n" + "\n".join(src) + "\nCopy:\n" + "\n".join(src[:2])
    return tok.encode(text.encode(), add_special=True, parse_special=False)


@pytest.mark.real_model
@pytest.mark.parametrize("threads", [1, 2])
def test_single_numerics_rows_equal_one_token_decodes(gemma3_path, threads):
    """Gemma-3's Q4_K batched matmul differs from its one-token one; verification rows must
    not: across the 256-cell padding step, the 512-cell split-attention threshold and the
    sliding-window cache's reuse of cells."""
    ctx = Context(gemma3_path, ContextParams(n_ctx=1536, n_batch=1536, n_threads=threads))
    rng = np.random.default_rng(threads)
    for plen in (250, 507, 1100):
        prompt = [2, *rng.integers(100, 20000, plen - 1).tolist()]
        cont = rng.integers(100, 20000, 9).tolist()
        ctx.clear()
        ctx.decode(Batch.from_tokens(prompt))
        one = [ctx.decode(Batch().add(t, plen + i, 0, True))[-1].copy() for i, t in enumerate(cont)]
        ctx.seq_rm(0, plen, -1)
        rows = ctx.decode(Batch.from_tokens(cont, pos0=plen, logits="all"), single_numerics=True)
        for i in range(len(cont)):
            assert np.array_equal(rows[i], one[i]), (plen, i)


def _fresh(ctx, tok) -> Session:
    s = Session(ctx, tok)
    s.reset()
    return s


def _generate(session, prompt, spec, n, sampler=None, **kw):
    cfg = GenerationConfig(max_tokens=n, speculator=spec, **kw)
    return session.generate(prompt, sampler or _Greedy(), cfg).run()


@pytest.mark.real_model
@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_greedy_tokens_equal_plain_decoding(model, smollm2_path, gemma3_path):
    from llamacpy.api.model import load_model

    path = smollm2_path if model == "smollm2" else gemma3_path
    loaded = load_model(path, ContextParams(n_ctx=1024, n_threads=2))
    ctx, tok = loaded.ctx, loaded.tokenizer
    prompt = _repetitive_prompt(tok)
    s0 = _fresh(ctx, tok)
    plain = _generate(s0, prompt, None, 48)
    # (a second request continuing the first one's cache)
    ref = _generate(s0, [*prompt, *plain.tokens], None, 16)
    for kind in ("ngram-simple", "prompt-lookup", "ngram-map-k", "ngram-mod"):
        if kind == "ngram-mod":
            prop = NgramMod(n_match=4, n_max=16, n_min=1)
        elif kind == "ngram-simple":
            prop = NgramSimple(size_n=3, size_m=8)
        else:
            prop = make_proposer(kind)
        spec = Speculator(prop, adaptive=False)  # verify every proposal
        s = _fresh(ctx, tok)
        gen = _generate(s, prompt, spec, 48)
        assert gen.tokens == plain.tokens, kind
        assert gen.text == plain.text
        st = spec.stats
        assert st.n_drafted > 0, kind
        # the cache holds exactly the prompt and the completion but its last token
        assert s.tokens == [*prompt, *gen.tokens[:-1]]
        assert ctx.kv.seq_pos_max(0) == len(s.tokens) - 1
        # a second request continues from that cache as plain decoding does
        more = _generate(s, [*prompt, *gen.tokens], spec, 16)
        assert more.tokens == ref.tokens, kind


@pytest.mark.real_model
def test_rejections_happen_and_stops_inside_a_verified_run(smollm2_path):
    from llamacpy.api import Llama, LlamaPromptLookupDecoding

    kw = dict(n_ctx=1024, n_threads=2, verbose=False)
    plain = Llama(str(smollm2_path), **kw)
    spec = Llama(str(smollm2_path), draft_model=LlamaPromptLookupDecoding(2, 8), **kw)
    spec._speculator.adaptive = False
    text = Path(__file__).read_text()[:1500]
    prompt = text + "\n\n" + text[:200]
    for temp, seed in [(0.0, 1), (0.8, 1), (0.8, 2), (1.2, 3), (0.8, 4)]:
        a = plain.create_completion(prompt, max_tokens=40, temperature=temp, seed=seed)
        b = spec.create_completion(prompt, max_tokens=40, temperature=temp, seed=seed)
        assert a["choices"][0]["text"] == b["choices"][0]["text"], (temp, seed)
    st = spec._speculator.stats
    assert st.n_accepted > 0 and st.n_drafted > st.n_accepted  # some proposals rejected
    # a grammar: its state follows the tokens actually sampled
    from llamacpy.api import LlamaGrammar

    g = 'root ::= [a-z \\n]+ "." [a-z \\n.]*'
    a = plain.create_completion(prompt, max_tokens=40, temperature=0,
                                grammar=LlamaGrammar.from_string(g))  # fmt: skip
    b = spec.create_completion(prompt, max_tokens=40, temperature=0,
                               grammar=LlamaGrammar.from_string(g))  # fmt: skip
    assert a["choices"][0]["text"] == b["choices"][0]["text"]
    # a stop string and max_tokens landing inside accepted proposals
    for stop, n in [(["def "], 60), ([], 7), ([], 1)]:
        a = plain.create_completion(prompt, max_tokens=n, temperature=0, stop=stop)
        b = spec.create_completion(prompt, max_tokens=n, temperature=0, stop=stop)
        assert a["choices"][0] == b["choices"][0]


@pytest.mark.real_model
def test_draft_model_of_the_same_vocabulary(smollm2_path, gemma3_path):
    from llamacpy.api.model import load_model

    target = load_model(smollm2_path, ContextParams(n_ctx=512, n_threads=2))
    draft = load_model(smollm2_path, ContextParams(n_ctx=512, n_threads=2))
    check_draft_vocab(target.tokenizer, draft.tokenizer)
    prompt = target.tokenizer.encode(b"The capital of France is", add_special=True)
    plain = _generate(_fresh(target.ctx, target.tokenizer), prompt, None, 24)
    spec = Speculator(DraftModel(Session(draft.ctx, draft.tokenizer), n_max=4), adaptive=False)
    gen = _generate(_fresh(target.ctx, target.tokenizer), prompt, spec, 24)
    assert gen.tokens == plain.tokens
    assert spec.stats.n_accepted == spec.stats.n_drafted > 0  # the same model agrees
    other = load_model(gemma3_path, ContextParams(n_ctx=256, n_threads=1))
    with pytest.raises(UsageError, match="same vocabulary"):
        check_draft_vocab(target.tokenizer, other.tokenizer)


@pytest.mark.real_model
@pytest.mark.parametrize("case", CLI_CASES["cases"][:4], ids=lambda c: c["name"])
def test_cli_output_with_speculation_is_llama_completions(capsys, smollm2_path, case):
    code = cli.main(["run", "-m", str(smollm2_path), "-t", "1", "--no-display-prompt", "-p",
                     case["prompt"], "-n",
                     str(CLI_CASES["n_predict"]), "-c", str(CLI_CASES["n_ctx"]),
                     *case["flags"], "--spec-type", "prompt-lookup", "--spec-no-adapt"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out == case["text"] + "\n"


def test_cli_speculation_errors(capsys, smollm2_path):
    for flags, what in [
        (["--spec-type", "bogus"], "expected one of"),
        (["--spec-type", "ngram-simple,ngram-mod"], "give one type"),
        (["--spec-type", "ngram-simple", "--spec-draft-n-max", "0"], "at least 1"),
        (["-lcs", "x.bin", "--spec-type", "ngram-cache"], "not supported yet"),
    ]:
        code = cli.main(["run", "-m", str(smollm2_path), "-p", "x", "-n", "1", *flags])
        _, err = capsys.readouterr()
        assert code == 1 and what in err and "Traceback" not in err, (flags, err)


def test_serve_refuses_a_draft_model_before_loading(capsys, smollm2_path):
    code = cli.main(["serve", "-m", str(smollm2_path), "-md", str(smollm2_path), "--port", "0"])
    _, err = capsys.readouterr()
    assert code == 1 and "draft models are not supported yet" in err
