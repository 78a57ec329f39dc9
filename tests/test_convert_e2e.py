"""End to end: a converted checkpoint runs in llamacpy with the logits transformers gives.

The tiny checkpoints of the converter fixtures are rebuilt (numpy only), converted to F32
GGUF and decoded by llamacpy's engine on 12 seeded tokens. Expected values come from
transformers running the original checkpoint (``scripts/make_convert_e2e_fixtures.py``,
dev-only): logits must agree to 1e-3 relative to the largest |logit| on the stored columns,
and every row's argmax must be the same. Architectures the engine does not run yet are
skipped (they are enabled automatically once ``llamacpy.models`` has them).
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from llamacpy.convert import ConvertOptions, convert
from llamacpy.models import supported_architectures

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "convert"
EXPECTED = np.load(FIXTURES / "e2e_logits.npz")
CASES = ["llama_legacy", "mistral", "llama3", "qwen2", "qwen3", "gemma3", "phi3"]
ARCH = {"llama_legacy": "llama", "mistral": "llama", "llama3": "llama", "qwen2": "qwen2",
        "qwen3": "qwen3", "gemma3": "gemma3", "phi3": "phi3"}  # fmt: skip
RTOL = 1e-3


def _checkpoint_builder():
    spec = importlib.util.spec_from_file_location(
        "convert_checkpoints", ROOT / "scripts" / "convert_checkpoints.py"
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules["convert_checkpoints"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def testdata() -> Path:
    sys.path.insert(0, str(ROOT / "tests"))
    from llama_cpp_testdata import ensure_testdata

    return ensure_testdata()


@pytest.mark.parametrize("case", CASES)
def test_converted_model_matches_transformers(case: str, testdata: Path, tmp_path: Path) -> None:
    from llamacpy.engine import Batch, Context, ContextParams

    if ARCH[case] not in supported_architectures():
        pytest.skip(f"the engine does not run {ARCH[case]!r} models yet")
    with gzip.open(FIXTURES / f"{case}.json.gz", "rt", encoding="utf-8") as f:
        spec = json.load(f)["spec"]
    model_dir = _checkpoint_builder().build_checkpoint(spec, tmp_path, testdata)
    result = convert(ConvertOptions(model_dir, outfile=tmp_path / "m.gguf", outtype="f32"))
    ids = EXPECTED[f"{case}.ids"].tolist()
    ctx = Context(result.paths[0], ContextParams(n_ctx=64, n_batch=64, n_ubatch=64))
    got = ctx.decode(Batch.from_tokens(ids, logits="all"))
    assert got.shape[0] == len(ids)
    np.testing.assert_array_equal(got.argmax(-1), EXPECTED[f"{case}.argmax"])
    want = EXPECTED[f"{case}.logits"]
    err = float(np.abs(got[:, EXPECTED[f"{case}.cols"]] - want).max() / EXPECTED[f"{case}.maxabs"])
    assert err <= RTOL, f"{case}: max |diff| / max |logit| = {err:.2e}"
