"""``llamacpy perplexity``: llama-perplexity's method and output.

The file's text (one trailing newline removed, no escape processing) is cut into
non-overlapping chunks of ``-c`` tokens; each chunk starts with BOS and its second half is
scored. Progress ``[1]8.1234,[2]7.9876,...`` goes to stdout as chunks finish, followed by
``Final estimate: PPL = X +/- Y``; setup lines go to stderr.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import UsageError
from . import add_compat_args, add_context_args, context_params


def _perplexity(args: argparse.Namespace) -> int:
    from .run import output_begins, reserve_weight_memory, show_compile_progress

    reserve_weight_memory(args.model)
    show_compile_progress(args.command)
    from ..api.model import load_model
    from ..eval.perplexity import n_seq_for, perplexity

    if args.ctx_size <= 0:
        raise UsageError("perplexity needs -c/--ctx-size > 0")
    try:
        text = Path(args.file).read_bytes()
    except OSError as e:
        raise UsageError(f"could not open file '{args.file}' for reading: {e.strerror}") from e
    text = text[:-1] if text.endswith(b"\n") else text
    n_ctx = args.ctx_size
    n_seq = n_seq_for(n_ctx, args.batch_size)
    params = context_params(
        args,
        n_ctx=n_seq * n_ctx,
        n_batch=min(args.batch_size, n_seq * n_ctx),
        n_seq_max=n_seq,
        use_mmap=args.mmap,
    )
    model = load_model(args.model, params)
    ctx = model.ctx
    err, out = sys.stderr, sys.stdout

    def first_pass(seconds: float, n_chunk: int, n_seq: int) -> None:
        output_begins()
        total = int(seconds * n_chunk / n_seq)
        eta = f"{total // 3600} hours " if total >= 3600 else ""
        print(f"perplexity: calculating perplexity over {n_chunk} chunks, n_ctx={n_ctx}, "
              f"batch_size={ctx.n_batch}, n_seq={n_seq}", file=err)  # fmt: skip
        print(f"perplexity: {seconds:.2f} seconds per pass - ETA {eta}"
              f"{(total % 3600) / 60.0:.2f} minutes", file=err)  # fmt: skip

    def chunk(i: int, ppl: float) -> None:
        out.write(f"[{i}]{ppl:.4f},")
        out.flush()

    res = perplexity(ctx, model.tokenizer, text, n_ctx=n_ctx, n_batch=ctx.n_batch,
                     n_chunks=args.chunks, on_chunk=chunk, on_first_pass=first_pass)  # fmt: skip
    output_begins()
    out.write("\n")
    print(f"Final estimate: PPL = {res.ppl:.4f} +/- {res.ppl_err:.5f}", file=out)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "perplexity",
        help="measure perplexity on a text file (like llama-perplexity)",
        description="Perplexity over non-overlapping chunks, second half of each scored.",
    )
    p.add_argument("-m", "--model", required=True, help="model path or registry name")
    p.add_argument("-f", "--file", required=True, help="text file to evaluate")
    p.add_argument("-c", "--ctx-size", type=int, default=512, help="chunk size (default: 512)")
    p.add_argument("-b", "--batch-size", type=int, default=2048,
                   help="logical batch size; >= 2 chunks evaluates chunks in parallel")  # fmt: skip
    add_context_args(p)
    p.add_argument("--chunks", type=int, default=-1, help="max chunks (default: -1 = all)")
    p.add_argument("--no-mmap", dest="mmap", action="store_false", help="read, do not map")
    p.add_argument("-v", "--verbose", action="store_true", help="(accepted for compatibility)")
    add_compat_args(p)
    p.set_defaults(func=_perplexity)
