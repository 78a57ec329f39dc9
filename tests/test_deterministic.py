"""Batch invariance of a deterministic context (``ContextParams.deterministic``, ``run``/
``serve``/``perplexity --deterministic``): a sequence's logits after its prompt and after
every greedy token are the same bits whether it is decoded alone, in ubatches of any size,
with any thread count, beside other sequences in the same batches, or in cells placed
anywhere in the cache (after another sequence, out of position order after a removal,
reused sliding-window cells)."""

from __future__ import annotations

import numpy as np
import pytest

from llamacpy.engine import Batch, Context, ContextParams

pytestmark = [pytest.mark.real_model, pytest.mark.slow]

N_GEN = 6


def _prompt(ctx: Context, n: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return [1, *rng.integers(10, min(ctx.n_vocab, 30000), n - 1).tolist()]


def _params(**kw) -> ContextParams:
    base = dict(n_ctx=1024, n_batch=1024, n_seq_max=3, deterministic=True)
    return ContextParams(**{**base, **kw})


def _alone(ctx: Context, prompt: list[int], seq: int = 0, pos0: int = 0) -> list[np.ndarray]:
    """The prompt in one decode call, then greedy tokens one at a time."""
    out = [ctx.decode(Batch.from_tokens(prompt[pos0:], pos0, seq))[-1].copy()]
    for i in range(N_GEN):
        t = int(np.argmax(out[-1]))
        out.append(ctx.decode(Batch().add(t, len(prompt) + i, seq, True))[-1].copy())
    return out


def _beside(
    ctx: Context, prompt: list[int], other: list[int], seq: int = 2, other_seq: int = 1
) -> list[np.ndarray]:
    """Sequence ``seq`` (``prompt``) and ``other_seq`` (``other``) in the same batches,
    their tokens interleaved; both continue greedily, one token each per decode call."""
    b = Batch()
    for i in range(max(len(prompt), len(other))):
        if i < len(other):
            b.add(other[i], i, other_seq, i == len(other) - 1)
        if i < len(prompt):
            b.add(prompt[i], i, seq, i == len(prompt) - 1)
    lg = ctx.decode(b)
    # the other's last token comes first unless its prompt is the longer one (in a tie both
    # are in the last pair, the other's first)
    o, mine = (lg[0], lg[1]) if len(other) <= len(prompt) else (lg[1], lg[0])
    out = [mine.copy()]
    for i in range(N_GEN):
        b = Batch()
        b.add(int(np.argmax(o)), len(other) + i, other_seq, True)
        b.add(int(np.argmax(out[-1])), len(prompt) + i, seq, True)
        lg = ctx.decode(b)
        o = lg[0]
        out.append(lg[1].copy())
    return out


def _scattered(ctx: Context, prompt: list[int], filler: list[int]) -> list[np.ndarray]:
    """The prompt's second half lands in cells before its first half: sequence 1 fills the
    first cells, the first half follows, sequence 1 is removed, the rest goes to the freed
    cells."""
    ctx.decode(Batch.from_tokens(filler, 0, 1, logits="none"))
    half = len(prompt) // 2
    ctx.decode(Batch.from_tokens(prompt[:half], 0, 0, logits="none"))
    ctx.seq_rm(1, -1, -1)
    out = _alone(ctx, prompt, 0, pos0=half)
    kv = getattr(ctx.kv, "base", ctx.kv)
    cells = np.flatnonzero(kv.pos >= 0)
    order = kv.pos[cells]
    assert (np.diff(order) < 0).any(), "the cells were expected out of position order"
    return out


def _check(name: str, want: list[np.ndarray], got: list[np.ndarray]) -> None:
    for i, (a, b) in enumerate(zip(want, got, strict=True)):
        assert np.array_equal(a, b), f"{name}: logits differ at step {i}"


@pytest.mark.parametrize("model", ["smollm2_path", "gemma3_path"])
def test_logits_do_not_depend_on_batch_ubatch_threads_or_cells(model, request):
    path = request.getfixturevalue(model)
    ctx = Context(path, _params(n_ubatch=512, n_threads=2, n_threads_batch=2))
    lengths = (1, 37, 130)
    prompts = [_prompt(ctx, n, seed=n) for n in lengths]
    want = []
    for p in prompts:
        ctx.clear()
        want.append(_alone(ctx, p))
    m = ctx.model
    for ub, t in ((1, 1), (7, 2), (64, 1), (512, 1)):
        c = Context(path, _params(n_ubatch=ub, n_threads=t, n_threads_batch=t), model=m)
        for n, p, w in zip(lengths, prompts, want, strict=True):
            _check(f"n={n} ub={ub} t={t} alone", w, _alone(c, p))
            c.clear()
            other = _prompt(c, 53, seed=1000 + n)
            _check(f"n={n} ub={ub} t={t} beside", w, _beside(c, p, other))
            c.clear()
            if n > 2:
                filler = _prompt(c, 90, seed=2000 + n)
                _check(f"n={n} ub={ub} t={t} scattered", w, _scattered(c, p, filler))
                c.clear()


def test_gemma3_window_cells_reused_past_the_window(gemma3_path):
    """Gemma-3's sliding-window layers keep a window-sized cache whose cells are taken again:
    a 900-token prompt gives the same logits decoded in one call (1024 window cells), in
    ubatches of 100 (768 cells: the first positions' cells are taken again) and beside
    another sequence."""
    ctx = Context(gemma3_path, _params(n_ctx=4096, n_batch=2048, n_ubatch=512, n_seq_max=1))
    p = _prompt(ctx, 900, seed=7)
    want = _alone(ctx, p)
    c = Context(gemma3_path, _params(n_ctx=4096, n_batch=2048, n_ubatch=100, n_seq_max=1),
                model=ctx.model)  # fmt: skip
    _check("ub=100", want, _alone(c, p))
    win = c.kv.swa
    assert win.n_ctx == 768 and (np.diff(win.pos[win.pos >= 0]) < 0).any()  # cells wrapped
    c = Context(gemma3_path, _params(n_ctx=4096, n_batch=2048, n_ubatch=100, n_seq_max=2),
                model=ctx.model)  # fmt: skip
    _check("beside", want, _beside(c, p, _prompt(c, 300, seed=8), seq=1, other_seq=0))


def test_server_requests_together_give_the_tokens_and_logprobs_of_each_alone(smollm2_path):
    """``serve --deterministic``: requests decoded in the same batches (prompt chunks beside
    other sequences' tokens, cells wherever the slots put them) return exactly the tokens
    and log-probabilities each returns alone."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    from llamacpy.api.serving import ServingModel
    from llamacpy.server import ServerConfig, ServerState
    from test_server import PROMPTS, running

    params = ContextParams(n_ctx=1536, n_batch=64, n_ubatch=64, n_threads=2, n_threads_batch=2,
                           n_seq_max=3, deterministic=True)  # fmt: skip
    model = ServingModel.load(str(smollm2_path), params, n_parallel=3, max_queue=8)
    with running(ServerState(ServerConfig(timeout=600), model, model_name="m")) as base:

        def run(p: str) -> list:
            body = dict(prompt=p, n_predict=12, temperature=0, cache_prompt=False, n_probs=3)
            r = httpx.post(base + "/completion", json=body, timeout=600)
            assert r.status_code == 200, r.text
            return [(c["id"], c["logprob"], [t["logprob"] for t in c["top_logprobs"]])
                    for c in r.json()["completion_probabilities"]]  # fmt: skip

        alone = [run(p) for p in PROMPTS]
        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            together = list(pool.map(run, PROMPTS))
    assert together == alone
    c = model.scheduler.counters
    assert c.n_busy_slots > c.n_decode  # several sequences per decode


@pytest.mark.parametrize("cmd", [["run", "-p", "x"], ["perplexity", "-f", "text.txt"]])
def test_the_flag_reaches_the_context(cmd, monkeypatch, tmp_path):
    from llamacpy import cli
    from llamacpy.api import model as api_model

    seen = []

    class Stop(Exception):
        pass

    def load(path, params, kv_overrides=None):
        seen.append(params)
        raise Stop

    monkeypatch.setattr(api_model, "load_model", load)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "text.txt").write_text("some text " * 50)
    for flags in ([], ["--deterministic"]):
        with pytest.raises(Stop):
            cli.main([cmd[0], "-m", str(tmp_path / "m.gguf"), *cmd[1:], *flags])
    assert [p.deterministic for p in seen] == [False, True]
