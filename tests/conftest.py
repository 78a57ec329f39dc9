"""Shared fixtures. Real models come from the model registry (`make models` pulls them)."""

from __future__ import annotations

from pathlib import Path

import pytest


def _registry_model(name: str) -> Path:
    from llamacpy.registry import ModelRegistry

    return ModelRegistry.from_environment().pull(name, quiet=True)


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """SmolLM2-135M-Instruct Q4_1 (llama architecture, BPE tokenizer)."""
    return _registry_model("smollm2-135m")


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    """Gemma-3-270M Q4_K_M (gemma3 architecture, SPM tokenizer)."""
    return _registry_model("gemma3-270m")


@pytest.fixture(scope="module")
def reuse_model():
    """Load the model once for the module: later loads with the same context size reuse it
    (the first load still goes through the real path)."""
    from llamacpy.api import model as api_model

    real = api_model.load_model
    cache: dict = {}

    def load(path, params, kv_overrides=None):
        key = (str(path), params.n_ctx)
        if key not in cache:
            cache[key] = real(path, params, kv_overrides)
        cache[key].ctx.clear()
        return cache[key]

    mp = pytest.MonkeyPatch()
    mp.setattr(api_model, "load_model", load)
    yield
    mp.undo()
