"""Imports on first use: packages whose public names are imported when first read (PEP 562),
so that importing one light submodule of a package does not import all of it; and modules
behind a stand-in until one of their attributes is read."""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Callable
from typing import Any


def lazy_names(package: str, names: dict[str, str]) -> tuple[Callable, Callable]:
    """``__getattr__`` and ``__dir__`` for ``package``: ``names`` maps each public name to
    the submodule defining it; a name is imported when first read, then kept."""

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *names})

    return __getattr__, __dir__


class DeferredModule(types.ModuleType):
    """A stand-in for module ``name`` that imports it on the first read of an attribute and
    answers from it. If it stands in ``sys.modules``, it leaves its place to the real module
    then. Compiled kernels may hold one as a global: numba reads the attributes it needs
    when it compiles, and a kernel loaded from the disk cache needs none."""

    def __getattr__(self, attr: str) -> Any:
        name = self.__name__
        if sys.modules.get(name) is self:
            del sys.modules[name]
        return getattr(importlib.import_module(name), attr)


def lazy_module(name: str) -> types.ModuleType:
    """Module ``name`` itself if it is imported already, else a :class:`DeferredModule`.
    A kernel file that uses one keeps the module's ``from ... import`` line under
    ``if TYPE_CHECKING:``: the kernel cache's stamp reads it to know the dependency."""
    return sys.modules.get(name) or DeferredModule(name)
