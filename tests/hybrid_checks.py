"""What the recurrent and hybrid architectures' tests (qwen35/lfm2, mamba2, granitehybrid)
share: their tiny models' contexts, the numpy specification in place of the compiled
forward, and the comparisons with llama.cpp's logits."""

from __future__ import annotations

import numpy as np

from llamacpy.engine import Context, ContextParams
from llamacpy.models.reference import Reference


def context(path, **kw) -> Context:
    return Context(path, ContextParams(**{"n_ctx": 64, "n_threads": 2, **kw}))


def reference_context(path, **kw) -> Context:
    """A context whose forward is the numpy specification (``models/reference.py``'s stage
    functions over the hybrid memory), not the compiled one."""
    ctx = context(path, **kw)
    ref = Reference(ctx.model)
    ctx.model.forward = lambda ws, ub, kv, n_threads, det=False: ref.forward(ub, kv, n_threads)
    return ctx


def assert_close(rtol: dict[str, float], name: str, got, want) -> None:
    """``got`` within ``rtol[name]`` of max|logit| of llama.cpp's ``want``, same argmax."""
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < rtol[name], f"{name}: max |diff| / max |logit| = {err:.2e}"
    assert (got.argmax(-1) == want.argmax(-1)).all()


def assert_engine_close(rtol: dict[str, float], name: str, got, want) -> None:
    """The compiled engine: Q8_0 bit-identical to llama.cpp (measured), else as
    :func:`assert_close`."""
    if name == "Q8_0":
        np.testing.assert_array_equal(got, want)
    else:
        assert_close(rtol, name, got, want)
