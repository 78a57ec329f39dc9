"""``llamacpy imatrix``: llama-imatrix's importance matrix, its options and its output.

The text of ``-f`` (one trailing newline removed) is cut into chunks of ``-c`` tokens and
evaluated as llama-imatrix evaluates it (``eval/imatrix.py``); the squares of every matmul
input are summed per weight matrix and written, atomically, as a GGUF imatrix
(``-o``, default ``imatrix.gguf``; ``--output-format dat`` for the legacy format) that
``llamacpy quantize --imatrix`` and llama-quantize read. The running perplexity goes to
stdout (``[1]x,[2]y,...``, then ``Final estimate``), setup and progress lines to stderr.

``--in-file`` (repeatable, or comma-separated) adds earlier files' statistics first; with
no ``-f`` those files are only combined into ``-o`` (no model is loaded).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..errors import UsageError
from . import add_compat_args, add_context_args, context_params


def _in_files(values: list[str]) -> list[str]:
    files = [f for v in values for f in v.split(",") if f]
    for f in files:
        if not os.path.isfile(f):
            raise UsageError(f"failed to open file '{f}'")
    return files


def _load(files: list[str], chunk_size: int, say: bool = False):
    """The statistics of imatrix files added together (their datasets listed in order)."""
    from ..eval.imatrix import ImatrixStats
    from ..quantize.imatrix import load_imatrix_raw

    stats = ImatrixStats()
    for f in files:
        if say:
            print(f"imatrix: loading imatrix from '{f}'", file=sys.stderr)
        raw = load_imatrix_raw(f, chunk_size)
        for name, (sums, counts) in raw.entries.items():
            stats.add(name, sums, counts)
        stats.datasets.extend(raw.datasets)
    return stats


def _imatrix(args: argparse.Namespace) -> int:
    if args.ctx_size <= 0:
        raise UsageError("imatrix needs -c/--ctx-size > 0")
    if args.output_frequency <= 0:
        raise UsageError("--output-frequency must be positive")
    out_dir = Path(args.output_file).resolve().parent
    if not (out_dir.is_dir() and os.access(out_dir, os.W_OK)):
        raise UsageError(f"cannot write {args.output_file}: {out_dir} is not a writable directory")
    if args.show_statistics:
        return _show_statistics(args)
    text = None
    if args.file:
        try:
            text = Path(args.file).read_bytes()
        except OSError as e:
            raise UsageError(f"could not open file '{args.file}' for reading: {e.strerror}") from e
        text = text[:-1] if text.endswith(b"\n") else text
    stats = _load(_in_files(args.in_file), args.ctx_size, say=True)
    if text is None:
        if not args.in_file:
            raise UsageError("no prompt (-f) and no precomputed matrices (--in-file) to combine")
        print(f"imatrix: saving imatrix to '{args.output_file}'", file=sys.stderr)
        _save(args, stats, args.output_file)
        return 0
    if not args.model:
        raise UsageError("imatrix needs -m/--model to compute from -f")
    return _compute(args, text, stats)


def _show_statistics(args: argparse.Namespace) -> int:
    from ..eval.imatrix import imatrix_statistics

    files = _in_files(args.in_file)
    if len(files) != 1:
        raise UsageError(
            "a single imatrix file (--in-file) is required to compute tensor statistics"
        )
    stats = _load(files, args.ctx_size)
    print(f"\nComputing statistics for {files[0]} ({len(stats.sums)} tensors)")
    print("\n".join(imatrix_statistics(stats)))
    print()
    # (llama-imatrix fails when no entry has data to compute statistics of)
    return 0 if any(c.any() for c in stats.counts.values()) else 1


def _compute(args: argparse.Namespace, text: bytes, stats) -> int:
    from ..gguf import GGUFModelFile
    from ..registry import resolve_model
    from .perplexity import _first_pass
    from .run import output_begins, reserve_weight_memory, show_compile_progress

    path = resolve_model(args.model)
    with GGUFModelFile(path) as mf:  # the matrices' names and shapes (header only)
        shapes = {t.name: tuple(int(d) for d in t.shape) for t in mf.tensors}
    reserve_weight_memory(args.model)
    show_compile_progress("perplexity")
    from ..api.model import load_model
    from ..eval.imatrix import compute_imatrix
    from ..eval.perplexity import n_seq_for

    n_ctx = args.ctx_size
    n_seq = n_seq_for(n_ctx, args.batch_size)
    n_batch = min(args.batch_size, n_seq * n_ctx)
    params = context_params(args, n_ctx=n_seq * n_ctx, n_batch=n_batch, n_seq_max=n_seq,
                            use_mmap=args.mmap)  # fmt: skip
    model = load_model(path, params)
    ctx, out, err = model.ctx, sys.stdout, sys.stderr
    stats.datasets.append(args.file)
    first_pass = _first_pass("compute_imatrix: computing", n_ctx, ctx.n_batch, output_begins)
    saved = {"last": 0}

    def chunk(i: int, ppl: float | None) -> None:
        if ppl is not None:
            out.write(f"[{i}]{ppl:.4f},")
            out.flush()

    def save(chunks: int) -> None:
        if chunks // args.output_frequency > saved["last"] // args.output_frequency:
            _save(args, stats, args.output_file, chunks)
        if args.save_frequency > 0 and (
            chunks // args.save_frequency > saved["last"] // args.save_frequency
        ):
            _save(args, stats, f"{args.output_file}.at_{chunks}", chunks)
        saved["last"] = chunks

    res = compute_imatrix(
        ctx, model.tokenizer, text, shapes, stats, n_ctx=n_ctx, n_batch=ctx.n_batch,
        n_chunks=args.chunks, skip_chunks=args.from_chunk, parse_special=args.parse_special,
        compute_ppl=args.ppl, process_output=args.process_output, on_chunk=chunk,
        on_first_pass=first_pass, on_save=save,
    )  # fmt: skip
    output_begins()
    out.write("\n")
    if res.ppl is not None:
        print(f"Final estimate: PPL = {res.ppl:.4f} +/- {res.ppl_err:.5f}", file=out)
    _save(args, stats, args.output_file)
    print(f"imatrix: stored collected data after {stats.chunk_count(n_ctx)} chunks in "
          f"{args.output_file}", file=err)  # fmt: skip
    return 0


def _save(args: argparse.Namespace, stats, path: str, chunks: int | None = None) -> None:
    from ..quantize.imatrix import save_imatrix, save_imatrix_legacy

    entries = {k: (v, stats.counts[k]) for k, v in stats.sums.items()}
    n = stats.chunk_count(args.ctx_size) if chunks is None else chunks
    if args.output_format == "dat":
        dataset = args.file or (stats.datasets[-1] if stats.datasets else "")
        save_imatrix_legacy(path, entries, dataset, n, args.ctx_size)
    else:
        save_imatrix(path, entries, stats.datasets, n, args.ctx_size)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "imatrix",
        help="compute an importance matrix for quantization (like llama-imatrix)",
        description="Importance matrix: squares of every matmul input, summed per matrix.",
    )
    p.add_argument("-m", "--model", help="model path or registry name")
    p.add_argument("-f", "--file", help="text to compute the statistics over")
    p.add_argument("-o", "--output-file", default="imatrix.gguf",
                   help="output file (default: imatrix.gguf)")  # fmt: skip
    p.add_argument("-c", "--ctx-size", type=int, default=512, help="chunk size (default: 512)")
    p.add_argument("-b", "--batch-size", type=int, default=2048,
                   help="logical batch size; >= 2 chunks evaluates chunks side by side")  # fmt: skip
    add_context_args(p)
    p.add_argument("--chunks", type=int, default=-1, help="max chunks (default: -1 = all)")
    p.add_argument("--chunk", "--from-chunk", dest="from_chunk", type=int, default=0,
                   metavar="N", help="start from chunk N (default: 0)")  # fmt: skip
    p.add_argument("-ofreq", "--output-frequency", type=int, default=10, metavar="N",
                   help="write the output every N chunks (default: 10)")  # fmt: skip
    p.add_argument("--save-frequency", type=int, default=0, metavar="N",
                   help="save a copy (OUTPUT.at_N) every N chunks (default: 0 = never)")  # fmt: skip
    p.add_argument("--output-format", choices=("gguf", "dat"), default="gguf",
                   help="gguf (default) or llama.cpp's legacy dat format")  # fmt: skip
    p.add_argument("--in-file", action="append", default=[], metavar="FNAME",
                   help="an imatrix to add first (repeat, or comma-separated)")  # fmt: skip
    p.add_argument("--process-output", action="store_true",
                   help="collect data for the output tensor too")  # fmt: skip
    p.add_argument("--ppl", dest="ppl", action="store_true", default=True,
                   help="compute perplexity (default)")  # fmt: skip
    p.add_argument("--no-ppl", dest="ppl", action="store_false", help="do not compute perplexity")
    p.add_argument("--show-statistics", action="store_true",
                   help="print the statistics of the one --in-file and exit")  # fmt: skip
    p.add_argument("--parse-special", action="store_true",
                   help="parse special tokens in the text")  # fmt: skip
    p.add_argument("--no-mmap", dest="mmap", action="store_false", help="read, do not map")
    p.add_argument("-v", "--verbose", action="store_true", help="(accepted for compatibility)")
    add_compat_args(p)
    p.set_defaults(func=_imatrix)
