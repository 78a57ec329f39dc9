"""A progress line while kernels compile (a new install's first run, or after an upgrade).

Kernels are compiled by LLVM on first use and kept in the disk cache (:mod:`kernel_cache`);
on a new machine the first ``llamacpy run`` spends one to three minutes compiling, which,
without output, looks like a hang. :func:`show_compile_progress` registers a listener for
numba's compile events (sent on cache misses only: a warm start sends none and pays
nothing) that keeps one line on the stream up to date::

    llamacpy: compiling kernels for this CPU (first run only) [####------] 7/18 forward: 52 functions, 0:41

``7/18``: kernels compiled so far, of the ones this command is expected to compile
(:data:`MANIFEST`: the kernels a command compiled on a cold cache, with the seconds each took
when measured; those already in the disk cache are not counted). The bar is weighted by
those seconds, since one kernel (the model's forward) takes most of the time. A kernel not
in the list adds itself to the total when it starts. After the last nested function the
top-level kernel is optimized and turned into machine code as one unit ("optimizing").

On a terminal the line is redrawn in place and cleared when the command's own output
begins (:meth:`CompileProgress.finish` prints a summary line instead); on a pipe or file
one line per kernel is written, so logs show where the time went.
"""

from __future__ import annotations

import json
import pickle
import sys
import threading
import time
from pathlib import Path
from typing import TextIO

from numba.core import event

from .kernel_cache import kernel_stamp

_ROOT = Path(__file__).resolve().parent  # the llamacpy package
_MANIFEST_FILE = _ROOT / "kernel_manifest.json"


def _load_manifest() -> dict[str, dict[str, float]]:
    try:
        data = json.loads(_MANIFEST_FILE.read_text())
    except (OSError, ValueError):
        return {}
    return {
        str(cmd): {str(k): float(s) for k, s in kernels.items()}
        for cmd, kernels in data.get("commands", {}).items()
    }


MANIFEST: dict[str, dict[str, float]] = _load_manifest()  # command -> {kernel: seconds}


def kernel_id(dispatcher) -> str:
    """``module:qualname`` of a dispatcher's Python function (the manifest's key)."""
    f = dispatcher.py_func
    if f.__module__.startswith("llamacpy_forward_"):  # a generated forward (models.compose)
        return f"llamacpy.models.compose:{f.__qualname__}"
    return f"{f.__module__}:{f.__qualname__}"


def short_name(kid: str) -> str:
    """What the line shows: the function name, and its module for the common ones."""
    module, _, qual = kid.partition(":")
    return qual if qual in {"forward", "encode"} else f"{module.rsplit('.', 1)[-1]}.{qual}"


def is_cached(kid: str) -> bool:
    """Whether the in-tree disk cache holds machine code of kernel ``kid`` for its current
    source (any signature). Reads the cache's index files; imports nothing (this runs inside
    a compile event, possibly on a background thread). Unknown names, a cache elsewhere and
    unreadable files count as not cached."""
    module, _, qual = kid.partition(":")
    parts = module.split(".")
    if parts[0] != "llamacpy" or len(parts) < 2:
        return False
    src = _ROOT.joinpath(*parts[1:]).with_suffix(".py")
    base = f"{src.stem}.{qual.replace('<', '').replace('>', '')}-"
    suffix = f".py{sys.version_info[0]}{sys.version_info[1]}{sys.abiflags}.nbi"
    try:
        stamp = kernel_stamp(str(src))
        for index in (src.parent / "__pycache__").glob(f"{base}*{suffix}"):
            if not index.name[len(base) : -len(suffix)].isdigit():
                continue
            with open(index, "rb") as f:
                pickle.load(f)  # numba's version
                if pickle.loads(f.read())[0] == stamp:
                    return True
    except Exception:
        return False
    return False


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 60}:{s % 60:02d}"


class CompileProgress(event.Listener):
    """numba ``numba:compile`` listener that reports on ``stream`` (see the module doc)."""

    def __init__(
        self,
        stream: TextIO | None = None,
        expected: dict[str, float] | None = None,
        *,
        interactive: bool | None = None,
        interval: float = 0.5,
        helper: str | None = None,
    ) -> None:
        self._stream = stream  # None: sys.stderr as it is when a compile starts
        self.expected = dict(expected or {})
        self.helper = helper  # the command whose compile helper starts with the first compile
        self._interactive = interactive  # None: whether the stream is a terminal
        self.interactive = False
        self.interval = interval
        self.lock = threading.RLock()
        self.depth = 0
        self.started: float | None = None  # first compile since the last finish()
        self.planned: dict[str, float] = {}  # kernels expected to compile -> ref. seconds
        self.done: list[str] = []
        self.current: str | None = None
        self.current_t0 = 0.0
        self.functions = 0  # nested functions compiled for the current kernel
        self.drawn = False  # a line is on the terminal
        self._ticker: threading.Thread | None = None
        self._stop = threading.Event()

    @property
    def stream(self) -> TextIO:
        return sys.stderr if self._stream is None else self._stream

    def _begin(self, now: float) -> None:
        """The first compile since the start (or the last finish): plan and set up."""
        self.started = now
        self.planned = {k: s for k, s in self.expected.items() if not is_cached(k)}
        if self.helper is not None:  # a cold cache: the helper compiles some (kernel_warm)
            from .kernel_warm import start

            for kid in start(self.helper):
                self.planned.pop(kid, None)
            self.helper = None
        isatty = getattr(self.stream, "isatty", None)
        self.interactive = (
            bool(isatty and isatty()) if self._interactive is None else self._interactive
        )
        if self.interactive and self._ticker is None:
            self._ticker = threading.Thread(target=self._tick, daemon=True)
            self._ticker.start()

    # --------------------------------------------------------------------- numba events
    def on_start(self, ev: event.Event) -> None:
        with self.lock:
            self.depth += 1
            if self.depth > 1:
                self.functions += 1
                return
            kid = kernel_id(ev.data["dispatcher"])
            now = time.perf_counter()
            if self.started is None:
                self._begin(now)
            if kid not in self.planned:
                self.planned[kid] = 1.0
            self.current, self.current_t0, self.functions = kid, now, 0
            self._draw()

    def on_end(self, ev: event.Event) -> None:
        with self.lock:
            self.depth -= 1
            if self.depth > 0:
                return
            kid, self.current = self.current, None
            if kid is None:
                return
            self.done.append(kid)
            if not self.interactive:
                took = time.perf_counter() - self.current_t0
                self._write(f"{self._prefix()} {short_name(kid)} compiled in {took:.1f} s\n")
            else:
                self._draw()

    # ------------------------------------------------------------------------- output
    def _prefix(self, bar: str = "") -> str:
        head = "llamacpy: compiling kernels for this CPU (first run only)"
        if not self.expected:  # no list for this command: no total either
            return f"{head} {len(self.done)} done"
        total = max(len(self.planned), len(self.done))
        return f"{head} {bar}{len(self.done)}/{total}"

    def _bar(self, width: int = 10) -> str:
        total = sum(self.planned.values()) or 1.0
        done = sum(self.planned.get(k, 1.0) for k in set(self.done))
        if self.current is not None:  # the current kernel counts by its elapsed time
            ref = self.planned.get(self.current, 1.0)
            done += min(ref * 0.95, time.perf_counter() - self.current_t0)
        filled = min(width, int(width * done / total))
        return "[" + "#" * filled + "-" * (width - filled) + "]"

    def _line(self) -> str:
        assert self.started is not None
        elapsed = _clock(time.perf_counter() - self.started)
        head = self._prefix(self._bar() + " ")
        if self.current is None:
            return f"{head}, {elapsed}"
        n = self.functions
        what = "optimizing" if self.depth == 1 and n else f"{n} function{'s' * (n != 1)}"
        return f"{head} {short_name(self.current)}: {what}, {elapsed}"

    def _draw(self) -> None:
        if self.interactive and self.started is not None and self.current is not None:
            self._write("\r\x1b[K" + self._line())
            self.drawn = True
        elif self.drawn:
            self._clear()

    def _clear(self) -> None:
        if self.drawn:
            self._write("\r\x1b[K")
            self.drawn = False

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # a closed or broken stream: the report is lost
            pass

    def _tick(self) -> None:
        while not self._stop.wait(self.interval):
            with self.lock:
                if self.current is not None:
                    self._draw()

    def finish(self) -> None:
        """The command's output begins: clear the line and, if anything compiled, say so
        in one line. Compiles after this point report again."""
        with self.lock:
            self._clear()
            if self.started is not None and self.done:
                took = time.perf_counter() - self.started
                n = len(self.done)
                self._write(
                    f"llamacpy: compiled {n} kernel{'s' * (n != 1)} in {took:.0f} s "
                    "(cached: later runs start at once)\n"
                )
            self.started = None
            self.done = []
            self.planned = {}


_active: CompileProgress | None = None


def show_compile_progress(
    command: str, stream: TextIO | None = None, *, interactive: bool | None = None
) -> CompileProgress:
    """Report kernel compilation on ``stream`` (default: stderr) for the rest of the
    process, with the totals expected for ``command`` (a key of :data:`MANIFEST`; others
    report a count without a total). The first compile (a cold cache; a warm start sends
    no compile event and pays nothing) also starts the compile helper (:mod:`.kernel_warm`),
    whose kernels leave the totals. Idempotent: a second call returns the listener already
    installed."""
    global _active
    if _active is None:
        _active = CompileProgress(
            stream, MANIFEST.get(command, {}), interactive=interactive, helper=command
        )
        event.register("numba:compile", _active)
    return _active


def finish_compile_progress() -> None:
    """Clear the progress line (see :meth:`CompileProgress.finish`); no-op when not shown."""
    if _active is not None:
        _active.finish()
