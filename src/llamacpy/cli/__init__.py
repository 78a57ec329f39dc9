"""The ``llamacpy`` command: argparse front-end; each subcommand lives in its own module.

A subcommand module defines ``register(subparsers)``, which adds its parser and sets
``func(args) -> int`` as the parser default. Errors the user can cause are
:class:`~llamacpy.errors.LlamacpyError`: printed as one line on stderr, exit code 1.
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import os
import sys
from collections.abc import Sequence

from .. import __version__
from .._startup import pause_gc, resume_gc
from ..errors import LlamacpyError

# subcommand modules, in help order
SUBCOMMANDS = [
    "run",
    "chat",
    "serve",
    "bench",
    "perplexity",
    "gguf",
    "models",
    "quantize",
    "tokenize",
    "embed",
    "convert",
]
# commands that end their start-up themselves (``api.model.load_model`` turns the collector
# back on once the model has loaded; quantize once its kernels are imported); the others
# get it back before they run
_START_WITH_MODEL = {"run", "chat", "perplexity", "quantize"}


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one line (plus usage) and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, or with ``only`` one subcommand's (its module alone is imported:
    ``llamacpy run ...`` does not import the server or the converter)."""
    parser = _Parser(
        prog="llamacpy",
        description="llama.cpp's engine and tools in Python.",
    )
    parser.add_argument("--version", action="version", version=f"llamacpy {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in SUBCOMMANDS:
        if only is None or name == only:
            importlib.import_module(f"{__name__}.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv[0] if argv and argv[0] in SUBCOMMANDS else None)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    if args.command not in _START_WITH_MODEL:
        resume_gc()
    try:
        return int(args.func(args) or 0)
    except LlamacpyError as e:
        print(f"llamacpy: error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # output piped into e.g. `head`: not an error worth a traceback
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("llamacpy: interrupted", file=sys.stderr)
        return 130
    except OSError as e:
        # a file we were asked to read or write: name it, no traceback
        where = f"{e.filename}: " if getattr(e, "filename", None) else ""
        print(f"llamacpy: error: {where}{e.strerror or e}", file=sys.stderr)
        return 1


def entry() -> None:
    """The ``llamacpy`` console command: :func:`main`, then exit without tearing the
    interpreter down (freeing every module and the compiled kernels one by one takes about
    0.1 s and has no effect a command could need: output is flushed, exit handlers run).
    Start-up runs without the cyclic garbage collector (see :mod:`llamacpy._startup`)."""
    pause_gc()
    try:
        rc = main()
    except SystemExit as e:  # argparse's --help / usage errors
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int | None):
            print(e.code, file=sys.stderr)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a broken pipe
            pass
    os._exit(rc)
