"""Disk caching of compiled kernels, invalidated when a kernel or anything it uses changes.

numba's ``cache=True`` keys a function's cache on the hash of *its own* source file, but the
kernels here inline helpers from other modules (``simd.py``, the format kernels, ...): after
an edit of a helper, a caller would load stale machine code. This locator keys a kernel of
the kernel packages (:data:`KERNEL_PACKAGES`) on the hash of its file together with every
file of those packages that it imports, directly or not (found by reading its ``from ...
import`` lines, relative or ``llamacpy.``-absolute). Each kernel package calls
:func:`install` before defining kernels; it applies only to files inside those packages; the cache lives in ``__pycache__`` next to the sources, or in numba's user-wide
cache directory when the package directory is read-only. Loading these cached kernels also
skips numba's full context refresh (see :func:`_load_overload`), which halves start time.
"""

from __future__ import annotations

import hashlib
import os
import re
from functools import cache
from pathlib import Path

from numba.core import caching, config
from numba.core.runtime import rtsys

_ROOT = Path(__file__).resolve().parent  # the llamacpy package
KERNEL_PACKAGES = ("quants", "ops", "tokenizer", "sampling", "models", "engine", "quantize")
_KERNEL_DIRS = tuple(_ROOT / p for p in KERNEL_PACKAGES)
_ROOT_S = str(_ROOT)


def _module_file(pkg_dir: str, level: int, module: str | None, name: str | None) -> str | None:
    base = pkg_dir
    for _ in range(level - 1):
        base = os.path.dirname(base)
    parts = (module.split(".") if module else []) + ([name] if name else [])
    for n in (len(parts), len(parts) - 1):
        if n <= 0 and not parts:
            return None
        cand = os.path.join(base, *parts[:n])
        if os.path.isfile(cand + ".py"):
            return cand + ".py"
        init = os.path.join(cand, "__init__.py")
        if n == len(parts) and os.path.isfile(init):
            return init
    return None


_FROM = re.compile(
    r"^[ \t]*from[ \t]+(\.+|llamacpy\.)([\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n]*)", re.M
)


@cache
def _import_names(path: str, mtime_ns: int) -> tuple[str, ...]:
    """Kernel-package files imported (relatively or ``llamacpy.``-absolutely) by the resolved
    file ``path`` (a cheap scan of the source: this runs on every start)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    found, dirs = set(), {str(d) for d in _KERNEL_DIRS}
    for dots, module, names in _FROM.findall(text):
        listed = [n.split(" as ")[0].strip() for n in names.strip("()").split(",")]
        # ``from llamacpy.x import y`` resolves from the package root like ``from .x``
        base, level = (_ROOT_S, 1) if dots == "llamacpy." else (os.path.dirname(path), len(dots))
        for nm in [None, *[n for n in listed if n.isidentifier()]]:
            f = _module_file(base, level, module or None, nm)
            if f is not None and os.path.dirname(os.path.normpath(f)) in dirs:
                found.add(os.path.normpath(f))
    return tuple(sorted(found))


def _closure(path: Path) -> list[Path]:
    return [Path(p) for p, _ in _closure_stats(str(path.resolve()))]


def _closure_stats(path: str) -> list[tuple[str, os.stat_result]]:
    """``path`` (resolved) and every kernel file it imports, directly or not, with their
    stat: one ``stat`` per file, plain strings (this runs for each kernel at import)."""
    seen: dict[str, os.stat_result] = {}
    todo = [path]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        try:
            st = os.stat(p)
        except OSError:
            continue
        seen[p] = st
        todo.extend(_import_names(p, st.st_mtime_ns))
    return sorted(seen.items())


@cache
def _hash(files: tuple[tuple[str, int, int], ...]) -> bytes:
    h = hashlib.sha256()
    for name, _, _ in files:
        h.update(name.encode())
        h.update(Path(name).read_bytes())
    return h.digest()


@cache
def _resolved(py_file: str) -> Path | None:
    try:
        return Path(py_file).resolve()
    except OSError:
        return None


def kernel_stamp(py_file: str) -> bytes:
    """Hash of a kernel file and of every kernel file it depends on (re-hashed when any of
    them changes on disk, even within one process)."""
    path = _resolved(py_file) or Path(py_file)
    files = tuple((p, st.st_mtime_ns, st.st_size) for p, st in _closure_stats(str(path)))
    return _hash(files)


def _is_kernel_file(py_file: str) -> bool:
    path = _resolved(py_file)
    return path is not None and any(path.parent == d for d in _KERNEL_DIRS)


_WRITABLE: set[str] = set()  # cache directories already checked in this process


class _StampMixin:
    def get_source_stamp(self):
        return kernel_stamp(self._py_file)

    def ensure_cache_path(self):
        """numba checks the directory (mkdir + a temporary file) for every kernel; once per
        directory is enough."""
        path = self.get_cache_path()
        if path not in _WRITABLE:
            super().ensure_cache_path()
            _WRITABLE.add(path)


class _InTreeKernelLocator(_StampMixin, caching.InTreeCacheLocator):
    @classmethod
    def from_function(cls, py_func, py_file):
        if not _is_kernel_file(py_file):
            return None
        return super().from_function(py_func, py_file)


class _UserWideKernelLocator(_StampMixin, caching.UserWideCacheLocator):
    @classmethod
    def from_function(cls, py_func, py_file):
        if not _is_kernel_file(py_file):
            return None
        return super().from_function(py_func, py_file)


_KERNEL_LOCATORS: tuple[type, ...] = ()
_numba_load_overload = caching.Cache.load_overload


def _load_overload(self, sig, target_context):
    """numba refreshes its whole lowering library (hundreds of modules: ~0.3 s and ~30 MB)
    before every cache lookup; loading cached machine code only needs its runtime. Kernels
    of this package skip the refresh (a cache miss compiles, and compiling refreshes)."""
    if not isinstance(self._impl.locator, _KERNEL_LOCATORS):
        return _numba_load_overload(self, sig, target_context)
    rtsys.initialize(target_context)
    with self._guard_against_spurious_io_errors():
        return self._load_overload(sig, target_context)


def install() -> None:
    """Put the kernel locators first in numba's list (idempotent)."""
    global _KERNEL_LOCATORS
    _KERNEL_LOCATORS = (_InTreeKernelLocator, _UserWideKernelLocator)
    caching.Cache.load_overload = _load_overload
    classes = caching.CacheImpl._locator_classes
    for cls in (_UserWideKernelLocator, _InTreeKernelLocator):
        if cls not in classes:
            classes.insert(0, cls)
    # numba's own override (NUMBA_CACHE_DIR) keeps precedence when the user sets it
    if config.CACHE_DIR:
        classes.remove(caching.UserProvidedCacheLocator)
        classes.insert(0, caching.UserProvidedCacheLocator)


install()  # importing this module is what a kernel package does first


def preload(kernel, args: tuple) -> None:
    """Load ``kernel``'s machine code for the types of ``args`` (from this cache, or
    compile it) without running it: the signature is the one a call with ``args`` uses."""
    from numba import typeof

    kernel.compile(tuple(typeof(a) for a in args))
