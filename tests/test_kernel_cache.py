"""The kernels' disk-cache stamp covers every kernel module a kernel imports, so editing a
helper recompiles its users instead of loading stale machine code."""

from __future__ import annotations

from pathlib import Path

import llamacpy
from llamacpy import kernel_cache

PKG = Path(llamacpy.__file__).resolve().parent


def test_closure_follows_relative_and_absolute_imports() -> None:
    # quants modules import their helpers with absolute ``from llamacpy.quants...`` lines
    q4 = {p.name for p in kernel_cache._closure(PKG / "quants" / "q4_0.py")}
    assert {"q4_0.py", "_helpers.py"} <= q4
    # the llama forward inlines ops kernels through relative imports, across packages
    fwd = {
        str(p.relative_to(PKG)) for p in kernel_cache._closure(PKG / "models" / "llama_kernel.py")
    }
    assert {"ops/attention.py", "ops/matmul.py", "ops/simd.py"} <= fwd
    assert not any(p.startswith("gguf/") for p in fwd)  # only kernel packages count


def test_stamp_changes_when_an_imported_helper_changes(tmp_path: Path, monkeypatch) -> None:
    pkg = tmp_path / "ops"
    pkg.mkdir()
    (pkg / "helper.py").write_text("X = 1\n")
    (pkg / "kernel.py").write_text("from .helper import X\n")
    (pkg / "other.py").write_text("Y = 2\n")
    monkeypatch.setattr(kernel_cache, "_KERNEL_DIRS", (pkg,))
    before = kernel_cache.kernel_stamp(str(pkg / "kernel.py"))
    (pkg / "other.py").write_text("Y = 3\n")  # not imported: same stamp
    assert kernel_cache.kernel_stamp(str(pkg / "kernel.py")) == before
    (pkg / "helper.py").write_text("X = 2  # edited\n")
    assert kernel_cache.kernel_stamp(str(pkg / "kernel.py")) != before


def test_every_kernel_package_registers_the_locator() -> None:
    for name in kernel_cache.KERNEL_PACKAGES:
        assert (PKG / name).is_dir(), name
    from numba.core import caching

    assert caching.CacheImpl._locator_classes[0].__name__.endswith("KernelLocator")
