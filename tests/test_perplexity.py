"""Perplexity with llama-perplexity's method: chunking, BOS substitution, second-half
scoring, parallel sequences (on a fake engine), and the number on SmolLM2 compared with
llama-perplexity's (fixtures/generation/perplexity.json, same text file)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from llamacpy import cli
from llamacpy.errors import UsageError
from llamacpy.eval.perplexity import chunk_nll, perplexity

FIXTURES = Path(__file__).parent / "fixtures" / "generation"
PPL = json.loads((FIXTURES / "perplexity.json").read_text())
V = 16


class FakeTokenizer:
    add_bos = True
    bos = 15

    def __init__(self, add_bos: bool = True) -> None:
        self.add_bos = add_bos

    def encode(self, text, add_special=True, parse_special=False):
        assert not parse_special
        ids = [b % 14 for b in text]
        return [self.bos, *ids] if add_special and self.add_bos else ids


class FakeCtx:
    """Logits depend on (token, position, sequence-local history length) only."""

    def __init__(self, n_batch: int, n_ctx: int = 4096) -> None:
        self.n_batch, self.n_ctx, self.n_vocab = n_batch, n_ctx, V
        self.batches = []
        self.cleared = 0

    def clear(self):
        self.cleared += 1

    def decode(self, batch, **kw):
        if hasattr(batch, "arrays"):
            batch.arrays()
        token = [int(t) for t in batch.token]
        pos_ = [int(p) for p in batch.pos]
        want_ = [bool(w) for w in batch.logits]
        self.batches.append((token, pos_, want_))
        rows = []
        for tok, pos, want in zip(token, pos_, want_):
            if want:
                row = np.arange(V, dtype=np.float32) * 0.1
                row[(tok + 1) % V] += 2.0 + 0.01 * pos
                rows.append(row)
        return np.array(rows, np.float32)


def reference_ppl(tokens, n_ctx, n_chunk, bos):
    nll, count = [], 0
    for c in range(n_chunk):
        chunk = list(tokens[c * n_ctx : (c + 1) * n_ctx])
        if bos is not None:
            chunk[0] = bos
        for i in range(n_ctx // 2, n_ctx - 1):
            row = np.arange(V, dtype=np.float64) * 0.1
            row[(chunk[i] + 1) % V] += 2.0 + 0.01 * i
            lse = math.log(np.exp(row - row.max()).sum()) + row.max()
            nll.append(lse - row[tokens[c * n_ctx + i + 1]])
            count += 1
    return math.exp(sum(nll) / count)


@pytest.mark.parametrize("n_batch", [8, 16, 32, 64])  # several batches / one / 2 and 4 seqs
def test_method_matches_llama_perplexity(n_batch):
    text = bytes(range(200))
    tok = FakeTokenizer()
    ctx = FakeCtx(n_batch)
    res = perplexity(ctx, tok, text, n_ctx=16, n_batch=n_batch, n_chunks=5)
    tokens = tok.encode(text)
    assert res.n_chunks == 5 and res.count == 5 * 7
    assert res.ppl == pytest.approx(reference_ppl(tokens, 16, 5, tok.bos), rel=1e-6)
    assert len(res.running) == 5 and res.running[-1] == res.ppl
    # BOS replaces the first token of every chunk; positions restart at 0 for each sequence
    first = [t for token, pos, _ in ctx.batches for t, p in zip(token, pos) if p == 0]
    assert first == [tok.bos] * 5
    # only the second half asks for logits
    for _token, pos, want in ctx.batches:
        assert all(w == (p >= 8) for p, w in zip(pos, want))


def test_no_bos_substitution_without_add_bos():
    tok = FakeTokenizer(add_bos=False)
    text = bytes(range(64))
    res = perplexity(FakeCtx(16), tok, text, n_ctx=16, n_batch=16)
    assert res.n_chunks == 4
    assert res.ppl == pytest.approx(reference_ppl(tok.encode(text), 16, 4, None), rel=1e-6)


def test_errors_name_the_numbers():
    with pytest.raises(UsageError, match="at least 64 tokens.*only 21"):
        perplexity(FakeCtx(16), FakeTokenizer(), bytes(20), n_ctx=32, n_batch=16)
    with pytest.raises(UsageError, match="multiple"):
        perplexity(FakeCtx(48), FakeTokenizer(), bytes(200), n_ctx=32, n_batch=48)


def test_chunk_nll_is_log_softmax():
    logits = np.array([[0.0, 1.0, 2.0], [5.0, 0.0, 0.0]], np.float32)
    v = chunk_nll(logits, np.array([2, 1]))
    lse = [math.log(1 + math.e + math.e**2), 5 + math.log(1 + 2 * math.exp(-5))]
    assert v == pytest.approx([lse[0] - 2.0, lse[1] - 0.0], rel=1e-6)


@pytest.mark.parametrize("run", [r for r in PPL["runs"] if r["n_ctx"] == 256], ids=str)
def test_smollm2_matches_llama_perplexity(smollm2_path, capsys, run):
    code = cli.main(["perplexity", "-m", str(smollm2_path), "-f", str(FIXTURES / PPL["file"]),
                     "-c", str(run["n_ctx"]), "--chunks", str(run["chunks"]), "-b", "256",
                     "-t", "1"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    assert re.fullmatch(r"(\[\d+\]\d+\.\d{4},)+\n", out.splitlines(keepends=True)[0])
    m = re.search(r"^Final estimate: PPL = (\d+\.\d{4}) \+/- (\d+\.\d{5})$", out, re.M)
    assert m, out
    assert float(m[1]) == pytest.approx(run["ppl"], rel=0.005)  # within 0.5%
    assert float(m[2]) == pytest.approx(run["ppl_err"], rel=0.05)
    assert "calculating perplexity over 4 chunks, n_ctx=256" in err
