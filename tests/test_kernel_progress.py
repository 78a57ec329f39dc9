"""The first-run progress line: what numba's compile events make of it, on a terminal and
on a pipe, the manifest's totals and the disk-cache check."""

from __future__ import annotations

import io
import re

import numpy as np
import pytest
from numba import njit
from numba.core import event

from llamacpy import kernel_progress
from llamacpy.kernel_progress import CompileProgress, is_cached, kernel_id


def _fresh_kernels():
    """A kernel calling a helper, new objects each call (so each call compiles)."""

    @njit
    def helper(x):
        return x * 2.0

    @njit
    def kernel(x):
        return helper(x) + 1.0

    return kernel


def _compile_with(progress: CompileProgress, arg=1.5):
    with event.install_listener("numba:compile", progress):
        k = _fresh_kernels()
        assert k(arg) == arg * 2.0 + 1.0
    return k


def test_pipe_gets_one_line_per_kernel_and_a_summary():
    out = io.StringIO()
    p = CompileProgress(out, interactive=False)
    _compile_with(p)
    _compile_with(p, 2)  # a second kernel (int signature)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert re.fullmatch(r"llamacpy: compiling kernels .* 1 done test_kernel_progress\."
                        r"_fresh_kernels\.<locals>\.kernel compiled in \d+\.\d s", lines[0])  # fmt: skip
    assert " 2 done " in lines[1]
    p.finish()
    assert re.fullmatch(r"llamacpy: compiled 2 kernels in \d+ s \(cached: .*\)",
                        out.getvalue().splitlines()[-1])  # fmt: skip
    p.finish()  # nothing compiled since: nothing more is written
    assert len(out.getvalue().splitlines()) == 3


def test_terminal_line_is_redrawn_and_cleared():
    out = io.StringIO()
    p = CompileProgress(out, {"some.module:never_compiled": 9.0}, interactive=True)
    _compile_with(p)
    text = out.getvalue()
    # drawn at the kernel's start (0 nested functions yet), cleared at its end
    assert "\r\x1b[K" in text and not text.endswith("\n")
    first = text.split("\r\x1b[K")[1]
    assert re.search(r"\[-+\] 0/2 test_kernel_progress\..*kernel: 0 functions, \d+:\d\d$", first)
    assert text.endswith("\r\x1b[K")  # the line is gone when the kernel is done
    assert len(p.done) == 1
    p.finish()
    assert re.search(r"compiled 1 kernel in \d+ s \(cached: later runs start at once\)\n$",
                     out.getvalue())  # fmt: skip


def test_nested_functions_are_counted_while_the_kernel_compiles():
    seen = []

    class Spy(CompileProgress):
        def on_end(self, ev):
            if self.depth == 2:  # the helper ends inside the kernel
                seen.append(self._line())
            super().on_end(ev)

    p = Spy(io.StringIO(), interactive=True)
    _compile_with(p)
    assert seen and re.search(r"1 function, \d+:\d\d$", seen[0])


def test_kernels_already_cached_are_not_counted():
    from llamacpy.sampling import penalties

    penalties._logf(np.float32(2.0))  # compiled or loaded: in the disk cache now
    kid = kernel_id(penalties._logf)
    assert kid == "llamacpy.sampling.penalties:_logf"
    assert is_cached(kid)
    assert not is_cached("llamacpy.sampling.penalties:no_such_kernel")
    assert not is_cached("numpy:sum")
    p = CompileProgress(io.StringIO(), {kid: 1.0, "x.y:z": 2.0}, interactive=False)
    _compile_with(p)
    assert set(p.planned) == {"x.y:z", p.done[0]}


def test_manifest_names_existing_kernels():
    import importlib

    assert {"run", "chat"} <= set(kernel_progress.MANIFEST)
    for kernels in kernel_progress.MANIFEST.values():
        assert kernels
        for kid, seconds in kernels.items():
            module, _, qual = kid.partition(":")
            if kid == "llamacpy.models.compose:worker":  # generated, named as its maker
                from llamacpy.models.compose import compiled_forward
                from llamacpy.models.decoder import LLAMA_BLOCK

                assert getattr(compiled_forward(LLAMA_BLOCK).worker, "py_func", None), kid
                continue
            obj = importlib.import_module(module)
            for part in qual.split("."):
                obj = getattr(obj, part)
            assert hasattr(obj, "py_func"), kid  # a numba dispatcher
            assert seconds >= 0


@pytest.mark.parametrize("broken", [ValueError, OSError])
def test_a_broken_stream_does_not_fail_the_compile(broken):
    class Broken(io.StringIO):
        def write(self, s):
            raise broken("closed")

    p = CompileProgress(Broken(), interactive=False)
    _compile_with(p)
    p.finish()
