"""llama.cpp's speculative-decoding flags (``common/arg.cpp``), shared by ``run`` and ``chat``.

``--spec-type`` names the proposer (see :mod:`llamacpy.api.speculative`); ``-md FILE`` alone
means ``draft-simple``. The removed spellings llama.cpp still recognises (``--draft-max``,
``--draft-min``) are accepted as the ``--spec-draft-n-*`` flags they became.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..errors import UsageError


def add_spec_args(p: argparse.ArgumentParser) -> None:
    from ..api.speculative import SPEC_TYPES

    g = p.add_argument_group("speculative decoding")
    g.add_argument("--spec-type", default=None, metavar="TYPE",
                   help=f"proposer: {', '.join(SPEC_TYPES)} (default: none; "
                   "draft-simple with -md)")  # fmt: skip
    g.add_argument(
        "-md",
        "--spec-draft-model",
        "--model-draft",
        dest="model_draft",
        default=None,
        metavar="FNAME",
        help="draft model (same vocabulary)",
    )
    g.add_argument("--spec-draft-n-max", "--draft-max", "--draft", "--draft-n",
                   dest="draft_max", type=int, default=None, metavar="N",
                   help="most tokens a round verifies (default: 3 with a draft model, "
                   "else the n-gram proposer's own maximum)")  # fmt: skip
    g.add_argument("--spec-draft-n-min", "--draft-min", "--draft-n-min", dest="draft_min",
                   type=int, default=0, metavar="N",
                   help="shorter proposals are not verified (default: 0)")  # fmt: skip
    g.add_argument(
        "--spec-draft-p-min",
        "--draft-p-min",
        dest="draft_p_min",
        type=float,
        default=0.0,
        metavar="P",
        help="a draft model stops below this top probability (default: 0.0)",
    )
    g.add_argument(
        "-td",
        "--threads-draft",
        dest="threads_draft",
        type=int,
        default=0,
        help="draft model threads (default: as --threads)",
    )
    g.add_argument(
        "-ctkd",
        "--cache-type-k-draft",
        dest="cache_type_k_draft",
        default=None,
        help="draft model KV cache type of K (default: as -ctk)",
    )
    g.add_argument(
        "-ctvd",
        "--cache-type-v-draft",
        dest="cache_type_v_draft",
        default=None,
        help="draft model KV cache type of V (default: as -ctv)",
    )
    g.add_argument("--spec-no-adapt", dest="spec_adapt", action="store_false",
                   help="verify every proposal instead of choosing the length from the "
                   "measured cost and acceptance")  # fmt: skip
    ngram = [  # (flag, dest, default, help)
        (f"--spec-ngram-{kind}-{what}", f"ngram_{kind.replace('-', '_')}_{dest}", default,
         f"ngram-{kind}: {desc}")
        for kind in ("simple", "map-k", "map-k4v")
        for what, dest, default, desc in (("size-n", "n", 12, "lookup n-gram length"),
                                          ("size-m", "m", 48, "proposal length"),
                                          ("min-hits", "hits", 1, "minimum hits"))
    ] + [
        ("--spec-ngram-mod-n-match", "ngram_mod_match", 24, "ngram-mod: lookup length"),
        ("--spec-ngram-mod-n-min", "ngram_mod_min", 48, "ngram-mod: shortest proposal"),
        ("--spec-ngram-mod-n-max", "ngram_mod_max", 64, "ngram-mod: longest proposal"),
    ]  # fmt: skip
    for flag, dest, default, desc in ngram:
        g.add_argument(flag, dest=dest, type=int, default=default, metavar="N", help=desc)
    g.add_argument(
        "-lcs",
        "--lookup-cache-static",
        default=None,
        metavar="FNAME",
        help="(ngram-cache; not supported yet)",
    )
    g.add_argument(
        "-lcd",
        "--lookup-cache-dynamic",
        default=None,
        metavar="FNAME",
        help="(ngram-cache; not supported yet)",
    )


def check_spec_args(args: argparse.Namespace) -> str:
    """The ``--spec-type`` the flags ask for, after checking them (before any model loads)."""
    kind = args.spec_type or ("draft-simple" if args.model_draft else "none")
    kinds = [k.strip() for k in kind.split(",") if k.strip()]
    if len(kinds) != 1:
        raise UsageError(f"--spec-type {kind!r}: give one type (combinations are not supported)")
    kind = kinds[0]
    if args.lookup_cache_static or args.lookup_cache_dynamic:
        raise UsageError("-lcs/-lcd: the n-gram lookup caches are not supported yet")
    if args.model_draft and kind != "draft-simple":
        raise UsageError(f"-md is a draft model, but --spec-type is {kind}")
    if args.draft_max is not None and args.draft_max < 1:
        raise UsageError(f"--spec-draft-n-max must be at least 1, not {args.draft_max}")
    if args.draft_min < 0:
        raise UsageError(f"--spec-draft-n-min must be at least 0, not {args.draft_min}")
    if not (kind == "draft-simple" and args.model_draft):
        _proposer(args, kind, None)  # (the type's name and settings)
    return kind


def speculator(args: argparse.Namespace, model: Any) -> Any:
    """The :class:`~llamacpy.api.speculative.Speculator` the flags ask for (None: none).
    Loads the draft model, checked against the target's vocabulary."""
    from ..api.speculative import Speculator

    kind = check_spec_args(args)
    if kind == "none":
        return None
    if not model.ctx.can_rewind:
        print(f"llamacpy: {model.info.desc}: its recurrent state cannot drop rejected "
              "proposals; decoding without speculation", file=sys.stderr)  # fmt: skip
        return None
    draft = None
    if kind == "draft-simple" and args.model_draft:
        draft = _load_draft(args, model)
    proposer = _proposer(args, kind, draft)
    return Speculator(proposer, n_min=args.draft_min, adaptive=args.spec_adapt)


def _proposer(args: argparse.Namespace, kind: str, draft: Any) -> Any:
    from ..api.speculative import make_proposer

    n_max = args.draft_max
    proposer = make_proposer(
        kind,
        draft_session=draft,
        draft_n_max=n_max if n_max is not None else 3,
        draft_p_min=args.draft_p_min,
        simple=(args.ngram_simple_n, args.ngram_simple_m),
        map_k=(args.ngram_map_k_n, args.ngram_map_k_m, args.ngram_map_k_hits),
        map_k4v=(args.ngram_map_k4v_n, args.ngram_map_k4v_m, args.ngram_map_k4v_hits),
        mod=(args.ngram_mod_match, args.ngram_mod_max, args.ngram_mod_min),
    )
    if proposer is not None and n_max is not None:
        proposer.n_max = min(proposer.n_max, n_max)
    return proposer


def slot_speculators(args: argparse.Namespace) -> Any:
    """For ``serve``: a factory of one :class:`Speculator` per slot (the slots share one
    cost model), or None. N-gram proposers only: a draft model would need a sequence of
    its own per slot."""
    from ..api.speculative import DecodeCost, Speculator

    kind = check_spec_args(args)
    if kind == "none":
        return None
    if kind == "draft-simple":
        raise UsageError("serve: draft models are not supported yet; use an n-gram --spec-type")

    cost = DecodeCost()

    def factory() -> Any:
        proposer = _proposer(args, kind, None)
        return Speculator(proposer, n_min=args.draft_min, adaptive=args.spec_adapt, cost=cost)

    return factory


def _load_draft(args: argparse.Namespace, target: Any) -> Any:
    from ..api.generation import Session
    from ..api.model import load_model
    from ..api.speculative import check_draft_vocab
    from . import context_params

    params = context_params(
        args,
        n_ctx=target.ctx.n_ctx,
        n_threads=args.threads_draft or args.threads,
        n_threads_batch=args.threads_draft or args.threads_batch or args.threads,
        type_k=args.cache_type_k_draft or args.cache_type_k,
        type_v=args.cache_type_v_draft or args.cache_type_v,
    )
    draft = load_model(args.model_draft, params)
    check_draft_vocab(target.tokenizer, draft.tokenizer)
    if args.verbose:
        print(f"llamacpy: draft model {draft.info.desc} from {draft.info.path}", file=sys.stderr)
    return Session(draft.ctx, draft.tokenizer)
