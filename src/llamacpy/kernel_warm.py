"""A second process that compiles, on a cold kernel cache, the kernels a command needs after
its model's forward, while the command compiles the forward.

numba compiles one kernel at a time in a process (its compiler lock), and a command's first
run spends most of its time on one kernel: the model's forward (about 60 of SmolLM2's 90
seconds here). The kernels it needs after that one (the parallel launcher, the tokenizer's
and the samplers', the multi-threaded weight copy of later starts) then compile one after
the other, another 30 seconds. On a machine with two cores or more, :func:`start` runs
``python -m llamacpy.kernel_warm`` for the command: it compiles those kernels, with the
signatures the manifest records for them (``kernel_manifest.json``'s ``helper`` lists,
written by ``scripts/make_kernel_manifest.py``), into the same disk cache, so that the
command finds their machine code there when it reaches them.

Nothing depends on the helper. A kernel it has not finished is compiled by the command as
before (both then write the same cache entry; numba replaces cache files atomically), a
signature it cannot read (another numba) or a kernel that fails is skipped, and it stops
between kernels once the command has exited. ``LLAMACPY_COMPILE_HELPER=0`` turns it off.
"""

from __future__ import annotations

import base64
import importlib
import json
import os
import pickle
import subprocess
import sys

from . import kernel_progress
from .kernel_progress import _MANIFEST_FILE, _ROOT

ENV = "LLAMACPY_COMPILE_HELPER"


def helper_jobs(command: str) -> list[tuple[str, list[str]]]:
    """``[(kernel id, [signature pickles, base64])]`` the manifest lists for ``command``'s
    helper, in the order it compiles them ([] if none or unreadable)."""
    try:
        data = json.loads(_MANIFEST_FILE.read_text())
        jobs = data.get("helper", {}).get(command, [])
        return [(str(kid), [str(s) for s in sigs]) for kid, sigs in jobs]
    except (OSError, ValueError, TypeError, AttributeError):
        return []


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def start(command: str) -> list[str]:
    """Start the helper for ``command`` if it has work: kernels of its list not in the disk
    cache, on a machine with at least two cores. Returns the ids it will compile ([] when
    none was started)."""
    if os.environ.get(ENV, "1") == "0" or _cpus() < 2:
        return []
    todo = [kid for kid, _ in helper_jobs(command) if not kernel_progress.is_cached(kid)]
    if not todo:
        return []
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(_ROOT.parent), env.get("PYTHONPATH", "")) if p
    )
    try:
        subprocess.Popen(
            [sys.executable, "-m", "llamacpy.kernel_warm", str(os.getpid()), command],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
    except OSError:
        return []
    return todo


def dispatcher(kid: str):
    """The numba dispatcher named ``module:qualname``."""
    module, _, qual = kid.partition(":")
    obj = importlib.import_module(module)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


def compile_jobs(jobs: list[tuple[str, list[str]]], parent: int | None = None) -> list[str]:
    """Compile each kernel of ``jobs`` for its recorded signatures (skipping those cached
    and those that cannot be read or compiled); stop once process ``parent`` is gone.
    Returns the ids compiled."""
    done = []
    for kid, sigs in jobs:
        if parent is not None and os.getppid() != parent:
            break
        if kernel_progress.is_cached(kid):
            continue
        try:
            disp = dispatcher(kid)
            for s in sigs:
                disp.compile(pickle.loads(base64.b64decode(s)))
        except Exception:  # another numba, a renamed kernel: the command compiles it
            continue
        done.append(kid)
    return done


def main(argv: list[str]) -> int:
    parent, command = int(argv[0]), argv[1]
    try:
        os.nice(5)  # on a busy machine the command's own compile goes first
    except OSError:
        pass
    compile_jobs(helper_jobs(command), parent)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
