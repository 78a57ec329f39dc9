"""An architecture's compiled forward pass, composed from its block's stage names.

``compiled_forward(block)`` writes a small Python module whose ``worker`` calls the stages
of :mod:`.stages` in the block's order inside the layer loop (the module reads as the
model's forward: open it to see what runs), imports it and returns a :class:`Forward`.
numba compiles the worker on first use and caches the machine code on disk like every other
kernel (``kernel_cache``: the cache entry is keyed on this file and on every kernel file it
imports, so an edit of a stage recompiles it). Two architectures with the same block share
one module and one compiled worker.

``Forward(fmask, n_threads, MA, LT, WT, UB, KV, S, STATE, bar)`` runs :func:`launch`: one
parallel region of ``n_threads`` workers (``prange`` over thread ids) that run the whole
network; Python is entered once per ubatch. The launcher is one kernel for every
architecture: it calls the worker through its machine-code address (``_call_worker``), so
that numba does not link the worker's code into it and optimize all of it once more (that
second optimization took ~35 s per architecture on the first start). Argument groups
(numba's parallel loop takes arrays and scalars, not tuples: they are unpacked before it and
repacked inside):

* ``MA``: the model table (:data:`.stages.MODEL_DTYPE`), a row per layer: the model's
  sizes with that layer's geometry; ``LT``: the layer table (:data:`.stages.LAYER_DTYPE`);
* ``WT = (W, WD, NF, RP, FF)``: repacked matrices, their descriptors, float vectors, rope
  rows (global, sliding-window; see :mod:`llamacpy.ops.rope`), rope frequency factors;
* ``UB = (tokens, pos, cells, cells_swa, mask, mask_swa, out_idx, info)``, ``info`` =
  n_tokens, n_kv, attention mode (0 rows, 1 tiled, 2 decode split), n_out, n_kv and mode
  of the sliding-window layers (which have their own cells and mask: ``engine.iswa``);
* ``KV = (k_cache, v_cache, k_swa, v_swa, info)``, caches ``[n_layers of the kind,
  n_head_kv, cells, row_bytes]`` flat, ``info`` = k type, v type, row bytes, cells of the
  global part, cells of the sliding-window part, its row bytes (a model without such
  layers: the same cache twice);
* ``S``: scratch buffers (see :class:`.decoder.Workspace`); ``STATE``: one
  :data:`.stages.STATE_DTYPE` row per worker; ``bar``: the spin barrier.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
from numba import njit, prange, typeof
from numba._dispatcher import compute_fingerprint
from numba.core import types
from numba.extending import intrinsic

from .. import kernel_cache
from . import stages
from .spec import Branch, stage_names

_TEMPLATE = '''\
"""The worker of the compiled forward of a decoder whose block is {names}.

Written by llamacpy.models.compose from the architecture's stage list: do not edit.
"""

from numba import njit

from llamacpy.models.stages import at_layer, context, embed, head
from llamacpy.models.stages import {imports}
from llamacpy.simd import cycles


@njit(cache=True)
def worker(fmask, tid, nth, MA, LT, WT, UB, KV, S, STATE, bar):
    c = context(fmask, tid, nth, MA, WT, UB, KV, S, STATE, bar)
    clk = embed(c, cycles())
    for il in range(c.M.n_layer):
        L = LT[il]
        c = at_layer(c, MA, il)
{calls}
    head(c, clk)
'''


@intrinsic
def _call_worker(typingctx, addr, fmask, tid, nth, MA, LT, WT, UB, KV, S, STATE, bar):
    """Call the compiled worker at machine-code address ``addr`` (numba's calling
    convention, the argument types as given: :meth:`Forward.address` compiles the worker
    for exactly these)."""
    argtys = (fmask, tid, nth, MA, LT, WT, UB, KV, S, STATE, bar)

    def codegen(context, builder, signature, args):
        fnty = context.call_conv.get_function_type(types.none, argtys)
        fn = builder.inttoptr(args[0], fnty.as_pointer())
        context.call_conv.call_function(builder, fn, types.none, argtys, args[1:])
        return context.get_dummy_value()

    return types.none(addr, *argtys), codegen


@njit(cache=True, parallel=True)
def launch(worker, fmask, n_threads, MA, LT, WT, UB, KV, S, STATE, bar):
    """Run the worker at address ``worker`` on ``n_threads`` threads (see the module
    docstring for the argument groups)."""
    W, WD, NF, RP, FF = WT
    tokens, pos, cells, cells_swa, mask, mask_swa, out_idx, ui, order, order_swa = UB
    KC, VC, KCs, VCs, kvi = KV
    X, XN, Q, KN, VN, ATT, G, U, RL, SEL, WTS, EO, ER, A, AP, XP, LOG, TS, prof, IM = S
    a0, a1, a2, a3, a4, a5, a6, a7 = A
    p0, p1, p2, p3, p4, p5, p6, p7 = AP
    s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12 = TS
    for tid in prange(n_threads):
        # (the parfor index is unsigned; mixing it with signed ints would give floats)
        _call_worker(
            worker, fmask, np.int64(tid), n_threads, MA, LT, (W, WD, NF, RP, FF),
            (tokens, pos, cells, cells_swa, mask, mask_swa, out_idx, ui, order, order_swa),
            (KC, VC, KCs, VCs, kvi),
            (X, XN, Q, KN, VN, ATT, G, U, RL, SEL, WTS, EO, ER, (a0, a1, a2, a3, a4, a5, a6, a7),
             (p0, p1, p2, p3, p4, p5, p6, p7), XP, LOG,
             (s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12), prof, IM),
            STATE, bar,
        )  # fmt: skip


class Forward:
    """A block's compiled forward: its worker run by :func:`launch`."""

    def __init__(self, worker) -> None:
        self.worker = worker
        self._addr: dict[tuple, int] = {}  # argument type key -> the worker's address

    def signature(self, args: tuple) -> tuple:
        """The worker's argument types for a call with ``args`` (the launcher's types,
        with the thread id and count as int64)."""
        t = tuple(typeof(a) for a in args)
        return (t[0], types.int64, types.int64, *t[2:])

    def address(self, args: tuple) -> int:
        """The worker's machine code for the types of ``args`` (loaded from the cache or
        compiled on first use). ``numba.typeof`` of the arguments takes ~1.5 ms, so the
        address is kept per fingerprint of their types (numba's own dispatch key, ~3 us)."""
        try:
            key = (args[0].key, compute_fingerprint(args[1:]))
        except (AttributeError, ValueError):  # a type numba has no fingerprint for
            key = self.signature(args)
        addr = self._addr.get(key)
        if addr is None:
            sig = self.signature(args)
            self.worker.compile(sig)
            cres = self.worker.overloads[sig]
            addr = cres.library.get_pointer_to_function(cres.fndesc.llvm_func_name)
            self._addr[key] = addr
        return addr

    def compile(self, sig: tuple) -> None:
        """Load (or compile) the worker and the launcher for the argument types ``sig``
        without running them (``kernel_cache.preload``)."""
        self.worker.compile((sig[0], types.int64, types.int64, *sig[2:]))
        launch.compile((types.intp, *sig))

    def __call__(self, *args) -> None:
        launch(self.address(args), *args)


_FORWARDS: dict[tuple[str, ...], object] = {}


def source(block: tuple) -> str:
    """The module text of the forward of ``block`` (stage names and :class:`.spec.Branch`
    elements: an ``if`` on a layer-table flag)."""
    names = stage_names(block)
    for name in names:
        fn = getattr(stages, name, None)
        if not name.isidentifier() or name.startswith("_") or not callable(fn):
            raise ValueError(f"unknown stage {name!r} (llamacpy.models.stages has none)")
    lines = []
    for el in block:
        if not isinstance(el, Branch):
            lines.append(f"        clk = {el}(c, L, clk)")
            continue
        if el.flag not in stages.LAYER_DTYPE.names:
            raise ValueError(f"unknown layer flag {el.flag!r} (stages.LAYER_DTYPE has none)")
        lines.append(f"        if L.{el.flag} != 0:")
        lines += [f"            clk = {name}(c, L, clk)" for name in el.then]
        lines += ["            pass"] if not el.then else []
        if el.otherwise:
            lines.append("        else:")
            lines += [f"            clk = {name}(c, L, clk)" for name in el.otherwise]
    shown = ", ".join(
        f"[if {el.flag}: {', '.join(el.then)} else: {', '.join(el.otherwise)}]"
        if isinstance(el, Branch)
        else el
        for el in block
    )
    uniq = sorted(set(names))
    return _TEMPLATE.format(names=shown, imports=", ".join(uniq), calls="\n".join(lines))


def _directories() -> tuple[Path, ...]:
    """Where generated modules live, by preference: next to the package's compiled kernels,
    the user's cache, the temporary directory."""
    return (
        Path(__file__).resolve().parent / "__pycache__" / "forwards",
        Path(os.path.expanduser("~")) / ".cache" / "llamacpy" / "forwards",
        Path(tempfile.gettempdir()) / f"llamacpy-forwards-{os.getuid()}",
    )


def _directory() -> Path:
    """The first writable directory of :func:`_directories`."""
    for d in _directories():
        try:
            d.mkdir(parents=True, exist_ok=True)
            probe = d / ".probe"
            probe.write_text("")
            probe.unlink()
            return d
        except OSError:
            continue
    raise OSError("no writable directory for the compiled forward passes")


def compiled_forward(block: tuple[str, ...]) -> Forward:
    """The :class:`Forward` of a block (its module imported once per process)."""
    fwd = _FORWARDS.get(block)
    if fwd is not None:
        return fwd
    text = source(block)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    name = f"forward_{digest}"
    # a file already written (its name is its content's hash) is used as is: no probe, no write
    path = next((p for d in _directories() if (p := d / f"{name}.py").is_file()), None)
    if path is None:
        path = _directory() / f"{name}.py"
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)  # atomic: a concurrent start sees no file or the whole file
    kernel_cache.add_kernel_dir(path.parent)
    modname = f"llamacpy_{name}"
    module = sys.modules.get(modname)
    if module is None:
        spec = importlib.util.spec_from_file_location(modname, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[modname] = module  # numba finds the module's globals by name
        spec.loader.exec_module(module)
    fwd = _FORWARDS[block] = Forward(module.worker)
    return fwd
