"""``llamacpy gguf dump | set | rename-tensor | split | merge``: inspect and edit GGUF files.

Input files (FILE, IN, FIRST_SHARD) may be a path or a registry model name.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from . import byte_size, positive_int


def _resolve(name_or_path: str) -> Path:
    """A model argument as a file: an existing path, or a registry name."""
    try:
        from ..registry import resolve_model
    except ImportError:  # registry not available: plain paths only
        return Path(name_or_path)
    return resolve_model(name_or_path)


def _safe_stdout() -> None:
    """Never die on a character the terminal's encoding cannot show (vocabularies have many)."""
    with contextlib.suppress(AttributeError, ValueError):
        sys.stdout.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]


# --------------------------------------------------------------------------- handlers
def _dump(args: argparse.Namespace) -> int:
    from ..gguf.dump import dump_lines, to_json

    path = _resolve(args.file)
    _safe_stdout()
    if args.json:
        print(to_json(path, tensors=not args.no_tensors))
    else:
        for line in dump_lines(path, tensors=not args.no_tensors):
            print(line)
    return 0


def _set(args: argparse.Namespace) -> int:
    from ..gguf.dump import format_value, type_label
    from ..gguf.edit import set_metadata

    changes = set_metadata(_resolve(args.input), args.output, args.assignments)
    _safe_stdout()
    for c in changes:
        what = "replaced" if c.old is not None else "added"
        print(f"{what} {c.key}: {type_label(c.new)} = {format_value(c.new)}")
    print(f"wrote {args.output}")
    return 0


def _rename(args: argparse.Namespace) -> int:
    from ..gguf.edit import rename_tensors

    renames = rename_tensors(_resolve(args.input), args.output, args.pattern, args.replacement)
    _safe_stdout()
    for old, new in renames:
        print(f"{old} -> {new}")
    print(f"wrote {args.output} ({len(renames)} tensor(s) renamed)")
    return 0


def _split(args: argparse.Namespace) -> int:
    from ..gguf.split import GGUFModelFile, plan_split, split_gguf

    path = _resolve(args.input)
    max_tensors = args.split_max_tensors
    if max_tensors is None and args.split_max_size is None:
        max_tensors = 128
    with GGUFModelFile(path) as model:
        plans = plan_split(
            model,
            args.out_prefix,
            max_tensors=max_tensors,
            max_size=args.split_max_size,
            no_tensor_first_split=args.no_tensor_first_split,
        )
    print(f"n_split: {len(plans)}")
    for i, p in enumerate(plans):
        print(
            f"split {i + 1:05d}: n_tensors = {len(p.tensors)}, "
            f"total_size = {p.size / 1e6:.2f}M, {p.path}"
        )
    sys.stdout.flush()
    outs = split_gguf(
        path,
        args.out_prefix,
        max_tensors=max_tensors,
        max_size=args.split_max_size,
        no_tensor_first_split=args.no_tensor_first_split,
        dry_run=args.dry_run,
    )
    if args.dry_run:
        print("dry run: nothing written")
    else:
        n = sum(len(p.tensors) for p in plans)
        print(f"wrote {len(outs)} shard(s) with a total of {n} tensors")
    return 0


def _merge(args: argparse.Namespace) -> int:
    from ..gguf.split import merge_gguf, shard_paths

    first = _resolve(args.first_shard)
    n = len(shard_paths(first))
    out = merge_gguf(first, args.output)
    print(f"merged {n} shard(s) into {out}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "gguf",
        help="inspect and edit GGUF files: dump, set, rename-tensor, split, merge",
        description="Inspect and edit GGUF files. Input files may be paths or model names.",
    )
    # nested parsers are of the same class as ``p`` (the CLI's one-line-error parser)
    gsub = p.add_subparsers(dest="gguf_command", metavar="ACTION", required=True)

    d = gsub.add_parser("dump", help="show metadata and tensors")
    d.add_argument("file", metavar="FILE", help="GGUF file (first shard of a split model) or name")
    d.add_argument("--json", action="store_true", help="complete, machine-readable JSON")
    d.add_argument("--no-tensors", action="store_true", help="omit the tensor table")
    d.set_defaults(func=_dump)

    s = gsub.add_parser(
        "set",
        help="set metadata keys (written to a new file; OUT may equal IN)",
        description=(
            "Set metadata keys. Each assignment is KEY=TYPE:VALUE with TYPE int, float, bool "
            "(true/false/1/0), str, or an explicit width u8, i8, u16, i16, u32, i32, u64, i64, "
            "f32, f64. A replaced key keeps its position, and for int/float its on-disk type; "
            "new keys are appended."
        ),
    )
    s.add_argument("input", metavar="IN")
    s.add_argument("output", metavar="OUT")
    s.add_argument("assignments", metavar="KEY=TYPE:VALUE", nargs="+")
    s.set_defaults(func=_set)

    r = gsub.add_parser(
        "rename-tensor",
        help="rename tensors with a regular expression (OUT may equal IN)",
        description="Rename every tensor whose name matches PATTERN (Python re.sub syntax).",
    )
    r.add_argument("input", metavar="IN")
    r.add_argument("output", metavar="OUT")
    r.add_argument("pattern", metavar="PATTERN")
    r.add_argument("replacement", metavar="REPLACEMENT")
    r.set_defaults(func=_rename)

    sp = gsub.add_parser(
        "split",
        help="split a model into OUT_PREFIX-0000i-of-0000n.gguf shards",
        description=(
            "Split a model into shards as llama.cpp's gguf-split does. The first shard holds "
            "all metadata; each shard has split.no, split.count and split.tensors.count."
        ),
    )
    sp.add_argument("input", metavar="IN")
    sp.add_argument("out_prefix", metavar="OUT_PREFIX")
    mode = sp.add_mutually_exclusive_group()
    mode.add_argument(
        "--split-max-tensors",
        type=positive_int,
        metavar="N",
        help="at most N tensors per shard (default: 128)",
    )
    mode.add_argument(
        "--split-max-size",
        type=byte_size,
        metavar="SIZE",
        help="at most SIZE bytes per shard file, e.g. 500M or 2G (decimal units)",
    )
    sp.add_argument(
        "--no-tensor-first-split",
        action="store_true",
        help="put only metadata in the first shard",
    )
    sp.add_argument("--dry-run", action="store_true", help="print the plan, write nothing")
    sp.set_defaults(func=_split)

    m = gsub.add_parser(
        "merge",
        help="merge a split model into one file",
        description="Merge the shards of a split model (give the first one) into one file.",
    )
    m.add_argument("first_shard", metavar="FIRST_SHARD")
    m.add_argument("output", metavar="OUT")
    m.set_defaults(func=_merge)
