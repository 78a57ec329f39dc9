"""Shared fixtures. Real models come from the model registry (`make models` pulls them)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# One compiled forward per architecture for every weight format (instead of one per format
# set: tiny F32, Q8_0 and real-model tests of an architecture share it), which keeps the
# cold suite's compile time down; subprocesses inherit it. Tests of the per-model format
# set pass kernel_formats="model" (or this variable) explicitly.
os.environ.setdefault("LLAMACPY_KERNEL_FORMATS", "all")


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


# ------------------------------------------------------------- where compile time goes
# LLAMACPY_COMPILE_LOG=FILE: one line per kernel compiled (cache misses only), with the
# test that triggered it, its nesting depth, its first argument's type when that is a
# FormatSet/Ctx, and the seconds it took including nested compiles. For keeping the cold
# suite's compile time in check (see scripts/compile_report.py; under pytest-xdist, one
# file per worker: FILE.gw0, FILE.gw1, ...).
_COMPILE_LOG = os.environ.get("LLAMACPY_COMPILE_LOG")
_current_test = ["(collection)"]


def pytest_runtest_setup(item):
    _current_test[0] = item.nodeid


if _COMPILE_LOG:
    import time

    from numba.core import event

    class _CompileLog(event.Listener):
        def __init__(self, path: str) -> None:
            self.out = open(path, "a", buffering=1)  # noqa: SIM115 (lives with the process)
            self.stack: list[float] = []

        def on_start(self, ev):
            self.stack.append(time.perf_counter())

        def on_end(self, ev):
            t0 = self.stack.pop()
            d = ev.data["dispatcher"]
            sig = ev.data.get("args") or ()
            first = str(sig[0])[:60] if sig else ""
            kind = first if ("FormatSet" in first or first.startswith("Ctx")) else ""
            name = f"{d.py_func.__module__}:{d.py_func.__qualname__}"
            self.out.write(
                f"{_current_test[0]}\t{len(self.stack)}\t{name}\t{kind}\t"
                f"{time.perf_counter() - t0:.2f}\n"
            )

    # one file per pytest-xdist worker (the report reads each in its own order)
    _worker = os.environ.get("PYTEST_XDIST_WORKER")
    event.register(
        "numba:compile", _CompileLog(f"{_COMPILE_LOG}.{_worker}" if _worker else _COMPILE_LOG)
    )
