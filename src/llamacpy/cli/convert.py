"""``llamacpy convert HF_DIR``: a Hugging Face checkpoint to GGUF (convert_hf_to_gguf.py).

Supported: Llama/Mistral, Qwen2, Qwen3, Gemma 3, Phi-3 and BERT safetensors checkpoints.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from ..errors import UsageError
from . import add_output_args, byte_size, positive_int

OUTTYPES = ("f32", "f16", "bf16", "q8_0", "auto")


def _shape(shape: tuple[int, ...]) -> str:
    return "{" + ", ".join(str(d) for d in shape) + "}"


def _run(args: argparse.Namespace) -> int:
    from ..convert import ConvertOptions, convert

    if args.vocab_only and (args.split_max_size or args.split_max_tensors):
        raise UsageError("--vocab-only writes no tensors: --split-max-* do not apply")
    opts = ConvertOptions(
        model_dir=Path(args.model),
        outfile=Path(args.outfile) if args.outfile else None,
        outtype=args.outtype,
        vocab_only=args.vocab_only,
        model_name=args.model_name,
        metadata=Path(args.metadata) if args.metadata else None,
        split_max_size=args.split_max_size,
        split_max_tensors=args.split_max_tensors,
        no_tensor_first_split=args.no_tensor_first_split,
        dry_run=args.dry_run,
    )
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="llamacpy: %(levelname)s: %(message)s",
        stream=sys.stderr,
    )
    bar = None
    if not args.quiet and not args.dry_run and sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(total=0, unit="B", unit_scale=True, desc="convert", leave=False,
                   dynamic_ncols=True)  # fmt: skip

    def on_tensor(t) -> None:
        if bar is not None:
            bar.total += t.nbytes
        if args.verbose or args.dry_run:
            src = t.planned.data.dtype.name
            print(f"{t.name + ',':<40} {src} --> {t.type.name}, shape = {_shape(t.ggml_shape)}")

    def progress(name: str, nbytes: int) -> None:
        if bar is not None:
            bar.update(nbytes)

    try:
        result = convert(opts, progress=progress, on_tensor=on_tensor)
    finally:
        if bar is not None:
            bar.close()
    print(f"architecture: {result.arch} ({result.hf_arch}), file type {result.ftype.name}, "
          f"{len(result.tensors)} tensors, {result.total_params:,} parameters")  # fmt: skip
    for s in result.shards:
        size = s.nbytes / 1e6
        print(f"{s.path}: {len(s.tensors)} tensors, {size:.1f}M of tensor data")
    if result.dry_run:
        print("dry run: nothing written")
    else:
        print(f"wrote {len(result.shards)} file(s)")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "convert",
        help="convert a Hugging Face model directory to GGUF (convert_hf_to_gguf.py)",
        description=(
            "Convert a Hugging Face checkpoint directory (config.json, *.safetensors, tokenizer "
            "files) to GGUF exactly as llama.cpp's convert_hf_to_gguf.py does. Tensors are "
            "streamed one at a time and the output appears atomically. Architectures: "
            "Llama, Mistral, Qwen2, Qwen3, Gemma 3 (text), Phi-3, BERT."
        ),
    )
    p.add_argument("model", metavar="HF_DIR", help="the model directory")
    p.add_argument(
        "--outfile",
        metavar="F",
        help="output file or directory; {ftype} in the name becomes the output type "
        "(default: a name from the model's metadata, in HF_DIR)",
    )
    p.add_argument(
        "--outtype",
        choices=OUTTYPES,
        default="auto",
        help="f32, f16, bf16, q8_0, or auto: bf16/f16 as the checkpoint stores its weights "
        "(default: auto)",
    )
    p.add_argument("--vocab-only", action="store_true", help="write only the vocabulary")
    p.add_argument("--model-name", metavar="NAME", help="general.name of the model")
    p.add_argument(
        "--metadata",
        metavar="FILE",
        help="JSON file overriding general.* metadata (e.g. general.author, general.tags)",
    )
    split = p.add_mutually_exclusive_group()
    split.add_argument(
        "--split-max-size",
        type=byte_size,
        metavar="SIZE",
        help="split into shards of at most SIZE tensor bytes, e.g. 500M or 2G",
    )
    split.add_argument(
        "--split-max-tensors", type=positive_int, metavar="N", help="at most N tensors per shard"
    )
    p.add_argument(
        "--no-tensor-first-split",
        action="store_true",
        help="keep the first shard free of tensors (metadata only)",
    )
    add_output_args(p, "show the tensors and the output file(s) without writing anything")
    p.set_defaults(func=_run)
