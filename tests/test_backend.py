"""The backend seam (models/backend.py): weights, memory and the forward go through the
model's backend object."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llamacpy.engine import Batch, Context, ContextParams
from llamacpy.errors import UsageError
from llamacpy.gguf import GGMLType
from llamacpy.models import load_model
from llamacpy.models.backend import CPU, CPUBackend, backend
from llamacpy.models.tiny import write_tiny_llama


class Recording(CPUBackend):
    """The CPU backend, counting what the model and the engine ask of it."""

    name = "recording"

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    def _count(self, what: str) -> None:
        self.calls[what] = self.calls.get(what, 0) + 1

    def place_weights(self, store, source) -> None:
        self._count("place_weights")
        super().place_weights(store, source)

    def zeros(self, shape, dtype):
        self._count("zeros")
        return super().zeros(shape, dtype)

    def forward_kernel(self, block):
        self._count("forward_kernel")
        return super().forward_kernel(block)

    def workspace(self, kind, *args):
        self._count("workspace")
        return super().workspace(kind, *args)

    def run(self, kernel, args, store, n_threads):
        self._count("run")
        super().run(kernel, args, store, n_threads)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("backend") / "tiny.gguf"
    write_tiny_llama(path, GGMLType.Q8_0, seed=5)
    return path


def _decode(ctx: Context) -> np.ndarray:
    first = ctx.decode(Batch.from_tokens([1, 40, 41, 42, 43], logits="all"))
    step = ctx.decode(Batch.from_tokens([44], pos0=5))
    return np.concatenate([first, step])


def test_weights_memory_and_forward_go_through_the_backend(tiny: Path) -> None:
    rec = Recording()
    model = load_model(tiny, backend=rec)
    assert model.backend is rec
    ctx = Context(
        model=model, params=ContextParams(n_ctx=64, n_threads=2, n_ubatch=4, kernel_formats="all")
    )
    got = _decode(ctx)
    assert rec.calls["place_weights"] == 1 and rec.calls["forward_kernel"] == 1
    assert rec.calls["zeros"] == 2  # K and V cells
    assert rec.calls["workspace"] == 1
    assert rec.calls["run"] == 3  # ubatches of 4 + 1 tokens, then one decode
    plain = Context(tiny, ContextParams(n_ctx=64, n_threads=2, n_ubatch=4, kernel_formats="all"))
    assert plain.model.backend is CPU
    np.testing.assert_array_equal(got, _decode(plain))


def test_an_unknown_backend_is_a_usage_error(tiny: Path) -> None:
    with pytest.raises(UsageError, match="unknown backend 'cuda'; available: cpu"):
        ContextParams(backend="cuda").check()
    with pytest.raises(UsageError, match="unknown backend 'gpu'"):
        load_model(tiny, backend="gpu")
    assert backend(None) is CPU and backend("cpu") is CPU
