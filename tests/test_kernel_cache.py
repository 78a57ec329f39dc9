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
    # the forward's stages inline ops kernels through relative imports, across packages
    fwd = {str(p.relative_to(PKG)) for p in kernel_cache._closure(PKG / "models" / "stages.py")}
    assert {"ops/attention.py", "ops/matmul.py", "simd/__init__.py"} <= fwd
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


# a subprocess whose kernel package is ``sys.argv[1]`` (``ops``, its module ``kernel``)
_PROLOGUE = r"""
import sys
from pathlib import Path
import numpy as np
from llamacpy import kernel_cache
pkg = Path(sys.argv[1])
kernel_cache._KERNEL_DIRS = (pkg,)
sys.path.insert(0, str(pkg.parent))
from ops import kernel
"""


def _kernel_package(tmp_path: Path, source: str) -> Path:
    """A package ``ops`` whose module ``kernel`` is ``source``."""
    pkg = tmp_path / "ops"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "kernel.py").write_text(source)
    return pkg


def _run_script(body: str, pkg: Path, *args: str) -> list[str]:
    """Run :data:`_PROLOGUE` + ``body`` in a fresh interpreter; its stdout's words."""
    import subprocess
    import sys

    p = subprocess.run(
        [sys.executable, "-c", _PROLOGUE + body, str(pkg), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout.split()


_LAZY_RUN = r"""
out = [kernel.callee(1)]
if sys.argv[2] == "link":  # callee comes from the cache; caller is compiled and links it
    lib = kernel.callee.overloads[kernel.callee.signatures[0]].library
    out += [sum(kernel.callee.stats.cache_hits.values()), hasattr(lib, "_llamacpy_bitcode")]
    out += [kernel.caller(1), hasattr(lib, "_llamacpy_bitcode")]
print(*out)
"""


def test_cached_kernels_load_lazily_and_still_link(tmp_path: Path) -> None:
    """A cached kernel is loaded without parsing its bitcode; a later compilation that calls
    it links its library (the bitcode is parsed then) and runs correctly."""
    pkg = _kernel_package(
        tmp_path,
        "from numba import njit\n\n"
        "@njit(cache=True)\ndef callee(x):\n    return x * 2 + 1\n\n"
        "@njit(cache=True)\ndef caller(x):\n    return callee(x) + 1\n",
    )

    def run(mode: str) -> list[str]:
        return _run_script(_LAZY_RUN, pkg, mode)

    assert run("compile") == ["3"]
    # loaded from the cache with its bitcode left unparsed, parsed when caller links it
    assert run("link") == ["3", "1", "True", "4", "False"]
    # an index written by another version, naming a module that is gone: a cache miss
    import pickle

    for nbi in (pkg / "__pycache__").glob("kernel.callee-*.nbi"):
        with nbi.open("rb") as f:
            version = pickle.load(f)
        nbi.write_bytes(pickle.dumps(version) + b"cgone_module_of_an_old_version\nT\n.")
    assert run("compile") == ["3"]  # compiled again, index rewritten
    assert run("link")[:2] == ["3", "1"]  # and loaded from it next time


def test_elf_symbols_are_read_from_the_object_code() -> None:
    assert kernel_cache.elf_defined_symbols(b"not an object file") is None
    from numba import njit

    @njit
    def f(x):
        return x + 1

    f(1)
    lib = f.overloads[f.signatures[0]].library
    obj = lib._get_compiled_object() if lib._object_caching_enabled else None
    if obj is None:  # not compiled with object caching: emit it
        obj = lib._codegen._tm.emit_object(lib._final_module)
    names = kernel_cache.elf_defined_symbols(obj)
    assert names and any(n.startswith("_ZN") for n in names)
    mod = lib._final_module
    defined = {g.name for g in (*mod.functions, *mod.global_variables) if not g.is_declaration}
    assert {n for n in defined if not n.startswith(".") and "switch.table" not in n} <= names


_NRT_RUN = r"""
from numba import njit
from numba.core.runtime import rtsys
from llamacpy import kernel_cache

@njit
def alloc(n):  # uses the runtime: array allocation and reference counting
    a = [i * 2 for i in range(n)]
    return sum(a) + len(a)

print(alloc(100), rtsys.library.get_pointer_to_function("nrt_atomic_add") != 0)
"""


def test_the_runtime_library_is_cached_and_works(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}

    def run() -> str:
        p = subprocess.run(
            [sys.executable, "-c", _NRT_RUN], capture_output=True, text=True, env=env, timeout=300
        )
        assert p.returncode == 0, p.stderr[-3000:]
        return p.stdout.strip()

    assert run() == "10000 True"  # compiled, then kept
    assert len(list(tmp_path.glob("nrt-*.bin"))) == 1
    assert run() == "10000 True"  # loaded from the file
    for f in tmp_path.glob("nrt-*.bin"):  # a damaged file is compiled again, not trusted
        f.write_bytes(b"garbage")
    assert run() == "10000 True"


_ENV_RUN = r"""
out = [kernel.sorted_sum(5)]
if sys.argv[2] == "load":
    import numba
    out.append("numba.np.arrayobj" in sys.modules)  # not imported to load the kernel
    @numba.njit
    def fresh(n):  # compiled now: needs numba's array helpers, maybe the same environments
        return np.sort(np.arange(n)[::-1] * 2.0)[1]
    out += [fresh(4), kernel.sorted_sum(5), "numba.np.arrayobj" in sys.modules]
print(*out)
"""


def test_cached_kernels_load_without_importing_numba_helpers(tmp_path: Path) -> None:
    """Loading a cached kernel whose environments name numba modules not imported yet does
    not import them (stand-in globals); a later compilation still works, and the kernel
    still runs."""
    pkg = _kernel_package(
        tmp_path,
        "import numpy as np\nfrom numba import njit\n\n"
        "@njit(cache=True)\ndef sorted_sum(n):\n"
        "    a = np.sort(np.arange(n)[::-1].astype(np.float64))\n"
        "    return a[0] + a[-1] * 10\n",
    )
    assert _run_script(_ENV_RUN, pkg, "compile") == ["40.0"]
    assert _run_script(_ENV_RUN, pkg, "load") == ["40.0", "False", "2.0", "40.0", "True"]


def test_plain_arrays_are_typed_as_numba_types_them() -> None:
    import numpy as np
    import pytest
    from numba import errors, typeof

    arrays = [
        np.zeros((2, 3), np.float32),
        np.zeros((4, 6), np.int8)[:, ::2],
        np.zeros((3, 2), np.float64).T,
        np.zeros(5, np.uint16).view(np.float16),
        np.zeros(0, np.int64),
        np.zeros((2, 2, 2), np.complex64),
    ]
    ro = np.zeros(3)
    ro.flags.writeable = False
    for a in [*arrays, ro]:
        assert typeof(a) == kernel_cache._numba_typeof_ndarray(a, None), a
    with pytest.raises(errors.NumbaTypeError, match="MaskedArray"):
        typeof(np.ma.masked_array([1, 2]))
    with pytest.raises(errors.NumbaValueError, match="dtype"):
        typeof(np.zeros(2, dtype=[("a", object)]))


_MA_RUN = r"""
print(kernel.total(np.arange(4.0)), "numpy.ma" in sys.modules)
"""


def test_calling_a_cached_kernel_does_not_import_numpy_ma(tmp_path: Path) -> None:
    pkg = _kernel_package(
        tmp_path, "from numba import njit\n\n@njit(cache=True)\ndef total(a):\n    return a.sum()\n"
    )
    _run_script(_MA_RUN, pkg)  # compiled
    assert _run_script(_MA_RUN, pkg) == ["6.0", "False"]  # loaded from the cache


def test_environments_pickle_as_numba_s_own() -> None:
    """Cache entries written here (a user's own kernels' too) name numba's ``_rebuild_env``,
    so they load in a process without llamacpy."""
    import pickle

    from numba.core import environment

    env = environment.Environment({"__name__": "numba.np.arrayobj"})
    env.env_name = "_test_env_pickling"
    data = pickle.dumps(env)
    assert b"llamacpy" not in data and b"numba.core.environment" in data
    assert pickle.loads(data).env_name == env.env_name
