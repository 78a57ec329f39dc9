"""``llamacpy imatrix`` against llama-imatrix (fixtures/quantize/imatrix_tool.json, made by
scripts/make_imatrix_fixtures.py): the same entries, counts and sums (within 1e-5 relative:
every value of the first and last layer, the total of every entry) and perplexity, on both
real models, and its ``--show-statistics`` report; combining files (``--in-file``), the
legacy ``dat`` output, llama.cpp's
ubatch split for parallel sequences, and refusals."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest

from llamacpy import cli
from llamacpy.engine.batch import Batch, split_equal
from llamacpy.errors import ModelError
from llamacpy.eval.imatrix import ImatrixStats
from llamacpy.quantize.imatrix import load_imatrix, load_imatrix_raw, save_imatrix

FIX = json.loads(
    (Path(__file__).parent / "fixtures" / "quantize" / "imatrix_tool.json").read_text()
)
ENGINE = Path(__file__).parent / "fixtures" / "engine"


def _fields(line: str) -> list:
    """A statistics line's fields: numbers as floats (``%`` dropped), words as they are."""
    out = []
    for f in line.replace("%", "").split("\t"):
        try:
            out.append(float(f))
        except ValueError:
            out.append(f.strip())
    return out


def _run(args: list[str], capsys) -> tuple[int, str, str]:
    rc = cli.main(args)
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("case", FIX["cases"], ids=[c["model"] for c in FIX["cases"]])
def test_matches_llama_imatrix(case, tmp_path, capsys, request):
    path = request.getfixturevalue("smollm2_path" if "smol" in case["model"] else "gemma3_path")
    out = tmp_path / "imatrix.gguf"
    rc, stdout, _ = _run(["imatrix", "-m", str(path), "-f", str(ENGINE / case["text"]),
                          *case["args"], "-o", str(out)], capsys)  # fmt: skip
    assert rc == 0
    assert f"Final estimate: PPL = {case['ppl']:.4f}" in stdout
    raw = load_imatrix_raw(out, 512)
    assert sorted(raw.entries) == sorted(case["entries"])
    assert raw.datasets == (str(ENGINE / case["text"]),)
    for name, want in case["entries"].items():
        sums, counts = raw.entries[name]
        assert counts.tolist() == [want["count"]], name
        total = float(sums.astype(np.float64).sum())
        assert total == pytest.approx(want["total"], rel=1e-5), name
        if "sums" in want:
            ref = np.frombuffer(base64.b64decode(want["sums"]), "<f4").reshape(sums.shape)
            np.testing.assert_allclose(sums, ref, rtol=1e-5, atol=0, err_msg=name)
    # llama-imatrix's --show-statistics report of its file, line for line
    rc, stdout, _ = _run(["imatrix", "--show-statistics", "--in-file", str(out)], capsys)
    assert rc == 0
    got, want = stdout.rstrip("\n").splitlines(), case["statistics"].splitlines()
    assert got[1] == f"Computing statistics for {out} ({len(case['entries'])} tensors)"
    assert len(got) == len(want) > len(case["entries"])
    for g, w in zip(got[2:], want[2:], strict=True):  # (a last printed digit may round
        fg, fw = _fields(g), _fields(w)  # apart: float order)
        assert [f for f in fg if isinstance(f, str)] == [f for f in fw if isinstance(f, str)], w
        nums = [f for f in fg if not isinstance(f, str)]
        assert nums == pytest.approx([f for f in fw if not isinstance(f, str)], rel=1e-4, abs=0.011)
    # the file reads back as llama-quantize reads it: sums / count
    im = load_imatrix(out)
    name = next(iter(case["entries"]))
    sums, counts = raw.entries[name]
    np.testing.assert_allclose(im.data[name], (sums / np.float32(counts[0])).reshape(-1))


@pytest.mark.parametrize("case", FIX["tiny"], ids=[c["name"] for c in FIX["tiny"]])
def test_experts_match_llama_imatrix(case, tmp_path, capsys):
    """Tiny mixtures of experts: every expert's sums (``in_sum2`` of n_expert rows) and
    counts, the router's and attention's, as llama-imatrix's."""
    from llamacpy.gguf import GGMLType
    from llamacpy.models.tiny import write_tiny_llama

    arch, opts = MOE[case["name"]]
    model, out = tmp_path / "m.gguf", tmp_path / "imatrix.gguf"
    write_tiny_llama(model, GGMLType.Q8_0, seed=5, arch=arch, **opts)
    rc, _, _ = _run(["imatrix", "-m", str(model), "-f", str(ENGINE / "text.txt"),
                     *case["args"], "-o", str(out)], capsys)  # fmt: skip
    assert rc == 0
    raw = load_imatrix_raw(out, 512)
    assert sorted(raw.entries) == sorted(case["entries"])
    assert any(s.shape[0] > 1 for s, _ in raw.entries.values())  # (expert entries)
    for name, want in case["entries"].items():
        sums, counts = raw.entries[name]
        assert counts.tolist() == want["counts"], name
        ref = np.frombuffer(base64.b64decode(want["sums"]), "<f4").reshape(sums.shape)
        np.testing.assert_allclose(sums, ref, rtol=1e-5, atol=0, err_msg=name)


def test_in_file_combines_and_dat_output(tmp_path, capsys, smollm2_path):
    text = ENGINE / "text.txt"
    a = tmp_path / "a.gguf"
    rc, _, _ = _run(["imatrix", "-m", str(smollm2_path), "-f", str(text), "-c", "128",
                     "--chunks", "3", "--no-ppl", "-o", str(a)], capsys)  # fmt: skip
    assert rc == 0
    first = load_imatrix_raw(a, 128)
    assert all(c.tolist() == [3 * 128] for _, c in first.entries.values())
    # no -f: the files are only combined (no model)
    both = tmp_path / "both.gguf"
    rc, _, _ = _run(["imatrix", "--in-file", f"{a},{a}", "-o", str(both)], capsys)
    assert rc == 0
    two = load_imatrix_raw(both, 128)
    assert two.datasets == first.datasets * 2
    for name, (s, c) in first.entries.items():
        np.testing.assert_array_equal(two.entries[name][0], s + s)
        assert two.entries[name][1].tolist() == [2 * int(c[0])]
    # the legacy format: averages times the chunks, read back the same way
    dat = tmp_path / "a.dat"
    rc, _, _ = _run(["imatrix", "--in-file", str(a), "-c", "128", "--output-format", "dat",
                     "-o", str(dat)], capsys)  # fmt: skip
    assert rc == 0
    legacy, gguf = load_imatrix(dat), load_imatrix(a)
    assert legacy.is_legacy and sorted(legacy.data) == sorted(gguf.data)
    for name, v in gguf.data.items():
        np.testing.assert_allclose(legacy.data[name], v, rtol=1e-6)
    back = load_imatrix_raw(dat, 128)  # sums and counts again (llama-imatrix's reading)
    for name, (s, c) in first.entries.items():
        np.testing.assert_allclose(back.entries[name][0], s, rtol=1e-5)
        assert back.entries[name][1].tolist() == c.tolist()


def test_output_frequency_writes_during_the_run(tmp_path, capsys, smollm2_path):
    out = tmp_path / "im.gguf"
    rc, _, _ = _run(["imatrix", "-m", str(smollm2_path), "-f", str(ENGINE / "text.txt"),
                     "-c", "128", "-b", "256", "--chunks", "4", "--no-ppl", "-ofreq", "1",
                     "--save-frequency", "2", "-o", str(out)], capsys)  # fmt: skip
    assert rc == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["im.gguf", "im.gguf.at_2", "im.gguf.at_4"]
    assert load_imatrix(out).chunk_count == 4
    assert load_imatrix(tmp_path / "im.gguf.at_2").chunk_count == 2


def test_refusals(tmp_path, capsys, smollm2_path):
    rc, _, err = _run(["imatrix", "-o", str(tmp_path / "x.gguf")], capsys)
    assert rc == 1 and "no prompt" in err
    short = tmp_path / "short.txt"
    short.write_text("just a few words")
    rc, _, err = _run(["imatrix", "-m", str(smollm2_path), "-f", str(short), "-o",
                       str(tmp_path / "x.gguf")], capsys)  # fmt: skip
    assert rc == 1 and "you need at least 1024 tokens" in err
    rc, _, err = _run(["imatrix", "--show-statistics"], capsys)
    assert rc == 1 and "a single imatrix file" in err
    rc, _, err = _run(["imatrix", "--in-file", str(tmp_path / "missing.gguf")], capsys)
    assert rc == 1 and "missing.gguf" in err
    assert not (tmp_path / "x.gguf").exists()


def test_uncollected_blocks_are_refused():
    from llamacpy.models import imatrix as mi
    from llamacpy.models.deepseek2 import BLOCK as MLA_BLOCK
    from llamacpy.models.qwen35 import Qwen35Model

    with pytest.raises(ModelError, match="'mla_q'.*not collected"):
        mi.collecting_block(MLA_BLOCK, "deepseek2")
    with pytest.raises(ModelError, match="recurrent"):
        mi.collecting_block(Qwen35Model.block, "qwen35")
    block = mi.collecting_block(("attn_norm", "qkv", "out_proj", "ffn_norm", "ffn_swiglu",
                                 "ffn_down"))  # fmt: skip
    assert block == ("attn_norm", "im_qkv_in", "qkv", "im_out_in", "out_proj", "ffn_norm",
                     "im_ffn_in", "ffn_swiglu", "im_down_in", "ffn_down")  # fmt: skip


def test_split_equal_is_llama_cpps():
    """16 sequences of 128 tokens, ubatches of 512: 4 ubatches of 32 tokens of each (grouped by
    sequence); a run of sequence ids stops at a gap; outputs land in batch order."""
    b = Batch()
    for s in range(16):
        for p in range(128):
            b.add(s * 1000 + p, p, s, True)
    ubs = split_equal(b, 512)
    assert [len(u) for u in ubs] == [512] * 4 and all(u.n_seq_tokens == 32 for u in ubs)
    assert ubs[1].token[:3].tolist() == [32, 33, 34] and ubs[1].token[32] == 1032
    assert sorted(np.concatenate([u.src for u in ubs]).tolist()) == list(range(16 * 128))
    gap = Batch()
    for s, n in ((0, 5), (1, 3), (3, 4)):
        for p in range(n):
            gap.add(s, p, s, False)
    ubs = split_equal(gap, 512)
    assert [(len(u), u.n_seq_tokens) for u in ubs] == [(6, 3), (2, 2), (4, 4)]


def test_save_imatrix_layout(tmp_path):
    stats = ImatrixStats()
    stats.add("blk.0.ffn_down.weight", np.arange(8, dtype=np.float32), np.array([4]))
    stats.add("blk.0.attn_q.weight", np.ones(4, np.float32), np.array([2]))
    stats.add("blk.0.attn_q.weight", np.ones(4, np.float32), np.array([2]))
    p = tmp_path / "s.gguf"
    save_imatrix(p, {k: (v, stats.counts[k]) for k, v in stats.sums.items()}, ["d.txt"], 1, 2)
    from llamacpy.gguf.reader import GGUFReader

    with GGUFReader(p) as r:
        assert [t.name for t in r.tensors] == [
            "blk.0.attn_q.weight.in_sum2", "blk.0.attn_q.weight.counts",
            "blk.0.ffn_down.weight.in_sum2", "blk.0.ffn_down.weight.counts",
        ]  # fmt: skip
        assert r.tensors[0].shape == (4, 1) and r.tensors[1].shape == (1, 1)
        assert r.get("general.type") == "imatrix" and r.get("imatrix.chunk_size") == 2
    assert (
        load_imatrix(p).data["blk.0.attn_q.weight"].tolist() == [0.5] * 4
    )  # sums 1 + 1, counts 2 + 2


# (one per kind of input: plain, no pre-norms, GEGLU with post-norms; phi3 (fused tensors
# split at load), qwen2, qwen3 and gemma3 run the same collectors; Mixtral is checked
# against llama-imatrix)
DENSE = ["llama", "olmo2", "gemma2"]
MOE = {
    "qwen3moe": ("qwen3moe", {}),
    "mixtral": ("llama", {"n_expert": 4}),
    "gpt-oss": ("gpt-oss", {}),
}


@pytest.mark.parametrize("name", [*DENSE, "qwen3moe", "gpt-oss"])
def test_collected_sums_match_the_reference(name, tmp_path, monkeypatch):
    """The collectors against ``models/reference.py``'s (tiny F32 models: the same inputs up
    to float order), dense blocks and mixtures of experts: the sums and counts of a 40-token
    prompt in ubatches of 32 and 8 (the second under llama-imatrix's 16-row floor for plain
    matmuls, collected for the experts' matmuls, which have none); the last layer runs
    every row, as llama-imatrix's, though only 20 rows' logits are asked for."""
    from llamacpy.engine import Context, ContextParams
    from llamacpy.gguf import GGMLType
    from llamacpy.models.reference import Reference
    from llamacpy.models.tiny import write_tiny_llama

    arch, opts = MOE.get(name, (name, {}))
    path = tmp_path / f"{name}.gguf"
    write_tiny_llama(path, GGMLType.F32, seed=3, arch=arch, **opts)
    params = ContextParams(n_ctx=64, n_batch=64, n_ubatch=32, n_threads=2, kernel_formats="all")
    ctx = Context(path, params)  # (every format linked in: the stages test_reference compiles)
    im = ctx.model.collect_imatrix()
    ref = Reference(ctx.model)
    ref.imatrix = np.zeros_like(im.sums)
    compiled = ctx.model.forward

    def both(ws, ub, kv, n_threads, deterministic=False):
        copies = {id(a): a.copy() for a in kv[:4]}
        ref.forward(ub, (*(copies[id(a)] for a in kv[:4]), kv[4]), n_threads)
        return compiled(ws, ub, kv, n_threads, deterministic)

    monkeypatch.setattr(ctx.model, "forward", both)
    tokens = np.random.default_rng(1).integers(3, 250, 40).tolist()
    batch = Batch()
    for i, t in enumerate(tokens):
        batch.add(t, i, 0, i >= 20)  # 20 outputs: the last layer still runs every row
    ctx.decode(batch)
    n_layer = ctx.model.hparams.n_layer
    if name in MOE:  # every expert row counted, of the 32 + 8 tokens' selections (the
        _, counts = im.expert_rows(0, 0)  # last layer too)
        k = ctx.model.hparams.extra["n_expert_used"]
        assert counts.sum() == 40 * k and (im.expert_rows(0, 1)[1] == counts).all()
        assert im.expert_rows(n_layer - 1, 1)[1].sum() == 40 * k
    assert "out_rows" not in ctx.model.block
    want = np.full(4 * n_layer + 1, 32)
    want[-1] = 0
    assert im.counts.tolist() == want.tolist()
    assert np.abs(im.sums).max() > 0
    # within test_reference's bound on logits: 2e-3 of each row's largest (f16 cache rows,
    # float order), a collector on the wrong input is off by far more
    bound = 2e-3 * np.abs(ref.imatrix).max(axis=1, keepdims=True)
    assert (np.abs(im.sums - ref.imatrix) <= bound).all()
