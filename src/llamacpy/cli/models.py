"""``llamacpy models list | pull NAME | path NAME``."""

from __future__ import annotations

import argparse

from ..registry import ModelRegistry


def _registry(args: argparse.Namespace) -> ModelRegistry:
    if args.cache_dir:
        return ModelRegistry(args.cache_dir)
    return ModelRegistry.from_environment()


def _list(args: argparse.Namespace) -> int:
    reg = _registry(args)
    print(f"{'NAME':<16} {'ARCH':<8} {'SIZE':>9}  {'STATUS':<10} DESCRIPTION")
    for name, spec in reg.models.items():
        status = "pulled" if reg.installed(name) else "-"
        size = f"{spec.size / 1e6:.1f} MB"
        print(f"{name:<16} {spec.architecture:<8} {size:>9}  {status:<10} {spec.description}")
    print(f"\ncache: {reg.model_dir}")
    return 0


def _pull(args: argparse.Namespace) -> int:
    reg = _registry(args)
    for name in args.names:
        print(reg.pull(name, force=args.force))
    return 0


def _path(args: argparse.Namespace) -> int:
    print(_registry(args).path(args.name))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="list, pull and locate named models")
    p.add_argument(
        "--cache-dir",
        help="model cache (default: $LLAMACPY_CACHE, else $XDG_CACHE_HOME/llamacpy)",
    )
    msub = p.add_subparsers(dest="models_command", metavar="ACTION", required=True)
    pl = msub.add_parser("list", help="known models and whether they are pulled")
    pl.set_defaults(func=_list)
    pp = msub.add_parser("pull", help="download, assemble and verify models")
    pp.add_argument("names", nargs="+", metavar="NAME")
    pp.add_argument("--force", action="store_true", help="fetch again even if cached")
    pp.set_defaults(func=_pull)
    pa = msub.add_parser("path", help="print the file path of a pulled model")
    pa.add_argument("name", metavar="NAME")
    pa.set_defaults(func=_path)
