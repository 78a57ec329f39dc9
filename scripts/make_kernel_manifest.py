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
import json, sys, time
from numba.core import event
from llamacpy.kernel_progress import kernel_id
depth, t0, found = [0], [0.0], {}
class Probe(event.Listener):
    def on_start(self, ev):
        if depth[0] == 0:
            t0[0] = time.perf_counter()
        depth[0] += 1
    def on_end(self, ev):
        depth[0] -= 1
        if depth[0] == 0:
            k = kernel_id(ev.data["dispatcher"])
            found[k] = round(found.get(k, 0.0) + time.perf_counter() - t0[0], 1)
event.register("numba:compile", Probe())
import atexit
out = sys.argv[1]
atexit.register(lambda: open(out, "w").write(json.dumps(found)))
sys.argv = ["llamacpy", *sys.argv[2:]]
from llamacpy.cli import entry
entry()
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    args = ap.parse_args()
    commands: dict[str, dict[str, float]] = {}
    for name, argv in COMMANDS.items():
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copytree(
                PKG, Path(tmp) / "llamacpy", ignore=shutil.ignore_patterns("__pycache__")
            )
            env = dict(os.environ, PYTHONPATH=tmp)
            env.pop("NUMBA_CACHE_DIR", None)
            out = Path(tmp) / "found.json"
            cmd = [sys.executable, "-c", _PROBE, str(out), argv[0], "-m", args.model, *argv[1:]]
            subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
            commands[name] = json.loads(out.read_text())
            print(f"{name}: {len(commands[name])} kernels, {sum(commands[name].values()):.0f} s")
    commands["chat"] = commands["run"]  # the same kernels (chat = run with a template)
    doc = {
        "about": "kernels each command compiles on a cold cache, with seconds measured by "
        "scripts/make_kernel_manifest.py (weights of the first-run progress bar)",
        "commands": commands,
    }
    OUT.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
