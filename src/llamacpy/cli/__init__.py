"""The ``llamacpy`` command: argparse front-end; each subcommand lives in its own module.

A subcommand module defines ``register(subparsers)``, which adds its parser and sets
``func(args) -> int`` as the parser default. Errors the user can cause are
:class:`~llamacpy.errors.LlamacpyError`: printed as one line on stderr, exit code 1.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from .. import __version__
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


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one line (plus usage) and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The full parser, or with ``only`` the parser of that one subcommand (what running it
    needs: the other subcommand modules are not imported)."""
    parser = _Parser(
        prog="llamacpy",
        description="llama.cpp's engine and tools in Python.",
    )
    parser.add_argument("--version", action="version", version=f"llamacpy {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in [only] if only in SUBCOMMANDS else SUBCOMMANDS:
        importlib.import_module(f"{__name__}.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv[0] if argv else None)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
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
