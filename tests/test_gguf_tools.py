"""GGUF tools: dump (text/JSON), set metadata, rename tensors, split/merge, split-model loading."""

from __future__ import annotations

import filecmp
import json
import os
from pathlib import Path

import numpy as np
import pytest

from llamacpy.cli import main
from llamacpy.errors import GGUFError, UsageError
from llamacpy.gguf import GGMLType, GGUFReader, GGUFValueType, GGUFWriter
from llamacpy.gguf.dump import dump_text, format_params, to_dict, to_json
from llamacpy.gguf.edit import rename_tensors, set_metadata
from llamacpy.gguf.split import (
    GGUFModelFile,
    merge_gguf,
    parse_size,
    plan_split,
    shard_paths,
    split_gguf,
    split_path,
    split_prefix,
)

N_LAYERS = 3
N_TENSORS = 1 + 3 * N_LAYERS


def make_model(
    path: Path, *, version: int = 3, alignment: int | None = None, extra: dict | None = None
) -> Path:
    """A tiny llama-like GGUF: 10 tensors (F16, F32, Q8_0), typical metadata."""
    rng = np.random.default_rng(0)
    w = GGUFWriter(path, version=version)
    w.add("general.architecture", "llama")
    w.add("general.name", "tiny")
    if alignment is not None:
        w.add("general.alignment", alignment, GGUFValueType.UINT32)
    w.add("general.file_type", 1, GGUFValueType.UINT32)
    w.add("llama.context_length", 256, GGUFValueType.UINT32)
    w.add("llama.rope.freq_base", 10000.0, GGUFValueType.FLOAT32)
    w.add("llama.attention.layer_norm_rms_epsilon", 1e-5, GGUFValueType.FLOAT32)
    w.add("tokenizer.ggml.tokens", [f"tok{i}" for i in range(100)])
    w.add("tokenizer.ggml.scores", np.linspace(-1, 0, 100, dtype=np.float32))
    w.add("tokenizer.ggml.add_bos_token", True)
    for k, v in (extra or {}).items():
        w.add(k, v)
    w.add_tensor(
        "token_embd.weight",
        GGMLType.F16,
        (16, 100),
        rng.standard_normal((100, 16)).astype(np.float16),
    )
    for i in range(N_LAYERS):
        w.add_tensor(
            f"blk.{i}.attn_norm.weight",
            GGMLType.F32,
            (16,),
            rng.standard_normal(16).astype(np.float32),
        )
        w.add_tensor(
            f"blk.{i}.attn_q.weight",
            GGMLType.Q8_0,
            (32, 16),
            rng.integers(0, 256, 16 * 34, dtype=np.uint8),
        )
        w.add_tensor(
            f"blk.{i}.ffn_up.weight",
            GGMLType.F16,
            (16, 40),
            rng.standard_normal((40, 16)).astype(np.float16),
        )
    w.write()
    return path


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return make_model(tmp_path / "tiny.gguf")


def cli(capsys, *argv: str | os.PathLike[str]) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_line_error(rc: int, err: str, *needles: str) -> None:
    assert rc == 1
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("llamacpy: error: ")
    for n in needles:
        assert n in lines[0], (n, lines[0])


def tensor_bytes(path: Path) -> dict[str, bytes]:
    with GGUFModelFile(path) as m:
        return {t.name: bytes(t.raw) for t in m.tensors}


# =========================================================================== dump
def test_format_params():
    assert format_params(134_515_008) == "134.52 M"
    assert format_params(268_098_176) == "268.10 M"
    assert format_params(1_240_000_000) == "1.24 B"
    assert format_params(2_048) == "2.05 K"
    assert format_params(7) == "7"


def test_dump_text(model: Path):
    text = dump_text(model)
    assert "general.architecture = 'llama'" in text
    assert "UINT32" in text and "llama.context_length = 256" in text
    assert "llama.attention.layer_norm_rms_epsilon = 1e-05" in text
    assert "tokenizer.ggml.tokens = [100 x STRING] ['tok0', 'tok1'," in text
    assert "...]" in text
    assert "File type: F16" in text
    n = 1600 + N_LAYERS * (16 + 512 + 640)
    assert f"Parameters: {format_params(n)}" in text
    row = next(ln for ln in text.splitlines() if "token_embd.weight" in ln)
    assert row.split()[:4] == ["0", "token_embd.weight", "F16", "[16,"]
    assert "blk.2.ffn_up.weight" in text
    no_t = dump_text(model, tensors=False)
    assert "token_embd.weight" not in no_t and "general.name" in no_t


def test_dump_long_string_shortened(tmp_path: Path):
    p = make_model(tmp_path / "m.gguf", extra={"tokenizer.chat_template": "x" * 500})
    line = next(ln for ln in dump_text(p).splitlines() if "chat_template" in ln)
    assert line.endswith("...'") and len(line) < 150
    assert to_dict(p)["metadata"]["tokenizer.chat_template"] == "x" * 500


def test_dump_json_cli(model: Path, capsys):
    rc, out, _ = cli(capsys, "gguf", "dump", model, "--json")
    assert rc == 0
    d = json.loads(out)
    md = d["metadata"]
    assert md["general.architecture"] == "llama"
    assert md["llama.context_length"] == 256
    assert md["llama.attention.layer_norm_rms_epsilon"] == 1e-05
    assert md["tokenizer.ggml.add_bos_token"] is True
    assert md["tokenizer.ggml.tokens"] == [f"tok{i}" for i in range(100)]  # complete
    assert len(md["tokenizer.ggml.scores"]) == 100 and md["tokenizer.ggml.scores"][0] == -1.0
    assert d["metadata_types"]["tokenizer.ggml.tokens"] == "[STRING]"
    assert d["metadata_types"]["llama.context_length"] == "UINT32"
    assert d["file_type"] == 1 and d["file_type_name"] == "F16"
    assert d["version"] == 3 and d["alignment"] == 32
    assert d["n_tensors"] == N_TENSORS and len(d["tensors"]) == N_TENSORS
    with GGUFReader(model) as r:
        assert d["n_params"] == sum(t.n_elements for t in r.tensors)
        for tj, t in zip(d["tensors"], r.tensors):
            assert tj["name"] == t.name
            assert tj["type"] == t.type.name
            assert tj["shape"] == list(t.shape)
            assert tj["offset"] == t.offset
            assert tj["nbytes"] == t.nbytes
    assert d["tensors"][0]["shape"] == [16, 100]  # ggml order

    rc, out, _ = cli(capsys, "gguf", "dump", model, "--json", "--no-tensors")
    assert rc == 0 and "tensors" not in json.loads(out)
    rc, out, _ = cli(capsys, "gguf", "dump", model, "--no-tensors")
    assert rc == 0 and "Tensors" not in out and "general.name" in out


def test_dump_json_invalid_utf8_and_nonfinite(tmp_path: Path):
    p = make_model(
        tmp_path / "m.gguf",
        extra={"bad.string": "ok\udcff\udcfe", "bad.nan": float("nan"), "ü.key": "ünïcode"},
    )
    s = to_json(p)
    assert s.isascii()
    d = json.loads(s)  # strict: no NaN literals, no lone surrogates
    assert d["metadata"]["bad.string"] == "ok\\xff\\xfe"
    assert d["metadata"]["bad.nan"] == "nan"
    assert d["metadata"]["ü.key"] == "ünïcode"
    assert "\\xff" in dump_text(p)


def test_dump_missing_and_non_gguf(tmp_path: Path, capsys):
    rc, _, err = cli(capsys, "gguf", "dump", tmp_path / "nope.gguf")
    assert_one_line_error(rc, err, "nope.gguf")
    txt = tmp_path / "notes.txt"
    txt.write_text("hello world, not a model\n")
    rc, _, err = cli(capsys, "gguf", "dump", txt)
    assert_one_line_error(rc, err, "not a GGUF file")


# =========================================================================== set
def test_set_new_and_replaced_keys(model: Path, tmp_path: Path):
    out = tmp_path / "out.gguf"
    with GGUFReader(model) as r:
        keys_before = list(r.fields)
    changes = set_metadata(
        model,
        out,
        [
            "llama.context_length=int:4096",
            "llama.rope.freq_base=float:500000",
            "general.name=str:renamed: with = and : inside",
            "my.text=str:hello",
            "my.flag=bool:FALSE",
            "my.one=bool:1",
            "my.n=int:-5",
            "my.big=int:5000000000",
            "my.f=float:0.25",
            "my.u8=u8:200",
            "my.f64=f64:1e300",
        ],
    )
    assert [c.old is None for c in changes] == [False] * 3 + [True] * 8
    with GGUFReader(out) as r:
        f = r.fields
        assert list(f)[: len(keys_before)] == keys_before  # replaced keys keep their place
        assert list(f)[len(keys_before) :] == [
            "my.text",
            "my.flag",
            "my.one",
            "my.n",
            "my.big",
            "my.f",
            "my.u8",
            "my.f64",
        ]
        assert f["llama.context_length"].type == GGUFValueType.UINT32
        assert f["llama.context_length"].value == 4096
        assert f["llama.rope.freq_base"].type == GGUFValueType.FLOAT32
        assert f["llama.rope.freq_base"].value == 500000.0
        assert f["general.name"].value == "renamed: with = and : inside"
        assert (f["my.flag"].type, f["my.flag"].value) == (GGUFValueType.BOOL, False)
        assert f["my.one"].value is True
        assert (f["my.n"].type, f["my.n"].value) == (GGUFValueType.INT32, -5)
        assert (f["my.big"].type, f["my.big"].value) == (GGUFValueType.INT64, 5000000000)
        assert f["my.f"].type == GGUFValueType.FLOAT32
        assert (f["my.u8"].type, f["my.u8"].value) == (GGUFValueType.UINT8, 200)
        assert (f["my.f64"].type, f["my.f64"].value) == (GGUFValueType.FLOAT64, 1e300)
    assert tensor_bytes(out) == tensor_bytes(model)


def test_set_explicit_type_changes_type(model: Path, tmp_path: Path):
    out = tmp_path / "out.gguf"
    set_metadata(model, out, ["llama.context_length=i64:-1"])
    with GGUFReader(model) as a, GGUFReader(out) as b:
        assert list(a.fields) == list(b.fields)
        f = b.fields["llama.context_length"]
        assert (f.type, f.value) == (GGUFValueType.INT64, -1)


def test_set_in_place(model: Path):
    before = sorted(os.listdir(model.parent))
    set_metadata(model, model, ["general.name=str:in place"])
    assert sorted(os.listdir(model.parent)) == before  # no temporary files left
    with GGUFReader(model) as r:
        assert r.get("general.name") == "in place"
        assert len(r.tensors) == N_TENSORS


@pytest.mark.parametrize(
    ("assignment", "needle"),
    [
        ("noequals", "KEY=TYPE:VALUE"),
        ("=str:x", "KEY=TYPE:VALUE"),
        ("my.key=str", "missing TYPE"),
        ("my.key=blob:1", "unknown type"),
        ("my.key=int:abc", "not an integer"),
        ("my.key=float:fast", "not a number"),
        ("my.key=bool:maybe", "not a bool"),
        ("my.key=u8:256", "out of range for UINT8"),
        ("my.key=f32:1e39", "out of range for FLOAT32"),
        ("my.key=int:99999999999999999999", "64-bit"),
        ("llama.context_length=int:-1", "out of range for UINT32"),
        ("split.count=int:2", "split"),
        ("general.alignment=u32:48", "power of two"),
    ],
)
def test_set_bad_assignment(model: Path, tmp_path: Path, assignment: str, needle: str):
    out = tmp_path / "out.gguf"
    with pytest.raises(UsageError) as ei:
        set_metadata(model, out, [assignment])
    assert needle in str(ei.value)
    assert repr(assignment) in str(ei.value)
    assert not out.exists()


def test_set_duplicate_and_empty(model: Path, tmp_path: Path):
    with pytest.raises(UsageError, match="twice"):
        set_metadata(model, tmp_path / "o.gguf", ["a.b=int:1", "a.b=int:2"])
    with pytest.raises(UsageError, match="no assignments"):
        set_metadata(model, tmp_path / "o.gguf", [])


def test_set_cli(model: Path, tmp_path: Path, capsys):
    out = tmp_path / "out.gguf"
    rc, stdout, _ = cli(
        capsys, "gguf", "set", model, out, "my.key=str:v", "llama.context_length=int:8"
    )
    assert rc == 0
    assert "added my.key: STRING = 'v'" in stdout
    assert "replaced llama.context_length: UINT32 = 8" in stdout
    rc, _, err = cli(capsys, "gguf", "set", model, out, "llama.context_length=int:-3")
    assert_one_line_error(rc, err, "llama.context_length=int:-3", "UINT32")
    rc, _, err = cli(capsys, "gguf", "set", model, tmp_path / "no" / "dir.gguf", "a=int:1")
    assert_one_line_error(rc, err, "does not exist")
    with pytest.raises(SystemExit) as ei:
        main(["gguf", "set", str(model), str(out)])
    assert ei.value.code == 2


# =========================================================================== rename
def test_rename_tensors(model: Path, tmp_path: Path):
    out = tmp_path / "out.gguf"
    renames = rename_tensors(model, out, r"^blk\.(\d+)\.", r"layers.\1.")
    assert len(renames) == 3 * N_LAYERS
    assert ("blk.1.attn_q.weight", "layers.1.attn_q.weight") in renames
    before, after = tensor_bytes(model), tensor_bytes(out)
    assert next(iter(after)) == "token_embd.weight"
    assert after["layers.2.ffn_up.weight"] == before["blk.2.ffn_up.weight"]
    assert [n.replace("layers.", "blk.") for n in after] == list(before)
    with GGUFReader(model) as a, GGUFReader(out) as b:
        assert list(a.fields) == list(b.fields)


def test_rename_in_place(model: Path):
    rename_tensors(model, model, "token_embd", "tok_embeddings")
    with GGUFReader(model) as r:
        assert r.tensors[0].name == "tok_embeddings.weight"


@pytest.mark.parametrize(
    ("pattern", "repl", "needle"),
    [
        ("nothing_like_this", "x", "matches no tensor"),
        (r"\d+", "N", "two tensors the name"),
        (r"^token_embd\.weight$", "", "empty name"),
        ("^token_embd", "t" * 70, "shorter than 64"),
        ("(", "x", "invalid regular expression"),
        ("(blk)", r"\2", "invalid replacement"),
    ],
)
def test_rename_errors(model: Path, tmp_path: Path, pattern: str, repl: str, needle: str):
    out = tmp_path / "out.gguf"
    with pytest.raises(UsageError) as ei:
        rename_tensors(model, out, pattern, repl)
    assert needle in str(ei.value)
    assert not out.exists()


def test_rename_cli(model: Path, tmp_path: Path, capsys):
    out = tmp_path / "out.gguf"
    rc, stdout, _ = cli(capsys, "gguf", "rename-tensor", model, out, "attn_q", "attn_query")
    assert rc == 0 and "blk.0.attn_q.weight -> blk.0.attn_query.weight" in stdout
    rc, _, err = cli(capsys, "gguf", "rename-tensor", model, out, "zzz", "y")
    assert_one_line_error(rc, err, "matches no tensor")


# =========================================================================== split/merge
def test_split_names():
    assert str(split_path("out/m", 0, 3)) == "out/m-00001-of-00003.gguf"
    assert split_prefix("out/m-00002-of-00003.gguf", 1, 3) == "out/m"
    assert split_prefix("out/m-00002-of-00003.gguf", 0, 3) is None
    assert split_prefix("-00001-of-00001.gguf", 0, 1) is None


def test_parse_size():
    assert parse_size("500M") == 500_000_000
    assert parse_size("2G") == 2_000_000_000
    assert parse_size("1.5g") == 1_500_000_000
    assert parse_size("64K") == 64_000
    assert parse_size("4096") == 4096
    for bad in ("abc", "0", "12X", "-1M", ""):
        with pytest.raises(UsageError):
            parse_size(bad)


def test_split_by_tensors_and_merge(model: Path, tmp_path: Path):
    prefix = tmp_path / "out" / "m"
    prefix.parent.mkdir()
    shards = split_gguf(model, prefix, max_tensors=4)
    assert [p.name for p in shards] == [f"m-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert shard_paths(shards[0]) == shards
    with GGUFReader(model) as orig:
        orig_keys = list(orig.fields)
    for i, p in enumerate(shards):
        with GGUFReader(p) as r:
            assert len(r.tensors) == [4, 4, 2][i]
            assert r.fields["split.no"].type == GGUFValueType.UINT16
            assert r.fields["split.count"].type == GGUFValueType.UINT16
            assert r.fields["split.tensors.count"].type == GGUFValueType.INT32
            assert (r.get("split.no"), r.get("split.count"), r.get("split.tensors.count")) == (
                i,
                3,
                N_TENSORS,
            )
            if i == 0:
                assert list(r.fields) == [
                    *orig_keys,
                    "split.no",
                    "split.count",
                    "split.tensors.count",
                ]
            else:
                assert list(r.fields) == ["split.no", "split.count", "split.tensors.count"]
    merged = merge_gguf(shards[0], tmp_path / "merged.gguf")
    assert filecmp.cmp(model, merged, shallow=False)


def test_split_by_size_and_merge(model: Path, tmp_path: Path):
    limit = 3000
    shards = split_gguf(model, tmp_path / "m", max_size=limit)
    assert len(shards) > 2
    with GGUFModelFile(shards[0]) as m:
        plans = plan_split(m, tmp_path / "x", max_size=limit)
    for p, plan in zip(shards, plans):
        assert p.stat().st_size == plan.size
        assert p.stat().st_size <= limit or len(plan.tensors) == 1
    merged = merge_gguf(shards[0], tmp_path / "merged.gguf")
    assert filecmp.cmp(model, merged, shallow=False)


def test_split_no_tensor_first_split(model: Path, tmp_path: Path):
    shards = split_gguf(model, tmp_path / "m", max_tensors=5, no_tensor_first_split=True)
    assert len(shards) == 3
    with GGUFReader(shards[0]) as r:
        assert r.tensors == [] and r.get("general.architecture") == "llama"
    assert filecmp.cmp(model, merge_gguf(shards[0], tmp_path / "merged.gguf"), shallow=False)


def test_split_single_shard_and_dry_run(model: Path, tmp_path: Path):
    paths = split_gguf(model, tmp_path / "d", max_tensors=2, dry_run=True)
    assert len(paths) == 5 and not any(p.exists() for p in paths)
    (one,) = split_gguf(model, tmp_path / "m", max_tensors=1000)
    assert one.name == "m-00001-of-00001.gguf"
    assert filecmp.cmp(model, merge_gguf(one, tmp_path / "merged.gguf"), shallow=False)


@pytest.mark.parametrize(("version", "alignment"), [(2, None), (3, 64)])
def test_split_merge_version_and_alignment(tmp_path: Path, version: int, alignment: int | None):
    model = make_model(tmp_path / "m.gguf", version=version, alignment=alignment)
    shards = split_gguf(model, tmp_path / "s", max_tensors=3)
    with GGUFReader(shards[1]) as r:
        assert r.version == version
        assert r.alignment == (alignment or 32)
    assert filecmp.cmp(model, merge_gguf(shards[0], tmp_path / "merged.gguf"), shallow=False)


def test_resplit_split_model(model: Path, tmp_path: Path):
    a = split_gguf(model, tmp_path / "a", max_tensors=3)
    b = split_gguf(a[0], tmp_path / "b", max_tensors=7)
    assert len(b) == 2
    assert filecmp.cmp(model, merge_gguf(b[0], tmp_path / "merged.gguf"), shallow=False)


def test_split_model_loads_from_first_shard(model: Path, tmp_path: Path):
    shards = split_gguf(model, tmp_path / "m", max_tensors=4)
    with GGUFReader(model) as orig, GGUFModelFile(shards[0]) as m:
        assert m.is_split and len(m.readers) == 3
        assert [t.name for t in m.tensors] == [t.name for t in orig.tensors]
        for t in orig.tensors:
            mt = m.tensor(t.name)
            assert (mt.type, mt.shape) == (t.type, t.shape)
            assert np.array_equal(mt.raw, t.raw)
        assert m.shard_of("blk.2.ffn_up.weight") == 2
        # fields are the merged model's: the split keys are dropped
        assert list(m.fields) == list(orig.fields)
        assert m.get("tokenizer.ggml.tokens") == orig.get("tokenizer.ggml.tokens")
        assert "split.count" in m.readers[0].fields
        with pytest.raises(GGUFError, match="no tensor named"):
            m.tensor("nope")
    with GGUFModelFile(model) as single:
        assert not single.is_split and len(single.tensors) == N_TENSORS


def test_split_dump_shows_all_shards(model: Path, tmp_path: Path, capsys):
    shards = split_gguf(model, tmp_path / "m", max_tensors=4)
    rc, out, _ = cli(capsys, "gguf", "dump", shards[0], "--json")
    d = json.loads(out)
    assert rc == 0 and d["n_tensors"] == N_TENSORS and len(d["shards"]) == 3
    assert d["metadata"]["split.count"] == 3
    assert [t["shard"] for t in d["tensors"]] == [0] * 4 + [1] * 4 + [2] * 2
    # a later shard is shown on its own
    d2 = to_dict(shards[1])
    assert d2["n_tensors"] == 4 and list(d2["metadata"]) == [
        "split.no",
        "split.count",
        "split.tensors.count",
    ]


def test_missing_shard(model: Path, tmp_path: Path, capsys):
    shards = split_gguf(model, tmp_path / "m", max_tensors=4)
    shards[1].unlink()
    with pytest.raises(GGUFError, match="missing shard 2 of 3") as ei:
        GGUFModelFile(shards[0])
    assert str(shards[1]) in str(ei.value)
    with pytest.raises(GGUFError, match="missing shard"):
        merge_gguf(shards[0], tmp_path / "merged.gguf")
    assert not (tmp_path / "merged.gguf").exists()
    rc, _, err = cli(capsys, "gguf", "merge", shards[0], tmp_path / "merged.gguf")
    assert_one_line_error(rc, err, str(shards[1]))
    rc, _, err = cli(capsys, "gguf", "dump", shards[0])
    assert_one_line_error(rc, err, "missing shard 2 of 3")


def test_shard_errors(model: Path, tmp_path: Path):
    shards = split_gguf(model, tmp_path / "m", max_tensors=4)
    with pytest.raises(GGUFError, match="open the first shard"):
        GGUFModelFile(shards[1])
    with pytest.raises(GGUFError, match="open the first shard"):
        merge_gguf(shards[2], tmp_path / "x.gguf")
    # a shard that is in the wrong place
    shards[1].rename(tmp_path / "tmp")
    shards[2].rename(shards[1])
    (tmp_path / "tmp").rename(shards[2])
    with pytest.raises(GGUFError, match="expected shard 2 of 3"):
        GGUFModelFile(shards[0])
    # first shard renamed so the others cannot be found
    renamed = tmp_path / "renamed.gguf"
    shards[0].rename(renamed)
    with pytest.raises(GGUFError, match="cannot be found"):
        GGUFModelFile(renamed)


def test_merge_not_split(model: Path, tmp_path: Path):
    with pytest.raises(GGUFError, match="not a split model"):
        merge_gguf(model, tmp_path / "x.gguf")


def test_split_refuses_to_overwrite_input(tmp_path: Path):
    model = make_model(tmp_path / "m-00001-of-00001.gguf")
    with pytest.raises(UsageError, match="overwrite the input"):
        split_gguf(model, tmp_path / "m", max_tensors=1000)


def test_split_is_atomic(model: Path, tmp_path: Path, monkeypatch):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    calls = []
    real_write = GGUFWriter.write

    def failing_write(self, progress=None):
        calls.append(self.path)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real_write(self, progress)

    monkeypatch.setattr(GGUFWriter, "write", failing_write)
    with pytest.raises(OSError):
        split_gguf(model, out_dir / "m", max_tensors=4)
    assert os.listdir(out_dir) == []


# =========================================================================== CLI
def test_cli_split_merge_roundtrip(model: Path, tmp_path: Path, capsys):
    rc, out, _ = cli(
        capsys, "gguf", "split", model, tmp_path / "m", "--split-max-size", "3K", "--dry-run"
    )
    assert rc == 0 and "n_split:" in out and "dry run" in out
    assert not list(tmp_path.glob("m-*"))
    rc, out, _ = cli(capsys, "gguf", "split", model, tmp_path / "m", "--split-max-tensors", "6")
    assert rc == 0 and "n_split: 2" in out
    first = tmp_path / "m-00001-of-00002.gguf"
    assert first.exists()
    rc, out, _ = cli(capsys, "gguf", "merge", first, tmp_path / "merged.gguf")
    assert rc == 0 and "merged 2 shard(s)" in out
    assert filecmp.cmp(model, tmp_path / "merged.gguf", shallow=False)


@pytest.mark.parametrize(
    "argv",
    [
        ["gguf"],
        ["gguf", "frobnicate"],
        ["gguf", "dump"],
        ["gguf", "split", "IN"],
        ["gguf", "split", "IN", "P", "--split-max-size", "12X"],
        ["gguf", "split", "IN", "P", "--split-max-tensors", "0"],
        ["gguf", "split", "IN", "P", "--split-max-tensors", "2", "--split-max-size", "1M"],
        ["gguf", "merge", "ONLY_ONE"],
        ["gguf", "rename-tensor", "IN", "OUT", "PATTERN"],
    ],
)
def test_cli_usage_errors(argv: list[str], capsys):
    with pytest.raises(SystemExit) as ei:
        main(argv)
    assert ei.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "error:" in err


def test_cli_missing_inputs(tmp_path: Path, capsys):
    missing = tmp_path / "missing.gguf"
    for argv in (
        ["gguf", "set", missing, tmp_path / "o.gguf", "a=int:1"],
        ["gguf", "rename-tensor", missing, tmp_path / "o.gguf", "a", "b"],
        ["gguf", "split", missing, tmp_path / "p"],
        ["gguf", "merge", missing, tmp_path / "o.gguf"],
    ):
        rc, _, err = cli(capsys, *argv)
        assert_one_line_error(rc, err, "missing.gguf")


# =========================================================================== real models
@pytest.mark.real_model
@pytest.mark.parametrize(
    ("fixture", "split_args", "n_params"),
    [
        ("smollm2_path", {"max_tensors": 128}, "134.52 M"),
        ("gemma3_path", {"max_size": parse_size("100M")}, "268.10 M"),
    ],
)
def test_real_model_split_merge_identical(request, tmp_path, fixture, split_args, n_params):
    src: Path = request.getfixturevalue(fixture)
    assert f"Parameters: {n_params}" in dump_text(src, tensors=False)
    shards = split_gguf(src, tmp_path / "m", **split_args)
    assert len(shards) == 3
    with GGUFReader(src) as orig, GGUFModelFile(shards[0]) as m:
        assert list(m.fields) == list(orig.fields)
        assert [t.name for t in m.tensors] == [t.name for t in orig.tensors]
        for t in orig.tensors:
            assert np.array_equal(m.tensor(t.name).raw, t.raw), t.name
    merged = merge_gguf(shards[0], tmp_path / "merged.gguf")
    assert filecmp.cmp(src, merged, shallow=False)


def test_split_merge_file_with_stale_split_keys(tmp_path: Path):
    """A llama.cpp-merged file keeps split keys with split.count = 0; ours come back without."""
    src = make_model(tmp_path / "src.gguf")
    stale = tmp_path / "stale.gguf"
    # `gguf set` refuses split keys, so build the file by hand
    with GGUFReader(src) as r:
        w = GGUFWriter(stale)
        for f in r.fields.values():
            w.add_field(f)
        w.add("split.no", 0, GGUFValueType.UINT16)
        w.add("split.count", 0, GGUFValueType.UINT16)
        w.add("split.tensors.count", N_TENSORS, GGUFValueType.INT32)
        for t in r.tensors:
            w.add_tensor_info(t)
        w.write()
    with GGUFModelFile(stale) as m:  # split.count = 0: an ordinary file
        assert not m.is_split and "split.count" in m.fields
    shards = split_gguf(stale, tmp_path / "s", max_tensors=4)
    with GGUFReader(shards[0]) as r:
        assert r.get("split.count") == 3
    merged = merge_gguf(shards[0], tmp_path / "merged.gguf")
    assert filecmp.cmp(src, merged, shallow=False)


def test_merge_refuses_to_overwrite_a_shard(model: Path, tmp_path: Path):
    shards = split_gguf(model, tmp_path / "m", max_tensors=4)
    with pytest.raises(UsageError, match="overwrite the input shard"):
        merge_gguf(shards[0], shards[1])
