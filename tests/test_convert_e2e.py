"""End to end: a converted checkpoint runs in llamacpy with the logits transformers gives.

The tiny checkpoints of the oracle fixtures are rebuilt, converted to F32 GGUF and decoded
by llamacpy's engine; transformers runs the original checkpoint on the same tokens. Logits
must agree to 1e-3 relative to their largest magnitude. Architectures the engine does not
run yet are skipped (they are enabled automatically once ``llamacpy.models`` has them).
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

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "convert"
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

    try:
        return ensure_testdata()
    except Exception as e:
        pytest.skip(f"llama.cpp test data unavailable: {e}")


def hf_logits(model_dir: Path, ids: list[int]) -> np.ndarray:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def llamacpy_logits(gguf: Path, ids: list[int]) -> np.ndarray:
    from llamacpy.engine import Batch, Context, ContextParams

    ctx = Context(gguf, ContextParams(n_ctx=64, n_batch=64, n_ubatch=64))
    return ctx.decode(Batch.from_tokens(ids, logits="all"))


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_converted_model_matches_transformers(case: str, testdata: Path, tmp_path: Path) -> None:
    from llamacpy.models import supported_architectures

    if ARCH[case] not in supported_architectures():
        pytest.skip(f"the engine does not run {ARCH[case]!r} models yet")
    with gzip.open(FIXTURES / f"{case}.json.gz", "rt", encoding="utf-8") as f:
        spec = json.load(f)["spec"]
    model_dir = _checkpoint_builder().build_checkpoint(spec, tmp_path, testdata)
    result = convert(ConvertOptions(model_dir, outfile=tmp_path / "m.gguf", outtype="f32"))
    n_vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    ids = np.random.default_rng(7).integers(3, min(n_vocab, 32000), size=12).tolist()
    want = hf_logits(model_dir, ids)
    got = llamacpy_logits(result.paths[0], ids)
    assert got.shape == want.shape
    err = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
    assert err <= RTOL, f"{case}: max |diff| / max |logit| = {err:.2e}"
