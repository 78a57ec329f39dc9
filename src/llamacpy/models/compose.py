"""An architecture's compiled forward pass, composed from its block's stage names.

``compiled_forward(block)`` writes a small Python module that calls the stages of
:mod:`.stages` in the block's order inside the layer loop (the module reads as the model's
forward: open it to see what runs), imports it and returns its ``forward`` kernel. numba
compiles it on first use and caches the machine code on disk like every other kernel
(``kernel_cache``: the cache entry is keyed on this file and on every kernel file it
imports, so an edit of a stage recompiles it). Two architectures with the same block share
one module and one compiled forward.

``forward(fmask, n_threads, MA, LT, WT, UB, KV, S, STATE, bar)`` opens one parallel region
of ``n_threads`` workers (``prange`` over thread ids) that run the whole network; Python is
entered once per ubatch. Argument groups (numba's parallel loop takes arrays and scalars,
not tuples: they are unpacked before it and repacked inside):

* ``MA``: one row of :data:`.stages.MODEL_DTYPE`; ``LT``: the layer table
  (:data:`.stages.LAYER_DTYPE`);
* ``WT = (W, WD, NF, RP, FF)``: repacked matrices, their descriptors, float vectors, rope
  rows (global, sliding-window; see :mod:`llamacpy.ops.rope`), rope frequency factors;
* ``UB = (tokens, pos, cells, mask, mask_swa, out_idx, info)``, ``info`` = n_tokens, n_kv,
  attention mode (0 rows, 1 tiled, 2 decode split), n_out;
* ``KV = (k_cache, v_cache, info)``, caches ``[n_layer, n_head_kv, n_ctx, row_bytes]``
  flat, ``info`` = k type, v type, row bytes, n_ctx;
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

from .. import kernel_cache
from . import stages

_TEMPLATE = '''\
"""The compiled forward of a decoder whose block is {names}.

Written by llamacpy.models.compose from the architecture's stage list: do not edit.
"""

import numpy as np
from numba import njit, prange

from llamacpy.models.stages import context, embed, head
from llamacpy.models.stages import {imports}
from llamacpy.simd import cycles


@njit(cache=True, parallel=True)
def forward(fmask, n_threads, MA, LT, WT, UB, KV, S, STATE, bar):
    W, WD, NF, RP, FF = WT
    tokens, pos, cells, mask, mask_swa, out_idx, ui = UB
    KC, VC, kvi = KV
    X, XN, Q, KN, VN, ATT, G, U, A, AP, XP, LOG, TS, prof = S
    a0, a1, a2, a3, a4, a5, a6, a7 = A
    p0, p1, p2, p3, p4, p5, p6, p7 = AP
    s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12 = TS
    for tid in prange(n_threads):
        # (the parfor index is unsigned; mixing it with signed ints would give floats)
        worker(
            fmask, np.int64(tid), n_threads, MA, LT, (W, WD, NF, RP, FF),
            (tokens, pos, cells, mask, mask_swa, out_idx, ui), (KC, VC, kvi),
            (X, XN, Q, KN, VN, ATT, G, U, (a0, a1, a2, a3, a4, a5, a6, a7),
             (p0, p1, p2, p3, p4, p5, p6, p7), XP, LOG,
             (s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12), prof),
            STATE, bar,
        )


@njit(cache=True)
def worker(fmask, tid, nth, MA, LT, WT, UB, KV, S, STATE, bar):
    c = context(fmask, tid, nth, MA, WT, UB, KV, S, STATE, bar)
    clk = embed(c, cycles())
    for il in range(c.M.n_layer):
        L = LT[il]
{calls}
    head(c, clk)
'''

_FORWARDS: dict[tuple[str, ...], object] = {}


def source(block: tuple[str, ...]) -> str:
    """The module text of the forward of ``block``."""
    for name in block:
        fn = getattr(stages, name, None)
        if not name.isidentifier() or name.startswith("_") or not callable(fn):
            raise ValueError(f"unknown stage {name!r} (llamacpy.models.stages has none)")
    uniq = sorted(set(block))
    calls = "\n".join(f"        clk = {name}(c, L, clk)" for name in block)
    return _TEMPLATE.format(names=", ".join(block), imports=", ".join(uniq), calls=calls)


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


def compiled_forward(block: tuple[str, ...]):
    """The ``forward`` kernel of a block (imported once per process)."""
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
    fwd = _FORWARDS[block] = module.forward
    return fwd
