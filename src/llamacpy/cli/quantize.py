"""``llamacpy quantize [options] IN [OUT] TYPE [NTHREADS]``: llama-quantize.

IN may be a path or a registry model name. Without OUT the output is
``ggml-model-TYPE.gguf`` beside IN (in the current directory for a model name).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ..errors import UsageError
from . import add_output_args


def _resolve(name_or_path: str) -> Path:
    if Path(name_or_path).exists():  # a path: no need to load the model registry
        return Path(name_or_path)
    from ..registry import resolve_model

    return resolve_model(name_or_path)


def _tensor_type(text: str) -> tuple[str, object]:
    """``NAME=TYPE``: NAME is a regular expression (lower-cased, as llama-quantize does)."""
    from ..quantize import parse_ggml_type

    name, sep, type_name = text.partition("=")
    if not sep:
        raise UsageError(f"malformed tensor type {text!r}: expected NAME=TYPE")
    if not name:
        raise UsageError(f"missing tensor name in --tensor-type {text!r}")
    if not type_name:
        raise UsageError(f"missing quantization type in --tensor-type {text!r}")
    return name.lower(), parse_ggml_type(type_name)


def _positionals(args: argparse.Namespace) -> tuple[str, str | None, object, int]:
    """IN [OUT] TYPE [NTHREADS], as llama-quantize reads them: the word after IN is TYPE when
    it names a preset, else OUT."""
    from ..quantize import parse_preset

    pos = list(args.positionals)
    if len(pos) < 2:
        raise UsageError("expected IN [OUT] TYPE [NTHREADS]")
    inp = pos.pop(0)
    out: str | None = None
    try:
        preset = parse_preset(pos[0])
        pos.pop(0)
    except UsageError:
        out = pos.pop(0)
        if not pos:
            raise UsageError("missing TYPE (e.g. Q4_K_M; see `llamacpy quantize --help`)") from None
        preset = parse_preset(pos.pop(0))
    nthread = 0
    if pos:
        try:
            nthread = int(pos.pop(0))
        except ValueError:
            raise UsageError(f"invalid NTHREADS {args.positionals[-1]!r}") from None
    if pos:
        raise UsageError(f"unexpected arguments: {' '.join(pos)}")
    if args.threads is not None:
        if args.threads < 0:
            raise UsageError(f"--threads must be >= 0, not {args.threads}")
        if nthread and nthread != args.threads:
            raise UsageError(f"-t {args.threads} and NTHREADS {nthread} disagree; give one")
        nthread = args.threads
    return inp, out, preset, nthread


def build_params(args: argparse.Namespace) -> tuple[Path, str | None, Any, Any]:
    """(input path, output path, preset, QuantizeParams) from parsed arguments."""
    from ..quantize import KVOverride, QuantizeParams, load_imatrix

    inp, out, preset, nthread = _positionals(args)
    in_path = _resolve(inp)
    if out is None and not args.dry_run:
        where = in_path.parent if Path(inp).exists() else Path(".")
        out = str(where / f"ggml-model-{preset.name}.gguf")
    tensor_types = [_tensor_type(t) for t in args.tensor_type]
    for file in args.tensor_type_file:
        try:
            words = Path(file).read_text().split()
        except OSError as e:
            raise UsageError(f"cannot read --tensor-type-file {file}: {e.strerror or e}") from None
        tensor_types += [_tensor_type(w) for w in words]
    imatrix = None
    if args.imatrix:
        imatrix = load_imatrix(args.imatrix).filtered(args.include_weights, args.exclude_weights)
        if not args.quiet:
            if imatrix.datasets:
                names = ", ".join(repr(d) for d in imatrix.datasets)
                print(f"imatrix datasets: [{names}]", file=sys.stderr)
            print(
                f"loaded {len(imatrix.data)} importance matrix entries from {args.imatrix} "
                f"computed on {imatrix.chunk_count} chunks",
                file=sys.stderr,
            )
        if not imatrix.data:
            imatrix = None
    elif args.include_weights or args.exclude_weights:
        raise UsageError("--include-weights/--exclude-weights need --imatrix")
    params = QuantizeParams(
        ftype=preset.ftype,
        nthread=nthread,
        allow_requantize=args.allow_requantize,
        quantize_output_tensor=not args.leave_output_tensor,
        only_copy=preset.only_copy,
        pure=args.pure,
        output_tensor_type=args.output_tensor_type,
        token_embedding_type=args.token_embedding_type,
        tensor_types=tuple(tensor_types),
        kv_overrides=tuple(KVOverride.parse(o) for o in args.override_kv),
        imatrix=imatrix,
        dry_run=args.dry_run,
    )
    return in_path, out, preset, params


def _run(args: argparse.Namespace) -> int:
    from .. import quants  # noqa: F401  (numba and the kernels: the rest of start-up)
    from .._startup import resume_gc
    from ..quantize import quantize_model

    resume_gc()

    in_path, out, preset, params = build_params(args)
    nthread = params.nthread
    what = "calculating quantization size for" if args.dry_run else "quantizing"
    to = "" if args.dry_run else f" to '{out}'"
    threads = f" using {nthread} threads" if nthread > 0 else ""
    print(f"{what} '{in_path}'{to} as {preset.name}{threads}", file=sys.stderr)

    def log(line: str) -> None:
        print(line, file=sys.stderr)

    detailed = args.verbose or args.dry_run
    show_bar = not args.quiet and not detailed and sys.stderr.isatty()
    report = quantize_model(in_path, out, params, progress=show_bar, log=log if detailed else None)
    if not detailed and not args.quiet:
        if report.plan.fallbacks:
            n = len(report.plan.fallbacks)
            print(f"{n} tensor(s) use a fallback type (row length not a multiple of the block "
                  "size); --verbose lists them", file=sys.stderr)  # fmt: skip
        if report.plan.warnings:
            n = len(report.plan.warnings)
            print(f"{n} importance-matrix warning(s) (e.g. {report.plan.warnings[0]}); "
                  "--verbose lists them", file=sys.stderr)  # fmt: skip
    for line in report.summary_lines():
        print(line)
    if not args.dry_run:
        print(f"wrote {out}")
    return 0


def _ggml_type(text: str) -> object:
    from ..quantize import parse_ggml_type

    try:
        return parse_ggml_type(text)
    except UsageError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _epilog() -> str:
    from ..quantize import PRESETS

    lines = ["TYPE (a name, or the number of a file type):"]
    for p in PRESETS:
        num = f"{int(p.ftype):2d}  or  " if p.name != "COPY" else " " * 10
        lines.append(f"  {num}{p.name:<9s}: {p.description.strip()}")
    return "\n".join(lines)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "quantize",
        help="quantize a model to a preset such as Q4_K_M (llama-quantize)",
        description=(
            "Quantize a GGUF model as llama-quantize does (same per-tensor types, same bytes). "
            "IN may be a path or a model name; without OUT the output is ggml-model-TYPE.gguf "
            "beside IN. NTHREADS defaults to every CPU."
        ),
        epilog=_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("positionals", nargs="+", metavar="IN [OUT] TYPE [NTHREADS]")
    p.add_argument(
        "--allow-requantize",
        action="store_true",
        help="allow requantizing tensors that are already quantized (loses quality)",
    )
    p.add_argument(
        "--leave-output-tensor",
        action="store_true",
        help="leave output.weight un(re)quantized",
    )
    p.add_argument(
        "--pure",
        action="store_true",
        help="no k-quant mixtures: quantize every tensor to the same type",
    )
    p.add_argument("-t", "--threads", type=int, default=None,
                   help="threads (as the positional NTHREADS; default: cores)")  # fmt: skip
    p.add_argument("--imatrix", metavar="FILE", help="importance matrix (GGUF or legacy .dat)")
    p.add_argument(
        "--include-weights",
        action="append",
        default=[],
        metavar="NAME",
        help="use the imatrix only for tensors whose name contains NAME (repeatable)",
    )
    p.add_argument(
        "--exclude-weights",
        action="append",
        default=[],
        metavar="NAME",
        help="do not use the imatrix for tensors whose name contains NAME (repeatable)",
    )
    p.add_argument(
        "--output-tensor-type",
        type=_ggml_type,
        metavar="TYPE",
        help="ggml type for output.weight (e.g. q8_0)",
    )
    p.add_argument(
        "--token-embedding-type",
        type=_ggml_type,
        metavar="TYPE",
        help="ggml type for the token embeddings",
    )
    p.add_argument(
        "--tensor-type",
        action="append",
        default=[],
        metavar="REGEX=TYPE",
        help="quantize tensors whose name matches REGEX to TYPE (repeatable; first match wins)",
    )
    p.add_argument(
        "--tensor-type-file",
        action="append",
        default=[],
        metavar="FILE",
        help="a file of REGEX=TYPE entries separated by spaces or newlines",
    )
    p.add_argument(
        "--override-kv",
        action="append",
        default=[],
        metavar="KEY=TYPE:VALUE",
        help="set a metadata key in the output; TYPE is int, float, bool or str (repeatable)",
    )
    add_output_args(p, "show the per-tensor types and the final size without writing anything")
    p.set_defaults(func=_run)
