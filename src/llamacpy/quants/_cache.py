"""Make numba's on-disk cache of this package's kernels expire when any of its modules change.

numba keys a cached kernel on the source of the file that defines it, not on the helpers it
inlines from other files: after an edit to ``_helpers.py`` or ``_search.py`` the kernels in
the format modules would keep running the old helper code. Here every kernel of the package
gets one stamp, a hash of all ``llamacpy/quants/*.py``; any change recompiles them all (about
a minute on two cores) instead of silently mixing versions. Where the kernels are cached is
left to numba (``__pycache__`` next to the sources, or ``NUMBA_CACHE_DIR``).

Imported by ``_helpers`` before any kernel is defined. If numba's (internal) locator API is
not as expected, numba's default behaviour is kept.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from numba.core import caching

_DIR = Path(__file__).resolve().parent


def _package_stamp() -> str:
    h = hashlib.sha256()
    for path in sorted(_DIR.glob("*.py")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


STAMP = _package_stamp()


class PackageStampLocator:
    """Wraps the locator numba would pick; only the source stamp differs."""

    def __init__(self, inner) -> None:
        self._inner = inner

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    def get_source_stamp(self) -> str:
        return STAMP

    @classmethod
    def from_function(cls, py_func, py_file):
        try:
            if Path(py_file).resolve().parent != _DIR:
                return None
        except (OSError, TypeError):
            return None
        for klass in _DEFAULT_LOCATORS:
            inner = klass.from_function(py_func, py_file)
            if inner is not None:
                return cls(inner)
        return None


_impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl", None)
_classes = getattr(_impl, "_locator_classes", None)
_DEFAULT_LOCATORS = [k for k in (_classes or []) if k.__name__ != PackageStampLocator.__name__]
if isinstance(_classes, list) and not any(k.__name__ == "PackageStampLocator" for k in _classes):
    _classes.insert(0, PackageStampLocator)
