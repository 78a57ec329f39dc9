#!/usr/bin/env python
"""Write ``src/llamacpy/kernel_manifest.json``: the kernels a command compiles on a cold
cache and the seconds each took, which :mod:`llamacpy.kernel_progress` uses for the
totals and the bar of its first-run progress line.

Run from the repository root with the project's venv (takes a few minutes per command: the
package is copied to a temporary directory so that its kernel cache starts empty)::

    .venv/bin/python scripts/make_kernel_manifest.py [--model smollm2-135m]

Measure on a quiet machine: the seconds only weight the bar, but they should be in
proportion.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "src" / "llamacpy"
OUT = PKG / "kernel_manifest.json"

# command -> the arguments it runs with (after the model)
COMMANDS = {
    "run": ["run", "-c", "512", "-n", "8", "--temp", "0", "-p", "The three primary colors are"],
}

_PROBE = r"""
import base64, json, sys, time
from numba.core import event, serialize, types
from llamacpy.kernel_progress import kernel_id
depth, t0, found, order, disps = [0], [0.0], {}, [], {}
class Probe(event.Listener):
    def on_start(self, ev):
        if depth[0] == 0:
            t0[0] = time.perf_counter()
            k = kernel_id(ev.data["dispatcher"])
            disps[k] = ev.data["dispatcher"]
            if k not in order:
                order.append(k)
        depth[0] += 1
    def on_end(self, ev):
        depth[0] -= 1
        if depth[0] == 0:
            k = kernel_id(ev.data["dispatcher"])
            found[k] = round(found.get(k, 0.0) + time.perf_counter() - t0[0], 1)
def sigs(disp, extra=()):
    out = []
    for s in disp.signatures:
        try:
            out.append(base64.b64encode(serialize.dumps(tuple(s) + extra)).decode())
        except Exception:  # a type that does not pickle: the helper leaves it
            pass
    return out
def report():
    from llamacpy.ops import formats
    sig = {k: sigs(d) for k, d in disps.items() if k != "llamacpy.models.compose:worker"}
    # compiled only when a later start copies the weights with several threads
    sig["llamacpy.ops.formats:_repack_mapped"] = sigs(formats._repack_mapped_1, (types.int64,))
    open(out, "w").write(json.dumps({"seconds": found, "order": order, "signatures": sig}))
event.register("numba:compile", Probe())
import atexit
out = sys.argv[1]
atexit.register(report)
sys.argv = ["llamacpy", *sys.argv[2:]]
from llamacpy.cli import entry
entry()
"""

# kernels a later start compiles that the first one does not, given to the helper
LATER = ("llamacpy.ops.formats:_repack_mapped",)


def helper_list(rec: dict) -> list:
    """The helper's jobs for one command: the kernels compiled after the costliest one
    started (the forward: the command is busy with it meanwhile), then :data:`LATER`."""
    order, seconds, sig = rec["order"], rec["seconds"], rec["signatures"]
    big = max(order, key=lambda k: seconds.get(k, 0.0))
    after = order[order.index(big) + 1 :]
    return [[k, sig[k]] for k in [*after, *LATER] if sig.get(k)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    args = ap.parse_args()
    commands: dict[str, dict[str, float]] = {}
    helper: dict[str, list] = {}
    for name, argv in COMMANDS.items():
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copytree(
                PKG, Path(tmp) / "llamacpy", ignore=shutil.ignore_patterns("__pycache__")
            )
            env = dict(os.environ, PYTHONPATH=tmp)
            env.pop("NUMBA_CACHE_DIR", None)
            env["LLAMACPY_COMPILE_HELPER"] = "0"  # the seconds of one process alone
            out = Path(tmp) / "found.json"
            cmd = [sys.executable, "-c", _PROBE, str(out), argv[0], "-m", args.model, *argv[1:]]
            subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
            rec = json.loads(out.read_text())
            commands[name] = rec["seconds"]
            helper[name] = helper_list(rec)
            print(f"{name}: {len(commands[name])} kernels, {sum(commands[name].values()):.0f} s")
    commands["chat"] = commands["run"]  # the same kernels (chat = run with a template)
    helper["chat"] = helper["run"]
    doc = {
        "about": "kernels each command compiles on a cold cache, with seconds measured by "
        "scripts/make_kernel_manifest.py (weights of the first-run progress bar); helper: "
        "the kernels llamacpy.kernel_warm compiles meanwhile, with their signatures (numba "
        "types, pickled)",
        "commands": commands,
        "helper": helper,
    }
    OUT.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
