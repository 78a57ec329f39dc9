#!/usr/bin/env python
"""Expected logits for the converter's end-to-end test (dev-only: needs torch + transformers).

For every tiny checkpoint of ``tests/fixtures/convert/*.json.gz`` (rebuilt bit for bit by
``scripts/convert_checkpoints.py``), transformers runs the original Hugging Face checkpoint
in float32 on 12 seeded token ids. Stored per case in ``tests/fixtures/convert/e2e_logits.npz``:
the ids, the largest |logit| of the whole output, the argmax of every row, and the logits of
512 seeded vocabulary columns (plus the argmax columns) — enough to check agreement to 1e-3
without committing whole vocabularies.

    PYTHONPATH=src:scripts:tests python scripts/make_convert_e2e_fixtures.py
"""

from __future__ import annotations

import gzip
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "scripts"), str(ROOT / "tests")]

from convert_checkpoints import build_checkpoint  # noqa: E402
from llama_cpp_testdata import ensure_testdata  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "convert"
CASES = ["llama_legacy", "mistral", "llama3", "qwen2", "qwen3", "gemma3", "phi3"]
N_TOKENS, N_COLS = 12, 512


def case_ids(n_vocab: int) -> np.ndarray:
    return np.random.default_rng(7).integers(3, min(n_vocab, 32000), size=N_TOKENS)


def case_cols(n_vocab: int, argmax: np.ndarray) -> np.ndarray:
    cols = np.random.default_rng(11).choice(n_vocab, size=min(N_COLS, n_vocab), replace=False)
    return np.unique(np.concatenate([cols, argmax]))


def main() -> None:
    testdata = ensure_testdata()
    out: dict[str, np.ndarray] = {}
    for case in CASES:
        with gzip.open(FIXTURES / f"{case}.json.gz", "rt", encoding="utf-8") as f:
            spec = json.load(f)["spec"]
        with tempfile.TemporaryDirectory() as tmp:
            model_dir = build_checkpoint(spec, Path(tmp), testdata)
            n_vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
            ids = case_ids(n_vocab)
            model = AutoModelForCausalLM.from_pretrained(
                model_dir, dtype=torch.float32, attn_implementation="eager"
            )
            model.eval()
            with torch.no_grad():
                logits = model(torch.tensor([ids.tolist()])).logits[0].float().numpy()
        argmax = logits.argmax(-1)
        cols = case_cols(n_vocab, argmax)
        out[f"{case}.ids"] = ids.astype(np.int32)
        out[f"{case}.cols"] = cols.astype(np.int32)
        out[f"{case}.logits"] = logits[:, cols].astype(np.float32)
        out[f"{case}.argmax"] = argmax.astype(np.int32)
        out[f"{case}.maxabs"] = np.float32(np.abs(logits).max())
        print(f"{case}: vocab {n_vocab}, max |logit| {np.abs(logits).max():.3f}")
    np.savez_compressed(FIXTURES / "e2e_logits.npz", **out)


if __name__ == "__main__":
    main()
