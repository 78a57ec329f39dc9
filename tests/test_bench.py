"""``llamacpy bench``: llama-bench's statistics, test order and output formats (compared
with llama-bench's own output, recorded in fixtures/generation/llama_bench.json)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from llamacpy import cli
from llamacpy.eval import bench
from llamacpy.eval.bench import BenchResult, BenchTest

FIXTURES = Path(__file__).parent / "fixtures" / "generation"
LLAMA_BENCH = json.loads((FIXTURES / "llama_bench.json").read_text())


def fake_result(test: BenchTest, samples: list[int]) -> BenchResult:
    ref = json.loads(LLAMA_BENCH["json"])[0]
    n = test.n_prompt + test.n_gen
    ts = [1e9 * n / s for s in samples]
    values = dict(ref)
    values.update(
        n_prompt=test.n_prompt, n_gen=test.n_gen, n_threads=1, avg_ns=bench.avg_int(samples),
        stddev_ns=bench.stdev_int(samples), avg_ts=bench.avg_float(ts),
        stddev_ts=bench.stdev_float(ts),
    )  # fmt: skip
    values.pop("samples_ns"), values.pop("samples_ts")
    return BenchResult(test, values, samples)


def test_statistics_are_llama_benchs():
    # a llama-bench run (pp16): samples_ns [737278509, 815896386] were reported with
    # avg_ns 776587447, stddev_ns 55591247, avg_ts 20.655883, stddev_ts 1.478631
    samples = [737278509, 815896386]
    assert bench.avg_int(samples) == 776587447
    assert bench.stdev_int(samples) == 55591247  # integer arithmetic, as llama-bench
    ts = [1e9 * 16 / s for s in samples]
    assert f"{bench.avg_float(ts):f}" == "20.655883"
    assert f"{bench.stdev_float(ts):f}" == "1.478631"
    assert bench.stdev_int([5]) == 0 and bench.stdev_float([1.0]) == 0.0


def test_test_order_and_names():
    tests = bench.expand_tests([512, 0], [128], [(16, 4)], [2048], [512], [1, 2], ["f16"], ["f16"])
    assert [(t.name, t.n_threads) for t in tests] == [
        ("pp512", 1), ("tg128", 1), ("pp16+tg4", 1), ("pp512", 2), ("tg128", 2), ("pp16+tg4", 2)
    ]  # fmt: skip


def test_json_fields_match_llama_bench():
    ref = json.loads(LLAMA_BENCH["json"])
    r = fake_result(BenchTest(16, 0, n_threads=1), [100_000_000, 110_000_000])
    ours = json.loads(bench.format_json([r]))
    assert list(ours[0]) == list(ref[0])  # same fields, same order
    for k, v in ref[0].items():
        assert type(ours[0][k]) is type(v), k
    assert ours[0]["samples_ns"] == [100_000_000, 110_000_000]
    assert ours[0]["samples_ts"] == [160, pytest.approx(145.455, rel=1e-5)]
    line = json.loads(bench.format_jsonl(r))
    assert list(line) == list(ref[0])


def test_csv_matches_llama_bench():
    ref = list(csv.reader(io.StringIO(LLAMA_BENCH["csv"])))
    r = fake_result(BenchTest(16, 0), [100_000_000, 110_000_000])
    ours = list(csv.reader(io.StringIO(bench.format_csv_header() + "\n" + bench.format_csv(r))))
    assert ours[0] == ref[0]
    assert len(ours[1]) == len(ref[1])
    row = dict(zip(ours[0], ours[1]))
    assert row["avg_ts"] == "152.727273" and row["n_prompt"] == "16" and row["cpu_strict"] == "0"


def test_markdown_layout_matches_llama_bench():
    ref = LLAMA_BENCH["md"].splitlines()
    tests = [BenchTest(16, 0, n_threads=1), BenchTest(0, 4, n_threads=1)]
    fields = bench.md_fields(tests)
    header = bench.format_md_header(fields).splitlines()
    assert header == ref[:2]
    rows = [bench.format_md_row(fields, fake_result(t, [10**9, 10**9])) for t in tests]
    for ours, theirs in zip(rows, ref[2:4]):
        # same cells up to the measured numbers
        assert ours[: ours.rindex("|", 0, -1)] == theirs[: theirs.rindex("|", 0, -1)]
        assert len(ours) == len(theirs)
    assert "pp16" in rows[0] and "16.00 ± 0.00" in rows[0]
    # parameters that differ from the defaults get a column, as in llama-bench
    assert "n_batch" in bench.md_fields([BenchTest(16, 0, n_batch=256)])


def test_bench_command(smollm2_path, capsys):
    code = cli.main(["bench", "-m", str(smollm2_path), "-p", "8", "-n", "2", "-r", "2", "-t",
                     "1", "-o", "json"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    results = json.loads(out)
    assert [(r["n_prompt"], r["n_gen"]) for r in results] == [(8, 0), (0, 2)]
    for r in results:
        assert r["model_type"] == "llama 256M Q4_1"
        assert r["model_size"] == 96576768 and r["model_n_params"] == 134515008
        assert len(r["samples_ns"]) == 2 and r["avg_ts"] > 0
        assert r["avg_ns"] == sum(r["samples_ns"]) // 2
    code = cli.main(["bench", "-m", str(smollm2_path), "-p", "4", "-n", "0", "-r", "1", "-t",
                     "1"])  # fmt: skip
    out, _ = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0] == LLAMA_BENCH["md"].splitlines()[0]
    assert "pp4" in lines[2] and lines[-1].startswith("build: llamacpy")


def test_bench_usage_errors(smollm2_path, capsys):
    assert cli.main(["bench", "-m", str(smollm2_path), "-o", "xml"]) == 1
    assert "choose one of" in capsys.readouterr().err
    assert cli.main(["bench", "-m", str(smollm2_path), "-p", "0", "-n", "0"]) == 1
    assert "no tests" in capsys.readouterr().err


def test_depth_and_flash_attn_order_and_names():
    tests = bench.expand_tests([64], [8], [], [2048], [512], [1, 2], ["f16"], ["f16"],
                               n_depth=[0, 256], flash_attn=[-1, 1])  # fmt: skip
    # llama-bench: flash attention outside threads, depth inside them, tests innermost
    assert [(t.name, t.flash_attn, t.n_threads) for t in tests[:4]] == [
        ("pp64", -1, 1), ("tg8", -1, 1), ("pp64 @ d256", -1, 1), ("tg8 @ d256", -1, 1)
    ]  # fmt: skip
    assert [(t.flash_attn, t.n_threads, t.n_depth) for t in tests[4::2]] == [
        (-1, 2, 0), (-1, 2, 256), (1, 1, 0), (1, 1, 256), (1, 2, 0), (1, 2, 256)
    ]  # fmt: skip
    assert "flash_attn" in bench.md_fields(tests)
    assert "flash_attn" not in bench.md_fields([BenchTest(16, 0)])


def test_bench_at_depth(smollm2_path, capsys):
    code = cli.main(["bench", "-m", str(smollm2_path), "-p", "8", "-n", "2", "-d", "0,24",
                     "-r", "2", "-t", "1", "-fa", "on", "-o", "json"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    results = json.loads(out)
    assert [(r["n_prompt"], r["n_gen"], r["n_depth"]) for r in results] == [
        (8, 0, 0), (0, 2, 0), (8, 0, 24), (0, 2, 24)
    ]  # fmt: skip
    assert all(r["flash_attn"] == 1 and len(r["samples_ns"]) == 2 for r in results)


def test_depth_fills_the_cache_before_the_timed_part(smollm2_path):
    b = bench.Bench(str(smollm2_path))
    seen = []
    real = b._prompt

    def spy(ctx, n, n_batch):
        seen.append((n, ctx.kv.seq_pos_max(0)))
        real(ctx, n, n_batch)

    b._prompt = spy
    r = b.run(BenchTest(8, 2, n_threads=1, n_depth=24), reps=2, warmup=False)
    # first repetition decodes the depth from an empty cache, then the prompt after it; the
    # second restores the depth's cache state instead of decoding it again
    assert seen == [(24, -1), (8, 23), (8, 23)]
    assert r.values["n_depth"] == 24 and r.test.name == "pp8+tg2 @ d24"


def test_bench_depth_usage_errors(smollm2_path, capsys):
    assert cli.main(["bench", "-m", str(smollm2_path), "-fa", "maybe"]) == 1
    assert "-fa 'maybe'" in capsys.readouterr().err
    assert cli.main(["bench", "-m", str(smollm2_path), "-d", "x"]) == 1
    assert "invalid number list" in capsys.readouterr().err


@pytest.mark.parametrize(
    "arch, n_layer, extra, want",
    [
        ("gemma3", 18, {}, "270M"),
        ("gemma3", 62, {}, "27B"),
        ("qwen3", 28, {"embedding_length": 1024}, "0.6B"),
        ("qwen3", 28, {"embedding_length": 2048}, "1.7B"),
        ("qwen3", 36, {"embedding_length": 2560}, "4B"),
        ("qwen2", 24, {"embedding_length": 896}, "1B"),
        ("qwen2", 40, {"attention.head_count": 20}, "4B"),
        ("phi3", 32, {}, "3B"),
        ("gemma3", 19, {}, "?B"),
        ("olmo2", 16, {}, "?B"),
    ],
)
def test_size_label_as_llama_cpp_types_the_model(arch, n_layer, extra, want) -> None:
    """The label in ``llama_model_desc`` (bench's model column): llama.cpp's per-architecture
    table from the layer count (and width or heads where it tells sizes apart)."""
    from llamacpy.api.model import size_label

    md = {"general.architecture": arch, f"{arch}.block_count": n_layer}
    md.update({f"{arch}.{k}": v for k, v in extra.items()})
    assert size_label(md) == want
