"""``llamacpy perplexity``: llama-perplexity's method and output.

The file's text (one trailing newline removed, no escape processing) is cut into
non-overlapping chunks of ``-c`` tokens; each chunk starts with BOS and its second half is
scored. Progress ``[1]8.1234,[2]7.9876,...`` goes to stdout as chunks finish, followed by
``Final estimate: PPL = X +/- Y``; setup lines go to stderr.

``--kl-divergence-base FILE`` also writes the log-probabilities in llama-perplexity's format
(``eval/logits_file.py``; atomically). With ``--kl-divergence`` the file is read instead
(checked whole before the model loads; its chunk size and tokens replace ``-f`` and
``-c``'s chunking) and llama-perplexity's KL-divergence table and statistics are printed
(``eval/kld.py``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from ..errors import UsageError
from . import add_compat_args, add_context_args, context_params


def _perplexity(args: argparse.Namespace) -> int:
    from .run import output_begins, reserve_weight_memory, show_compile_progress

    if args.ctx_size <= 0:
        raise UsageError("perplexity needs -c/--ctx-size > 0")
    base = None
    if args.kl_divergence:
        from ..eval.logits_file import LogitsFile

        if not args.kl_divergence_base:
            raise UsageError("--kl-divergence needs --kl-divergence-base FILE (the base "
                             "model's log-probabilities)")  # fmt: skip
        base = LogitsFile(args.kl_divergence_base)  # checked whole before the model loads
        text = b""
    else:
        if not args.file:
            raise UsageError("perplexity needs -f/--file")
        try:
            text = Path(args.file).read_bytes()
        except OSError as e:
            raise UsageError(f"could not open file '{args.file}' for reading: {e.strerror}") from e
        text = text[:-1] if text.endswith(b"\n") else text
        out_dir = Path(args.kl_divergence_base or ".").resolve().parent
        if args.kl_divergence_base and not (out_dir.is_dir() and os.access(out_dir, os.W_OK)):
            raise UsageError(f"cannot write {args.kl_divergence_base}: {out_dir} is not a "
                             "writable directory")  # fmt: skip
    reserve_weight_memory(args.model)
    show_compile_progress(args.command)
    from ..api.model import load_model
    from ..eval.perplexity import PerplexityResult, n_seq_for, perplexity

    n_ctx = args.ctx_size
    n_seq = n_seq_for(n_ctx, args.batch_size)
    n_batch = min(args.batch_size, n_seq * n_ctx)
    n_ctx_total = n_seq * n_ctx
    if base is not None:  # llama-perplexity sizes its context for -c; chunks are the file's
        n_seq_kld = min(n_seq_for(base.n_ctx, n_batch), n_seq)
        n_ctx_total = max(n_ctx_total, n_seq_kld * base.n_ctx)
    params = context_params(args, n_ctx=n_ctx_total, n_batch=n_batch, n_seq_max=n_seq,
                            use_mmap=args.mmap)  # fmt: skip
    model = load_model(args.model, params)
    if base is not None:
        return _kl_divergence(model, base, n_batch, n_seq_kld, output_begins)
    ctx = model.ctx
    err, out = sys.stderr, sys.stdout
    for line in ctx.kv.describe():
        print(line, file=err)

    first_pass = _first_pass("perplexity: calculating perplexity", n_ctx, ctx.n_batch,
                             output_begins)  # fmt: skip

    def chunk(i: int, ppl: float) -> None:
        out.write(f"[{i}]{ppl:.4f},")
        out.flush()

    def run(logits_out: BinaryIO | None) -> PerplexityResult:
        return perplexity(ctx, model.tokenizer, text, n_ctx=n_ctx, n_batch=ctx.n_batch,
                          n_chunks=args.chunks, on_chunk=chunk, on_first_pass=first_pass,
                          logits_out=logits_out)  # fmt: skip

    if args.kl_divergence_base:
        from ..fileio import atomic_write

        print(f"perplexity: saving all logits to {args.kl_divergence_base}", file=err)
        with atomic_write(args.kl_divergence_base) as f:
            res = run(f)
    else:
        res = run(None)
    output_begins()
    out.write("\n")
    print(f"Final estimate: PPL = {res.ppl:.4f} +/- {res.ppl_err:.5f}", file=out)
    return 0


def _first_pass(
    what: str, n_ctx: int, n_batch: int, output_begins: Callable[[], None], then: str = ""
) -> Callable[[float, int, int], None]:
    """llama-perplexity's lines after the first pass: ``what`` over the chunks, the ETA (on
    stderr), then ``then`` on stdout."""

    def first_pass(seconds: float, n_chunk: int, n_seq: int) -> None:
        output_begins()
        name = what.split(":")[0]
        total = int(seconds * n_chunk / n_seq)
        eta = f"{total // 3600} hours " if total >= 3600 else ""
        print(f"{what} over {n_chunk} chunks, n_ctx={n_ctx}, batch_size={n_batch}, "
              f"n_seq={n_seq}\n{name}: {seconds:.2f} seconds per pass - ETA {eta}"
              f"{(total % 3600) / 60.0:.2f} minutes", file=sys.stderr)  # fmt: skip
        if then:
            print(then, file=sys.stdout)

    return first_pass


def _kl_divergence(model: Any, base: Any, n_batch: int, n_seq: int,
                   output_begins: Callable[[], None]) -> int:  # fmt: skip
    from ..eval.kld import CHUNK_HEADER, kl_divergence

    ctx, tok = model.ctx, model.tokenizer
    out = sys.stdout

    first_pass = _first_pass("kl_divergence: computing", base.n_ctx, n_batch, output_begins,
                             f"\n{CHUNK_HEADER}")  # fmt: skip

    def chunk(i: int, stats: Any) -> None:
        print(stats.chunk_line(i), file=out, flush=True)

    stats = kl_divergence(ctx, base, n_batch=n_batch, n_seq=n_seq,
                          bos=tok.bos if tok.add_bos else None, on_chunk=chunk,
                          on_first_pass=first_pass)  # fmt: skip
    output_begins()
    print(file=out)
    for line in stats.report():
        print(line, file=out)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "perplexity",
        help="measure perplexity on a text file (like llama-perplexity)",
        description="Perplexity over non-overlapping chunks, second half of each scored.",
    )
    p.add_argument("-m", "--model", required=True, help="model path or registry name")
    p.add_argument("-f", "--file", help="text file to evaluate (not with --kl-divergence)")
    p.add_argument("-c", "--ctx-size", type=int, default=512, help="chunk size (default: 512)")
    p.add_argument("-b", "--batch-size", type=int, default=2048,
                   help="logical batch size; >= 2 chunks evaluates chunks in parallel")  # fmt: skip
    add_context_args(p)
    p.add_argument("--chunks", type=int, default=-1, help="max chunks (default: -1 = all)")
    p.add_argument("--kl-divergence-base", metavar="FILE",
                   help="write the log-probabilities to FILE (llama-perplexity's format); "
                   "with --kl-divergence: read them from it")  # fmt: skip
    p.add_argument("--kl-divergence", action="store_true",
                   help="KL divergence of this model from the base log-probabilities")  # fmt: skip
    p.add_argument("--no-mmap", dest="mmap", action="store_false", help="read, do not map")
    p.add_argument("-v", "--verbose", action="store_true", help="(accepted for compatibility)")
    add_compat_args(p)
    p.set_defaults(func=_perplexity)
