"""``llamacpy embed``: text embeddings with ``llama-embedding``'s options and output formats.

* ``-p TEXT`` (escapes processed; several prompts separated by ``--embd-separator``, a newline
  by default) or ``-f FILE``; each prompt is tokenized with special tokens parsed and added.
* ``--pooling none|mean|cls|last|rank`` (default: the model's ``{arch}.pooling_type``);
  with ``rank`` (a reranker) each prompt is ``query<TAB>document`` (``--cls-separator``),
  joined as llama-embedding joins it (the EOS and SEP texts the vocabulary adds, or the
  file's rerank template), and the output is ``rerank score i: s`` lines (raw scores);
  ``--embd-normalize N``: -1 none, 0 max-abs (int16 range), 1 taxicab, 2 euclidean (default),
  N > 2 p-norm.
* Output: by default ``embedding i: v v v ...`` lines (``%9.6f``; the whole vector for one
  prompt, 16 values each for several, then a cosine-similarity matrix; with pooling none the
  first and last 3 values of each token); ``--embd-output-format json`` an OpenAI-style
  list, ``json+`` that plus a ``cosineSimilarity`` matrix, ``array`` a bare ``[[...],...]``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

from ..errors import UsageError
from . import add_compat_args
from .tokenize import process_escapes

FORMATS = ("json", "json+", "array")


def _prompts(args: argparse.Namespace) -> list[str]:
    if args.file is not None:
        try:
            data = Path(args.file).read_bytes()
        except OSError as e:
            raise UsageError(f"could not open file '{args.file}' for reading: {e.strerror}") from e
    elif args.prompt is not None:
        data = process_escapes(os.fsencode(args.prompt))
    else:
        raise UsageError("must specify a prompt (-p) or a file (-f)")
    text = data.decode("utf-8", "replace")
    sep = process_escapes(args.embd_separator.encode()).decode("utf-8", "replace")
    return text.split(sep) if sep else [text]


def _rank_prompt(prompt: str, sep: str, tok, template: str | None) -> str:
    """A ``query<sep>document`` prompt as llama-embedding joins it for rank pooling."""
    if sep not in prompt:
        return prompt
    parts = prompt.split(sep)
    if template is not None:
        from ..api.rerank import fill_rerank_template

        return fill_rerank_template(template, parts[0], parts[1])
    v = tok.vocab
    glue = ""
    if v.add_eos and v.id("eos") >= 0:
        glue += tok.token_to_piece(v.id("eos"), True).decode("utf-8", "replace")
    if v.add_sep and v.id("sep") >= 0:
        glue += tok.token_to_piece(v.id("sep"), True).decode("utf-8", "replace")
    return glue.join(parts)


def _fmt(v: float, norm: int, width: bool) -> str:
    if norm == 0:
        return f"{v:6.0f}" if width else f"{v:1.0f}"
    return f"{v:9.6f}" if width else f"{v:1.7f}"


def _run(args: argparse.Namespace) -> int:
    from ..engine import Batch, Context, ContextParams
    from ..engine.embeddings import check_embd_normalize, cosine, normalize, per_token_note
    from ..registry import resolve_model
    from ..tokenizer import Tokenizer

    norm = check_embd_normalize(args.embd_normalize)
    prompts = _prompts(args)
    path = resolve_model(args.model)
    tok = Tokenizer.from_gguf(path)
    n_ctx = args.ctx_size
    params = ContextParams(
        n_ctx=n_ctx,
        n_batch=max(n_ctx, 1),
        n_ubatch=max(n_ctx, 1),
        n_threads=args.threads,
        n_threads_batch=args.threads,
        embeddings=True,
        pooling_type=args.pooling or "unspecified",
    )
    ctx = Context(path, params)
    pooling = ctx.pooling_type
    note = per_token_note(params.pooling_type, getattr(ctx.model, "pooling_type", None))
    if note:
        print(f"llamacpy embed: note: {note}", file=sys.stderr)
    template = None
    if pooling == "rank":
        from ..api.model import ModelInfo
        from ..api.rerank import RERANK_TEMPLATE_KEY

        ctx.rank_head()  # a clear error for a model without a classifier head
        template = ModelInfo.read(path)[0].metadata.get(RERANK_TEMPLATE_KEY)
    rows: list[np.ndarray] = []
    for p in prompts:
        if pooling == "rank":
            p = _rank_prompt(p, args.cls_separator, tok, template)
        ids = tok.encode(p.encode("utf-8"), add_special=True, parse_special=True)
        if len(ids) > ctx.n_batch:
            raise UsageError(
                f"number of tokens in input line ({len(ids)}) exceeds batch size "
                f"({ctx.n_batch}), increase batch size and re-run"
            )
        if not ids:
            raise UsageError(f"prompt {p!r} has no tokens")
        if pooling == "rank":
            rows.append(ctx.embed(ids, "rank"))
            continue
        ctx.kv.clear()
        h = ctx.encode(Batch.from_tokens(ids, logits="none"))
        ctx.kv.clear()
        if pooling == "none":
            rows.extend(normalize(h, norm))
        else:
            from ..engine.embeddings import pool

            rows.append(normalize(pool(h, np.arange(len(ids)), pooling), norm))
    emb = np.array(rows, np.float32)
    out = sys.stdout
    fmt = args.embd_output_format
    if pooling == "rank" and fmt is None:
        labels = ctx.rank_head().labels
        for j, row in enumerate(emb):
            for i, v in enumerate(row):
                tag = "" if len(row) == 1 else f" [{labels[i] if i < len(labels) else i}]"
                out.write(f"rerank score {j}: {v:8.3f}{tag}\n")
    elif fmt is None:
        _print_plain(out, emb, prompts, pooling, norm, cosine)
    else:
        _print_json(out, emb, fmt, norm, len(prompts), cosine)
    out.flush()
    return 0


def _print_plain(out, emb, prompts, pooling, norm, cosine) -> None:
    n = emb.shape[1]
    out.write("\n")
    if pooling == "none":
        for j, row in enumerate(emb):
            head = " ".join(_fmt(v, norm, True) for v in row[: min(3, n)])
            tail = " ".join(_fmt(v, norm, True) for v in row[max(n - 3, 0) :])
            out.write(f"embedding {j}: {head}  ... {tail} \n")
        return
    k = min(16, n) if len(prompts) > 1 else n
    for j, row in enumerate(emb):
        out.write(f"embedding {j}: " + "".join(_fmt(v, norm, True) + " " for v in row[:k]) + "\n")
    if len(prompts) > 1:
        out.write("\ncosine similarity matrix:\n\n")
        out.write("".join(f"{p[:6]:>6} " for p in prompts) + "\n")
        for i, p in enumerate(prompts):
            sims = "".join(f"{cosine(emb[i], emb[j]):6.2f} " for j in range(len(prompts)))
            out.write(sims + p[:10] + "\n")


def _print_json(out, emb, fmt, norm, n_prompts, cosine) -> None:
    arr = fmt == "array"
    vec = ["[" + ",".join(_fmt(v, norm, False) for v in row) + "]" for row in emb]
    if arr:
        out.write("[" + ",".join(vec) + "]\n")
        return
    items = [
        f'    {{\n      "object": "embedding",\n      "index": {j},\n      "embedding": {v}\n    }}'
        for j, v in enumerate(vec)
    ]
    out.write('{\n  "object": "list",\n  "data": [\n' + ",\n".join(items) + "\n  ]")
    if fmt == "json+" and n_prompts > 1:
        lines = ["    [" + ", ".join(f"{cosine(a, b):6.2f}" for b in emb) + " ]" for a in emb]
        out.write(',\n  "cosineSimilarity": [\n' + ",\n".join(lines) + "\n  ]")
    out.write("\n}\n")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "embed",
        help="compute text embeddings (like llama-embedding)",
        description="Embed prompts with a model: pooled (or per-token) hidden states.",
    )
    p.add_argument("-m", "--model", required=True, help="model path or registry name")
    p.add_argument("-p", "--prompt", help="text to embed (several: separated by newlines)")
    p.add_argument("-f", "--file", help="read the prompts from FILE")
    p.add_argument(
        "--pooling",
        choices=("none", "mean", "cls", "last", "rank"),
        help="pooling type (default: the model's; rank: a reranker's scores)",
    )
    p.add_argument(
        "--cls-separator",
        default="\t",
        help="with rank pooling: the separator of a prompt's query and document (default: tab)",
    )
    p.add_argument(
        "--embd-normalize",
        type=int,
        default=2,
        metavar="N",
        help="-1 none, 0 max-abs (int16), 1 taxicab, 2 euclidean (default), >2 p-norm",
    )
    p.add_argument(
        "--embd-output-format",
        choices=FORMATS,
        help="json (OpenAI-style), json+ (with a cosine matrix), array; default: plain text",
    )
    p.add_argument("--embd-separator", default="\n", help="prompt separator (default: newline)")
    p.add_argument("-c", "--ctx-size", type=int, default=4096, help="context size (tokens)")
    p.add_argument("-t", "--threads", type=int, default=0, help="threads (default: cores)")
    add_compat_args(p)
    p.set_defaults(func=_run)
