"""llama-perplexity's KL-divergence mode: the log-probabilities file (``eval/logits_file.py``)
and the statistics (``eval/kld.py``).

* the stored rows and the statistics against independent float64 numpy computations;
* a file written through the perplexity loop (fake engine) read back;
* bad files: one error naming the file, the field and the byte offset, before anything is
  computed or allocated;
* against llama-perplexity (fixtures/kld from ``scripts/make_kld_fixtures.py``): the tiny
  random llama's base file byte for byte, the KLD report of its Q5_0 requantization line for
  line; SmolLM2's base file (sha256), the KLD reports of SmolLM2 itself and of its Q8_0
  requantization.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import struct
from pathlib import Path

import numpy as np
import pytest

from llamacpy import cli
from llamacpy.errors import LogitsFileError
from llamacpy.eval.kld import KLDStats, kl_divergence, median, percentile
from llamacpy.eval.logits_file import LogitsFile, LogitsWriter, compress_rows, row_width
from llamacpy.eval.perplexity import perplexity
from llamacpy.fileio import atomic_write
from llamacpy.gguf import GGMLType
from llamacpy.models.tiny import write_tiny_llama
from test_perplexity import FakeCtx, FakeTokenizer

ROOT = Path(__file__).parent / "fixtures"
FIX = json.loads((ROOT / "kld" / "kld.json").read_text())
TEXT = ROOT / FIX["text"]


def log_softmax64(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    m = x.max(axis=1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))


def decode(rows: np.ndarray, n_vocab: int) -> np.ndarray:
    """Stored rows back to float64 log-probabilities."""
    head = np.ascontiguousarray(rows[:, :4]).view("<f4").astype(np.float64)
    return head[:, :1] * rows[:, 4 : 4 + n_vocab] + head[:, 1:2]


def random_logits(rng, n: int, v: int, spread: float = 4.0) -> np.ndarray:
    return (rng.standard_normal((n, v)) * spread).astype(np.float32)


def test_rows_decode_to_the_log_softmax():
    rng = np.random.default_rng(1)
    v = 37  # odd: one pad value per row
    logits = random_logits(rng, 6, v, spread=6.0)  # ranges over 16: clamped low values
    logits[5] = 1.25  # a constant row: scale 0
    targets = rng.integers(0, v, 6)
    rows, nll = compress_rows(logits, targets)
    assert rows.shape == (6, row_width(v)) == (6, 42) and rows.dtype == np.uint16
    assert (rows[:, -1] == 0).all()  # the pad
    ref = log_softmax64(logits)
    head = np.ascontiguousarray(rows[:, :4]).view("<f4")
    got = decode(rows, v)
    for r in range(5):
        scale = float(head[r, 0])
        mx = float(logits[r].max())
        assert scale == pytest.approx((mx - max(float(logits[r].min()), mx - 16)) / 65535)
        live = logits[r] > mx - 16
        assert np.abs(got[r, live] - ref[r, live]).max() <= scale / 2 + 1e-5
        assert (rows[r, 4:][:v][~live] == 0).all()
    assert head[5, 0] == 0 and (rows[5, 4:] == 0).all()
    assert got[5] == pytest.approx(np.full(v, -math.log(v)), abs=1e-6)
    assert nll == pytest.approx(-ref[np.arange(6), targets], abs=1e-5)


def test_statistics_match_numpy():
    rng = np.random.default_rng(2)
    n, v = 150, 50
    base_logits = random_logits(rng, n, v)
    logits = base_logits + random_logits(rng, n, v, spread=0.3)
    targets = rng.integers(0, v, n)
    rows, _ = compress_rows(base_logits, targets)
    stats = KLDStats()
    stats.add(logits[:70], rows[:70], targets[:70])
    stats.add(logits[70:], rows[70:], targets[70:])
    lb = decode(rows, v)
    lq = log_softmax64(logits)
    ar = np.arange(n)
    kld = np.where(lb > -16, np.exp(lb) * (lb - lq), 0).sum(axis=1)
    nll, nll_base = -lq[ar, targets], -lb[ar, targets]
    p_diff = np.exp(-nll) - np.exp(-nll_base)
    assert stats.count == n
    assert stats.kld()[0] == pytest.approx(kld.mean(), rel=1e-5)
    assert stats.kld()[1] == pytest.approx(kld.std() / math.sqrt(n - 1), rel=1e-4)
    assert math.exp(stats.log_ppl()[0]) == pytest.approx(math.exp(nll.mean()), rel=1e-6)
    assert math.exp(stats.log_ppl_base()[0]) == pytest.approx(math.exp(nll_base.mean()), rel=1e-6)
    cov = np.cov(nll, nll_base, ddof=0)[0, 1] / (n - 1)
    assert stats.log_ppl_cov() == pytest.approx(cov, rel=1e-4)
    assert stats.p_diff_rms()[0] == pytest.approx(math.sqrt((p_diff**2).mean()), rel=1e-5)
    same = (logits.argmax(1) == lb.argmax(1)).sum()
    assert 0 < same < n and stats.n_same_top == same
    kv = np.sort(np.concatenate(stats.kld_values))
    assert kv == pytest.approx(np.sort(kld), abs=1e-6)
    for f in (0.001, 0.1, 0.5, 0.9, 0.999):
        assert percentile(kv, f) == pytest.approx(np.percentile(kv, 100 * f), rel=1e-5)
    assert median(kv) == pytest.approx(np.median(kv), rel=1e-6)
    assert median(kv[:-1]) == pytest.approx(np.median(kv[:-1]), rel=1e-6)
    report = stats.report()
    assert report[0] == "====== Perplexity statistics ======" and len(report) == 39
    assert report[9] == f"Mean    KLD: {kld.mean():10.6f} ± {kld.std() / math.sqrt(n - 1):10.6f}"
    assert report[-1].startswith(f"Same top p: {100 * same / n:6.3f} ± ")
    few = KLDStats()
    few.add(logits[:99], rows[:99], targets[:99])
    assert few.report() == []  # llama-perplexity prints no statistics under 100 values


def fake_base(tmp_path: Path, n_ctx: int = 16, chunks: int = 8) -> tuple[Path, float]:
    """A base file written by the perplexity loop over the fake engine; its PPL."""
    path = tmp_path / "base.bin"
    with open(path, "wb") as f:
        res = perplexity(FakeCtx(64), FakeTokenizer(), bytes(range(200)), n_ctx=n_ctx,
                         n_batch=64, n_chunks=chunks, logits_out=f)  # fmt: skip
    return path, res.ppl


def test_written_file_reads_back_and_scores_itself(tmp_path):
    path, ppl = fake_base(tmp_path)
    tok = FakeTokenizer()
    base = LogitsFile(path)
    assert (base.n_ctx, base.n_vocab, base.n_chunk, base.rows) == (16, 16, 8, 7)
    assert base.size == path.stat().st_size == 20 + 4 * 128 + 8 * 7 * 20 * 2
    assert base.tokens.tolist() == tok.encode(bytes(range(200)))[:128]
    ctx = FakeCtx(64)
    seen = []
    stats = kl_divergence(ctx, base, n_batch=64, n_seq=4, bos=tok.bos,
                          on_chunk=lambda i, s: seen.append(i))  # fmt: skip
    assert seen == list(range(1, 9)) and stats.count == 56
    assert stats.n_same_top == 56 and abs(stats.kld()[0]) < 1e-6
    assert math.exp(stats.log_ppl()[0]) == pytest.approx(ppl, rel=1e-6)
    assert math.exp(stats.log_ppl_base()[0]) == pytest.approx(ppl, rel=1e-4)
    # the first token of every chunk decoded as BOS, the file's tokens otherwise
    first = [t for token, pos, _ in ctx.batches for t, p in zip(token, pos) if p == 0]
    assert first == [tok.bos] * 8


def corrupt(path: Path, offset: int, data: bytes | None = None, size: int | None = None) -> Path:
    raw = bytearray(path.read_bytes())
    if data is not None:
        raw[offset : offset + len(data)] = data
    out = path.with_name(f"bad{len(list(path.parent.iterdir()))}.bin")
    out.write_bytes(bytes(raw[:size] if size is not None else raw))
    return out


def bad_cases(path: Path):
    chunk0 = 20 + 4 * 128
    row = 2 * 20
    return [
        (corrupt(path, 0, b"_logitz_"), "magic", 0, "not a log-probabilities file"),
        (corrupt(path, 0, size=5), "magic", 0, "not a log-probabilities file"),
        (corrupt(path, 0, size=14), "n_vocab", 14, "truncated header"),
        (corrupt(path, 8, struct.pack("<I", 2)), "n_ctx", 8, "scores no token"),
        (corrupt(path, 12, struct.pack("<i", -3)), "n_vocab", 12, "not positive"),
        (corrupt(path, 16, struct.pack("<i", 0)), "n_chunk", 16, "not positive"),
        # huge declared counts: refused from the size, nothing allocated
        (corrupt(path, 16, struct.pack("<i", 2**31 - 1)), "tokens[", path.stat().st_size,
         "2147483647 chunks of 16 tokens with 16 log-probabilities need"),
        (corrupt(path, 8, struct.pack("<I", 2**32 - 1)), "tokens[", path.stat().st_size,
         "need"),
        (corrupt(path, 0, size=100), "tokens[20]", 100, "the file has 100"),
        (corrupt(path, 0, size=chunk0 + 3 * 7 * row + 6), "log-probs of chunk 3",
         chunk0 + 3 * 7 * row + 6, "need"),
        (path.with_name("long.bin"), "end of the last chunk", path.stat().st_size, "need"),
        (corrupt(path, 20 + 4 * 37, struct.pack("<i", 16)), "tokens[37]", 20 + 4 * 37,
         "token 16 is outside the vocabulary of 16"),
        (corrupt(path, chunk0 + 9 * row, struct.pack("<f", math.nan)),
         "log-probs of chunk 1", chunk0 + 9 * row, "row 2 of chunk 1"),
        (corrupt(path, chunk0 + row, struct.pack("<f", -1.0)), "log-probs of chunk 0",
         chunk0 + row, "row 1 of chunk 0"),
    ]  # fmt: skip


def test_bad_files_name_the_field_and_offset(tmp_path):
    path, _ = fake_base(tmp_path)
    path.with_name("long.bin").write_bytes(path.read_bytes() + b"\0\0")
    for bad, field, offset, what in bad_cases(path):
        with pytest.raises(LogitsFileError) as e:
            LogitsFile(bad)
        msg = str(e.value)
        assert msg.startswith(f"{bad}: ") and what in msg, msg
        assert e.value.field.startswith(field) and e.value.offset == offset, msg
        assert msg.endswith(f"at byte offset {offset})"), msg
    with pytest.raises(LogitsFileError, match="vocabulary of 16 tokens, the model has 17"):
        LogitsFile(path).check_vocab(17)
    with pytest.raises(LogitsFileError, match="cannot read"):
        LogitsFile(tmp_path / "missing.bin")


def test_cli_refuses_a_bad_file_before_loading(tmp_path, capsys):
    path, _ = fake_base(tmp_path)
    bad = corrupt(path, 0, size=300)
    # the model does not exist: the file's error comes first
    code = cli.main(["perplexity", "-m", str(tmp_path / "none.gguf"), "--kl-divergence",
                     "--kl-divergence-base", str(bad)])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 1 and out == ""
    assert err.strip().count("\n") == 0 and str(bad) in err and "byte offset 300" in err
    code = cli.main(["perplexity", "-m", str(tmp_path / "none.gguf"), "--kl-divergence"])
    assert code == 1 and "--kl-divergence-base" in capsys.readouterr().err


def test_cli_refuses_an_unwritable_base_before_loading(tmp_path, capsys):
    target = tmp_path / "no" / "base.bin"
    code = cli.main(["perplexity", "-m", str(tmp_path / "none.gguf"), "-f", str(TEXT),
                     "--kl-divergence-base", str(target)])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 1 and out == "" and f"cannot write {target}" in err


def test_cli_refuses_another_vocabulary_before_computing(tmp_path, capsys):
    model = tmp_path / "tiny.gguf"
    write_tiny_llama(model, GGMLType.Q8_0, seed=FIX["seed"])  # 259 tokens
    path = tmp_path / "base260.bin"
    with open(path, "wb") as f:
        w = LogitsWriter(f, 8, 1, np.zeros(8, np.int32))
        w.chunk(np.zeros((3, 260), np.float32), np.zeros(3, np.int64))
    code = cli.main(["perplexity", "-m", str(model), "--kl-divergence", "--kl-divergence-base",
                     str(path), "-t", "1"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 1 and out == "", out
    assert f"{path}: computed with a vocabulary of 260 tokens, the model has 259" in err
    assert "(field n_vocab, at byte offset 12)" in err


def test_failed_run_leaves_no_file(tmp_path):
    target = tmp_path / "base.bin"
    target.write_bytes(b"old")

    class Failing(FakeCtx):  # fails on the third chunk, two written
        def decode(self, batch, **kw):
            if len(self.batches) == 2:
                raise RuntimeError("decode failed")
            return super().decode(batch)

    with pytest.raises(RuntimeError, match="decode failed"), atomic_write(target) as f:
        perplexity(Failing(16), FakeTokenizer(), bytes(200), n_ctx=16, n_batch=16, logits_out=f)
        assert f.tell() > 0
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["base.bin"]


# --- against llama-perplexity -------------------------------------------------------------


def llama_stdout(text: str) -> str:
    """llama-perplexity's stdout less the ETA's tail (``0.00 minutes``: it prints the line's
    head on stderr) and its closing blank line."""
    first, rest = text.split("\n", 1)
    assert first.endswith(" minutes")
    return rest.rstrip("\n")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run_cli(capsys, *args: str) -> str:
    code = cli.main(["perplexity", *args, "-t", "1"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out.rstrip("\n")


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    q8, q5 = d / "tiny_q8_0.gguf", d / "tiny_q5_0.gguf"
    write_tiny_llama(q8, GGMLType.Q8_0, seed=FIX["seed"])
    assert cli.main(["quantize", "--allow-requantize", str(q8), str(q5), "Q5_0", "1"]) == 0
    assert sha256(q5) == FIX["tiny"]["q5_0_sha256"]  # llama-quantize's file
    return q8, q5


def test_tiny_base_file_is_llama_perplexity_s(tiny_models, tmp_path, capsys):
    case = FIX["tiny"]
    out = tmp_path / "base.bin"
    got = run_cli(capsys, "-m", str(tiny_models[0]), "-f", str(TEXT), "-c", str(case["n_ctx"]),
                  "--chunks", str(case["chunks"]), "--kl-divergence-base", str(out))  # fmt: skip
    assert out.read_bytes() == (ROOT / "kld" / "tiny_base.bin").read_bytes()
    assert got.split("\n")[0] == llama_stdout(case["base_stdout"])  # the running PPL


def test_tiny_kld_report_is_llama_perplexity_s(tiny_models, capsys):
    case = FIX["tiny"]
    got = run_cli(capsys, "-m", str(tiny_models[1]), "-c", str(case["n_ctx"]),
                  "--kl-divergence", "--kl-divergence-base", str(ROOT / "kld" / "tiny_base.bin"))  # fmt: skip
    assert got == llama_stdout(case["kld_q5_0_stdout"])


@pytest.fixture(scope="module")
def smollm2_base(smollm2_path, tmp_path_factory):
    """Our base file of SmolLM2 (checked identical to llama-perplexity's) and the stdout."""
    case = FIX["smollm2"]
    out = tmp_path_factory.mktemp("smollm2") / "base.bin"
    code = cli.main(["perplexity", "-m", str(smollm2_path), "-f", str(TEXT), "-c",
                     str(case["n_ctx"]), "--chunks", str(case["chunks"]), "-t", "1",
                     "--kl-divergence-base", str(out)])  # fmt: skip
    assert code == 0
    return out


def test_smollm2_base_file_is_llama_perplexity_s(smollm2_base):
    case = FIX["smollm2"]
    assert smollm2_base.stat().st_size == case["base_size"]
    assert sha256(smollm2_base) == case["base_sha256"]


def test_smollm2_kld_against_itself(smollm2_path, smollm2_base, capsys):
    case = FIX["smollm2"]
    got = run_cli(capsys, "-m", str(smollm2_path), "-c", str(case["n_ctx"]), "--kl-divergence",
                  "--kl-divergence-base", str(smollm2_base))  # fmt: skip
    assert "Same top p: 100.000 ± 0.000 %" in got
    assert got == llama_stdout(case["kld_self_stdout"])


def test_smollm2_kld_q8_0(smollm2_path, smollm2_base, tmp_path, capsys):
    case = FIX["smollm2"]
    q8 = tmp_path / "q8_0.gguf"
    assert cli.main(["quantize", "--allow-requantize", str(smollm2_path), str(q8), "Q8_0"]) == 0
    assert sha256(q8) == case["q8_0_sha256"]
    capsys.readouterr()
    got = run_cli(capsys, "-m", str(q8), "-c", str(case["n_ctx"]), "--kl-divergence",
                  "--kl-divergence-base", str(smollm2_base))  # fmt: skip
    assert got == llama_stdout(case["kld_q8_0_stdout"])


def test_writer_header_and_rows_layout():
    buf = io.BytesIO()
    w = LogitsWriter(buf, 4, 1, np.arange(10))
    w.chunk(np.array([[0.0, 1.0, 2.0]], np.float32), np.array([2]))
    raw = buf.getvalue()
    assert raw[:20] == b"_logits_" + struct.pack("<Iii", 4, 3, 1)
    assert np.frombuffer(raw[20:36], "<i4").tolist() == [0, 1, 2, 3]
    row = np.frombuffer(raw[36:], "<u2")
    assert len(row) == row_width(3) == 8
    scale, mn = struct.unpack("<ff", raw[36:44])
    assert scale == pytest.approx(2 / 65535) and row[4:7].tolist() == [0, 32768, 65535]
    assert mn == pytest.approx(-2 - math.log(1 + math.exp(-1) + math.exp(-2)), rel=1e-6)
