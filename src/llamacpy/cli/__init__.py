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
from typing import Any

from .. import __version__
from .._startup import pause_gc, resume_gc
from ..errors import LlamacpyError, UsageError

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
    "imatrix",
    "tokenize",
    "embed",
    "convert",
]
# commands that end their start-up themselves (``api.model.load_model`` turns the collector
# back on once the model has loaded; quantize once its kernels are imported); the others
# get it back before they run
_START_WITH_MODEL = {"run", "chat", "perplexity", "quantize", "imatrix"}


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one line (plus usage) and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


# llama.cpp flags that select GPUs or things this CPU engine always does: accepted (with a
# note) so that a llama.cpp command line works as it is
_COMPAT = (
    (("-ngl", "--gpu-layers", "--n-gpu-layers"), "N", "layers on the GPU"),
    (("-sm", "--split-mode"), "MODE", "how to split across GPUs"),
    (("-mg", "--main-gpu"), "I", "the GPU to use"),
    (("-ts", "--tensor-split"), "SPLIT", "split across GPUs"),
    (("-dev", "--device"), "DEV", "devices to use"),
)

# (the names of engine.kv_cache.CACHE_TYPES, without importing the engine for the help)
CACHE_HELP = "KV cache type of %s: f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1"


def positive_int(text: str) -> int:
    """argparse type: an integer of at least 1."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return n


def non_negative_int(text: str) -> int:
    """argparse type: an integer of at least 0."""
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return n


def byte_size(text: str) -> int:
    """argparse type: a size in bytes such as ``500M`` or ``2G`` (see ``gguf.split.parse_size``)."""
    from ..gguf.split import parse_size

    try:
        return parse_size(text)
    except UsageError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_output_args(p: argparse.ArgumentParser, dry_run: str) -> None:
    """``--dry-run`` (``dry_run``: what it shows) and the exclusive ``-q/--quiet`` and
    ``-v/--verbose`` of the commands that write model files."""
    p.add_argument("--dry-run", action="store_true", help=dry_run)
    out = p.add_mutually_exclusive_group()
    out.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    out.add_argument("-v", "--verbose", action="store_true", help="print a line per tensor")


def add_memory_args(p: argparse.ArgumentParser) -> None:
    """The window-cache and determinism flags of the commands that decode."""
    p.add_argument(
        "--swa-full",
        action="store_true",
        help="sliding-window layers keep all n_ctx cells (default: the window "
        "plus a ubatch, as llama.cpp)",
    )
    p.add_argument(
        "--deterministic",
        action="store_true",
        help="batch-invariant results: a sequence's logits do not depend on the other "
        "sequences decoded with it, its cache cells, the ubatch size or the thread count "
        "(slower prompt processing)",
    )


def add_context_args(p: argparse.ArgumentParser) -> None:
    """The context flags of the commands that decode a model: physical batch size, threads,
    KV cache types and :func:`add_memory_args` (see :func:`context_params`)."""
    p.add_argument("-ub", "--ubatch-size", type=int, default=512, help="physical batch size")
    p.add_argument("-t", "--threads", type=int, default=0, help="threads (default: cores)")
    p.add_argument("-tb", "--threads-batch", type=int, default=0,
                   help="threads for prompt processing (default: same as --threads)")  # fmt: skip
    p.add_argument("-ctk", "--cache-type-k", default="f16", help=CACHE_HELP % "K")
    p.add_argument("-ctv", "--cache-type-v", default="f16", help=CACHE_HELP % "V")
    add_memory_args(p)


def context_params(args: argparse.Namespace, **fields: object) -> Any:
    """The ``engine.ContextParams`` of ``-c``, ``-b`` and :func:`add_context_args`'s flags,
    ``fields`` overriding or adding to them."""
    from ..engine import ContextParams

    flags = dict(
        n_ctx=args.ctx_size,
        n_batch=args.batch_size,
        n_ubatch=args.ubatch_size,
        n_threads=args.threads,
        n_threads_batch=args.threads_batch or args.threads,
        type_k=args.cache_type_k,
        type_v=args.cache_type_v,
        swa_full=args.swa_full,
        deterministic=args.deterministic,
    )
    return ContextParams(**(flags | fields))


def add_warmup_arg(p: argparse.ArgumentParser) -> None:
    """``--no-warmup``: skip the warm-up decode (see :func:`llamacpy.api.generation.warm_up`)."""
    p.add_argument("--no-warmup", action="store_true",
                   help="skip the warm-up decode (the first prompt's time then includes "
                   "loading the kernels)")  # fmt: skip


def add_compat_args(p: argparse.ArgumentParser, *, flash_attn: bool = True,
                    conversation: bool = False, warmup: bool = True) -> None:  # fmt: skip
    """llama.cpp's GPU and flash-attention flags, accepted and noted (see :func:`compat_notes`)."""
    g = p.add_argument_group("accepted for llama.cpp compatibility (no effect here)")
    for flags, metavar, what in _COMPAT:
        g.add_argument(*flags, dest=f"compat_{flags[1][2:].replace('-', '_')}", metavar=metavar,
                       default=None, help=f"{what}: llamacpy runs on the CPU")  # fmt: skip
    g.add_argument("-nkvo", "--no-kv-offload", dest="compat_no_kv_offload", action="store_true",
                   default=None, help="the KV cache is in RAM already")  # fmt: skip
    if flash_attn:
        g.add_argument("-fa", "--flash-attn", dest="compat_flash_attn", nargs="?", const="on",
                       default=None, metavar="on|off|auto",
                       help="attention always uses flash-attention numerics")  # fmt: skip
    if conversation:
        g.add_argument("-no-cnv", "--no-conversation", dest="compat_no_conversation",
                       action="store_true", default=None,
                       help="run never converses (use llamacpy chat)")  # fmt: skip
    if warmup:
        g.add_argument("--no-warmup", dest="compat_no_warmup", action="store_true",
                       default=None, help="there is no warm-up run to skip")  # fmt: skip


def compat_notes(args: argparse.Namespace) -> list[str]:
    """One note per llama.cpp compatibility flag given (they change nothing here)."""
    given = [k[len("compat_") :] for k, v in vars(args).items() if k.startswith("compat_")
             and v is not None]  # fmt: skip
    if not given:
        return []
    names = ", ".join("--" + k.replace("_", "-") for k in given)
    why = "CPU engine; flash-attention numerics always" + (
        "; no warm-up run" if "no_warmup" in given else ""
    )
    return [f"llamacpy: note: {names}: no effect here ({why})"]


def _unknown_fused_option(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """A token like ``-nkvo`` that is no option of the command: argparse would read it as
    ``-n kvo`` and complain about the value. Returns the token to name instead."""
    sub = parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and argv and argv[0] in action.choices:
            sub = action.choices[argv[0]]
    known = set(sub._option_string_actions)
    for tok in argv[1:]:
        if tok == "--":
            break
        if (len(tok) > 2 and tok[0] == "-" and tok[1].isalpha() and tok not in known
                and "=" not in tok and any(c.isalpha() for c in tok[2:])):  # fmt: skip
            return tok
    return None


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
    if (bad := _unknown_fused_option(parser, argv)) is not None:
        parser.error(f"unrecognized option '{bad}' (see 'llamacpy {argv[0]} --help')")
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    for note in compat_notes(args):
        print(note, file=sys.stderr)
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
