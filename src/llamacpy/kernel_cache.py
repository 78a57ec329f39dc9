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
import importlib
import os
import pickle
import re
import struct
import sys
import threading
from functools import cache
from pathlib import Path

import llvmlite.binding as ll
import numpy as np
from numba.core import caching, config, environment, errors, types
from numba.core import codegen as codegen_mod
from numba.core.runtime import nrtdynmod, rtsys
from numba.core.typing.typeof import typeof_impl
from numba.np import numpy_support

_ROOT = Path(__file__).resolve().parent  # the llamacpy package
KERNEL_PACKAGES = (
    "simd",
    "quants",
    "ops",
    "tokenizer",
    "sampling",
    "grammar",
    "models",
    "engine",
    "quantize",
)
_KERNEL_DIRS = [_ROOT / p for p in KERNEL_PACKAGES]  # (+ generated kernels' directories)
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
def _file_hash(name: str, mtime_ns: int, size: int) -> bytes:
    """One file's content hash (read once per version of the file in a process)."""
    return hashlib.sha256(Path(name).read_bytes()).digest()


@cache
def _hash(files: tuple[tuple[str, int, int], ...]) -> bytes:
    h = hashlib.sha256()
    for name, mtime_ns, size in files:
        h.update(name.encode())
        h.update(_file_hash(name, mtime_ns, size))
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


def add_kernel_dir(path: Path) -> None:
    """Treat the modules of ``path`` (generated kernels, see ``models.compose``) as kernel
    files: cached with the stamp of everything they import."""
    path = Path(path).resolve()
    if path not in _KERNEL_DIRS:
        _KERNEL_DIRS.append(path)


def _is_kernel_file(py_file: str) -> bool:
    path = _resolved(py_file)
    return path is not None and any(path.parent == d for d in _KERNEL_DIRS)


_WRITABLE: set[str] = set()  # cache directories already checked in this process
_MODULE_STAMPS: dict[tuple[str, int], tuple[dict, bytes]] = {}  # (file, module) -> stamp


class _StampMixin:
    """A numba cache locator for the kernel files only, keyed on :func:`kernel_stamp`."""

    @classmethod
    def from_function(cls, py_func, py_file):
        if not _is_kernel_file(py_file):
            return None
        loc = super().from_function(py_func, py_file)
        if loc is not None:
            loc._module_globals = getattr(py_func, "__globals__", None)
        return loc

    def get_source_stamp(self):
        """The kernel file's stamp, computed once per module object: numba asks for every
        kernel as it is defined (a module defines up to ~50), and a module's files do not
        change while it runs its definitions (a reloaded module is a new object)."""
        g = getattr(self, "_module_globals", None)
        if g is None:
            return kernel_stamp(self._py_file)
        key = (self._py_file, id(g))
        hit = _MODULE_STAMPS.get(key)
        if hit is None or hit[0] is not g:
            hit = _MODULE_STAMPS[key] = (g, kernel_stamp(self._py_file))
        return hit[1]

    def ensure_cache_path(self):
        """numba checks the directory (mkdir + a temporary file) for every kernel; once per
        directory is enough."""
        path = self.get_cache_path()
        if path not in _WRITABLE:
            super().ensure_cache_path()
            _WRITABLE.add(path)


class _InTreeKernelLocator(_StampMixin, caching.InTreeCacheLocator):
    pass


class _UserWideKernelLocator(_StampMixin, caching.UserWideCacheLocator):
    pass


_KERNEL_LOCATORS: tuple[type, ...] = ()
_numba_load_overload = caching.Cache.load_overload
_LOADING = threading.local()  # set while one of our kernels is loaded from the cache


def _load_overload(self, sig, target_context):
    """numba refreshes its whole lowering library (hundreds of modules: ~0.3 s and ~30 MB)
    before every cache lookup; loading cached machine code only needs its runtime. Kernels
    of this package skip the refresh (a cache miss compiles, and compiling refreshes)."""
    if not isinstance(self._impl.locator, _KERNEL_LOCATORS):
        return _numba_load_overload(self, sig, target_context)
    rtsys.initialize(target_context)
    _LOADING.on = True
    try:
        with self._guard_against_spurious_io_errors():
            return self._load_overload(sig, target_context)
    except Exception:
        # an entry written by another version (its pickled types name modules that moved
        # or changed) is a cache miss: compile, and the entry is written anew
        return None
    finally:
        _LOADING.on = False


def elf_defined_symbols(obj: bytes) -> set[str] | None:
    """Names of the functions and data an ELF64 little-endian object file defines (None
    when ``obj`` is not one): its symbol table, read directly."""
    if len(obj) < 64 or obj[:4] != b"\x7fELF" or obj[4] != 2 or obj[5] != 1:
        return None
    (shoff,) = struct.unpack_from("<Q", obj, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", obj, 0x3A)
    if shentsize != 64 or shoff + shnum * 64 > len(obj):
        return None
    section = struct.Struct("<IIQQQQIIQQ")
    symbol = struct.Struct("<IBBHQQ")
    names: set[str] = set()
    for i in range(shnum):
        _, sh_type, _, _, off, size, link, _, _, entsize = section.unpack_from(obj, shoff + i * 64)
        if sh_type != 2:  # SHT_SYMTAB
            continue
        if entsize != symbol.size or off + size > len(obj) or link >= shnum:
            return None
        stroff = section.unpack_from(obj, shoff + link * 64)[4]
        for k in range(off, off + size - symbol.size + 1, symbol.size):
            st_name, st_info, _, st_shndx, _, _ = symbol.unpack_from(obj, k)
            # defined (section index not UNDEF), NOTYPE/OBJECT/FUNC, named
            if st_shndx == 0 or (st_info & 0xF) > 2 or not st_name:
                continue
            end = obj.find(b"\0", stroff + st_name)
            if end < 0:
                return None
            names.add(obj[stroff + st_name : end].decode("utf-8", "surrogateescape"))
    return names


def _lazy_unserialize(cls, codegen, state):
    """numba's loading of a cached library, less the parsing of its LLVM bitcode: numba
    keeps the bitcode only to link the library into later compilations, and parses it (and
    walks every function of it for the symbol names) on each load: ~60% of a cached kernel's
    load time. Here the names come from the object code's symbol table and the bitcode is
    parsed the first time a compilation links against the library."""
    name, kind, data = state
    names = None
    if (
        kind == "object"
        and getattr(_LOADING, "on", False)
        and isinstance(getattr(codegen._engine, "_defined_symbols", None), set)
    ):
        names = elf_defined_symbols(data[0])
    if names is None:
        return _numba_unserialize(cls, codegen, state)
    object_code, shared_bitcode = data
    self = codegen.create_library(name)
    self.enable_object_caching()
    self._set_compiled_object(object_code)
    self._llamacpy_bitcode = shared_bitcode
    self._finalize_final_module()
    codegen._engine._defined_symbols |= names
    return self


def _module_for_linking(self):
    bitcode = self.__dict__.pop("_llamacpy_bitcode", None)
    if bitcode is not None:
        self._shared_module = ll.parse_bitcode(bitcode)
    return _numba_module_for_linking(self)


_numba_unserialize = codegen_mod.CPUCodeLibrary._unserialize.__func__
_numba_module_for_linking = codegen_mod.CPUCodeLibrary._get_module_for_linking


def _nrt_cache_file(ctx) -> Path:
    import llvmlite
    import numba

    key = repr((numba.__version__, llvmlite.__version__, ctx.codegen().magic_tuple()))
    name = f"nrt-{hashlib.sha256(key.encode()).hexdigest()[:16]}.bin"
    base = Path(config.CACHE_DIR) if config.CACHE_DIR else _ROOT / "__pycache__"
    return base / name


def _cached_nrt_functions(ctx):
    """numba compiles its runtime's few LLVM functions afresh in every process (~50 ms of
    each start); their machine code is kept on disk like a kernel's."""
    path = _nrt_cache_file(ctx)
    try:
        state = pickle.loads(path.read_bytes())
        _LOADING.on = True
        try:
            return ctx.codegen().unserialize_library(state)
        finally:
            _LOADING.on = False
    except Exception:  # absent, unreadable or stale: compile (and try to keep it)
        pass
    ir_mod, library = nrtdynmod.create_nrt_module(ctx)
    library.enable_object_caching()
    library.add_ir_module(ir_mod)
    library.finalize()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(pickle.dumps(library.serialize_using_object_code()))
        os.replace(tmp, path)
    except Exception:  # a read-only install: compile each time, as numba does
        pass
    return library


_numba_rebuild_env = environment._rebuild_env
_numba_env_from_fndesc = environment.Environment.from_fndesc.__func__
_ENV_STUBS: dict[str, tuple[str, dict]] = {}  # env name -> (module, stand-in globals)


def _rebuild_env(modname, consts, env_name):
    """numba's rebuild of a cached function's environment, without importing a numba or
    llamacpy module not imported yet. A kernel's pickled environments name the modules whose
    helpers it inlined (numba's array allocation, sorting, lists; a format's block code that
    a model may not use); numba imports each to take its globals: ~27 ms of numba module
    imports for ``llamacpy run``'s kernels. Compiled nopython code reads
    only an environment's constants, never its globals (those serve object mode and the
    next compilation), so while our kernels load such an environment gets a stand-in
    globals dict, filled from the module if a compilation later asks for it."""
    if (
        getattr(_LOADING, "on", False)
        and modname.startswith(("numba.", "llamacpy."))
        and (modname not in sys.modules)
    ):
        env = environment.lookup_environment(env_name)
        if env is None:
            stand_in = {"__name__": modname}
            env = environment.Environment(stand_in)
            env.consts[:] = consts
            env.env_name = env_name
            environment.Environment._memo[env_name] = env
            _ENV_STUBS[env_name] = (modname, stand_in)
        return env
    return _numba_rebuild_env(modname, consts, env_name)


# pickled by reference (``Environment.__reduce__`` names the module's ``_rebuild_env``): the
# cache entries this process writes, a user's own kernels' included, must name numba's
# function, not this module, so that they load where llamacpy is not installed
_rebuild_env.__module__ = environment.__name__
_rebuild_env.__qualname__ = "_rebuild_env"


def _env_from_fndesc(cls, fndesc):
    """numba's environment for a function being compiled; a stand-in made while loading
    gets its module's real globals first."""
    stub = _ENV_STUBS.pop(fndesc.env_name, None)
    if stub is not None:
        stub[1].update(importlib.import_module(stub[0]).__dict__)
    return _numba_env_from_fndesc(cls, fndesc)


_numba_typeof_ndarray = typeof_impl.dispatch(np.ndarray)


def _typeof_ndarray(val, c):
    """numba's type of an array argument. numba first asks whether it is a masked array,
    which imports ``numpy.ma`` (~10 ms of a process's first kernel call); a plain
    ``ndarray`` is not one, and is typed here as numba types it."""
    if type(val) is not np.ndarray:
        return _numba_typeof_ndarray(val, c)
    try:
        dtype = numpy_support.from_dtype(val.dtype)
    except errors.NumbaNotImplementedError:
        raise errors.NumbaValueError(f"Unsupported array dtype: {val.dtype}") from None
    layout = numpy_support.map_layout(val)
    return types.Array(dtype, val.ndim, layout, readonly=not val.flags.writeable)


_numba_load_index = caching.IndexDataCacheFile._load_index


def _load_index(self):
    """numba's index of a function's cached entries; one it cannot read back (written by
    another version: its pickled types name modules that moved or changed) is empty, so the
    function compiles and the index is written anew, instead of failing the call."""
    try:
        return _numba_load_index(self)
    except Exception:
        return {}


def install() -> None:
    """Put the kernel locators first in numba's list (idempotent)."""
    global _KERNEL_LOCATORS
    _KERNEL_LOCATORS = (_InTreeKernelLocator, _UserWideKernelLocator)
    caching.Cache.load_overload = _load_overload
    caching.IndexDataCacheFile._load_index = _load_index
    environment._rebuild_env = _rebuild_env  # what unpickling an environment calls
    if typeof_impl.dispatch(np.ndarray) is _numba_typeof_ndarray:
        typeof_impl.register(np.ndarray)(_typeof_ndarray)
    environment.Environment.from_fndesc = classmethod(_env_from_fndesc)
    lib = codegen_mod.CPUCodeLibrary
    if lib._get_module_for_linking is _numba_module_for_linking:
        lib._unserialize = classmethod(_lazy_unserialize)
        lib._get_module_for_linking = _module_for_linking
    if getattr(nrtdynmod, "create_nrt_module", None) and not rtsys._init:
        nrtdynmod.compile_nrt_functions = _cached_nrt_functions
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
