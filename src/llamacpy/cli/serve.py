"""``llamacpy serve``: an OpenAI- and llama-server-compatible HTTP server (llama-server's
flags). The model loads in the background; ``/health`` answers 503 until it is ready."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from ..errors import UsageError
from . import add_compat_args, add_context_args, add_warmup_arg, context_params, non_negative_int
from .run import add_sampling_args, sampling_params
from .spec import add_spec_args, slot_speculators


def _keys(args: argparse.Namespace) -> tuple[str, ...]:
    keys = [k.strip() for k in (args.api_key or "").split(",") if k.strip()]
    if args.api_key_file:
        try:
            lines = Path(args.api_key_file).read_text().splitlines()
        except OSError as e:
            raise UsageError(
                f"cannot read --api-key-file {args.api_key_file}: {e.strerror}"
            ) from None
        keys += [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]
    return tuple(keys)


def _router_models(args: argparse.Namespace) -> dict[str, Path]:
    """``name -> file`` of router mode (no ``-m``), checked; {} with ``-m``."""
    if args.model is not None:
        if args.models_dir or args.models:
            raise UsageError("give -m for one model, or --models-dir / --models for router "
                             "mode, not both")  # fmt: skip
        return {}
    if not (args.models_dir or args.models):
        raise UsageError("give a model with -m, or several with --models-dir DIR and/or "
                         "--models NAMES (router mode)")  # fmt: skip
    if args.models_max < 1:
        raise UsageError(f"--models-max must be at least 1, not {args.models_max}")
    if not 0 <= args.sleep_idle_seconds <= 1e7:
        raise UsageError(f"--sleep-idle-seconds must be >= 0, not {args.sleep_idle_seconds}")
    from ..registry import resolve_model
    from ..server.router import models_in

    models: dict[str, Path] = {}
    if args.models_dir:
        if not os.path.isdir(args.models_dir):
            raise UsageError(f"--models-dir {args.models_dir!r} is not a directory")
        models.update(models_in(args.models_dir))
    for name in (n.strip() for n in (args.models or "").split(",")):
        if name:
            models[name] = Path(resolve_model(name))
    if not models:
        raise UsageError(f"--models-dir {args.models_dir!r} holds no .gguf file")
    return models


def _serve(args: argparse.Namespace) -> int:
    from ..registry import resolve_model
    from ..server import ServerConfig, ServerState, serve
    from .run import show_compile_progress

    if args.parallel < 1:
        raise UsageError(f"--parallel must be at least 1, not {args.parallel}")
    if args.max_queue < 0:
        raise UsageError(f"--max-queue must be >= 0, not {args.max_queue}")
    if args.max_connections < 1:
        raise UsageError(f"--max-connections must be at least 1, not {args.max_connections}")
    if not (args.timeout_headers > 0 and args.timeout_body > 0):
        raise UsageError("--timeout-headers and --timeout-body must be positive")
    if not 0 <= args.drain_seconds <= 3600:
        raise UsageError(f"--drain-seconds must be 0..3600, not {args.drain_seconds}")
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be 0..65535, not {args.port}")
    models = _router_models(args)  # router mode (no -m): the models it serves
    model_path = None if models else resolve_model(args.model)  # fail fast, before listening
    speculators = slot_speculators(args)
    config = ServerConfig(
        host=args.host,
        port=args.port,
        api_keys=_keys(args),
        cors_origins=tuple(o.strip() for o in (args.cors_origins or "").split(",") if o.strip()),
        timeout=float(args.timeout),
        alias=args.alias,
        n_predict=args.n_predict,
        max_body=args.max_body,
        shutdown_timeout=float(args.shutdown_timeout),
        drain_seconds=float(args.drain_seconds),
        timeout_headers=args.timeout_headers,
        timeout_body=args.timeout_body,
        max_connections=args.max_connections,
        metrics=args.metrics,
        slot_save_path=_slot_dir(args.slot_save_path),
        spm_infill=args.spm_infill,
        cache_reuse=args.cache_reuse,
        allowed_hosts=tuple(h.strip() for h in (args.allowed_hosts or "").split(",") if h.strip()),
        reasoning_format=args.reasoning_format,
        reasoning_budget=args.reasoning_budget,
        reasoning_budget_message=args.reasoning_budget_message,
    )
    defaults = sampling_params(args, {})  # the model's defaults fill the rest later
    n_ctx = args.ctx_size or 4096 * args.parallel

    def load(model_path: Path) -> tuple[Any, Any]:
        if args.embedding or args.reranking:
            from ..api import Llama

            pooling = "rank" if args.reranking else args.pooling
            llm = Llama(str(model_path), embedding=True, n_ctx=n_ctx, n_batch=args.batch_size,
                        n_ubatch=args.ubatch_size, n_threads=args.threads or None,
                        pooling_type=pooling, verbose=False)  # fmt: skip
            if pooling == "rank":
                llm._ctx().rank_head()  # a model without a classifier head: a load error
            return None, llm
        from ..api.serving import ServingModel

        params = context_params(args, n_ctx=n_ctx, n_seq_max=args.parallel)
        m = ServingModel.load(str(model_path), params, n_parallel=args.parallel,
                              max_queue=args.max_queue, chat_template=args.chat_template,
                              sampling_defaults=defaults, speculator=speculators)  # fmt: skip
        if not args.no_warmup:  # before the first request: it is not slowed by the kernels
            from ..api.generation import warm_up

            warm_up(m.ctx, m.tokenizer)
        return m, None

    show_compile_progress("serve")
    where = f"http://{args.host}:{args.port}"
    if models:
        from ..server.router import Router

        def make_state(name: str, path: Path) -> ServerState:
            return ServerState(config, loader=lambda: load(path), model_name=name)

        state: Any = Router(
            config,
            models,
            make_state,
            max_loaded=args.models_max,
            autoload=args.models_autoload,
            sleep_idle=args.sleep_idle_seconds,
        )
        print(f"llamacpy serve: listening on {where} (router: {len(models)} model(s), at most "
              f"{args.models_max} loaded, {args.parallel} slot(s) and n_ctx {n_ctx} each)",
              file=sys.stderr, flush=True)  # fmt: skip
    else:
        assert model_path is not None
        state = ServerState(config, loader=lambda: load(model_path),
                            model_name=args.alias or model_path.name)  # fmt: skip
        print(f"llamacpy serve: listening on {where} (model {model_path.name}, "
              f"{args.parallel} slot(s), n_ctx {n_ctx})", file=sys.stderr, flush=True)  # fmt: skip
    serve(state, log_level="info" if args.verbose else "warning",
          access_log=not args.log_disable)  # fmt: skip
    if getattr(state, "load_error", None) is not None:
        print(f"llamacpy serve: error: {state.load_error}", file=sys.stderr)
        return 1
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="OpenAI- and llama-server-compatible HTTP server",
        description="Serve a model over HTTP: OpenAI routes (/v1/chat/completions, "
        "/v1/completions, /v1/models, /v1/embeddings) and llama-server's (/completion, "
        "/tokenize, /health, /props, /slots, /metrics ...), with --parallel slots batched "
        "together.",
    )
    p.add_argument("-m", "--model", default=None,
                   help="model path or registry name (without it: router mode, see "
                   "--models-dir)")  # fmt: skip
    g = p.add_argument_group("router mode (no -m: several models, by the request's 'model')")
    g.add_argument(
        "--models-dir",
        default=None,
        metavar="DIR",
        help="serve the GGUF files of DIR (name: the file name without .gguf)",
    )
    g.add_argument(
        "--models",
        default=None,
        metavar="NAMES",
        help="also serve these registry models (comma-separated)",
    )
    g.add_argument("--models-max", type=int, default=4, metavar="N",
                   help="models loaded at once; the least recently used idle one is "
                   "unloaded to make room (default: 4)")  # fmt: skip
    g.add_argument(
        "--models-autoload",
        dest="models_autoload",
        action="store_true",
        default=True,
        help="load a model on its first request (default)",
    )
    g.add_argument(
        "--no-models-autoload",
        dest="models_autoload",
        action="store_false",
        help="load a model only on POST /models/load, not on its first request",
    )
    g.add_argument(
        "--sleep-idle-seconds",
        type=float,
        default=0.0,
        metavar="S",
        help="unload a model after S seconds without requests (default: 0, never)",
    )
    p.add_argument("-a", "--alias", default=None, help="model name reported to clients")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port (default: 8080)")
    p.add_argument("-c", "--ctx-size", type=int, default=0,
                   help="total context, shared by the slots (default: 4096 per slot)")  # fmt: skip
    p.add_argument("-np", "--parallel", type=int, default=1, help="parallel slots (default: 1)")
    p.add_argument("-b", "--batch-size", type=int, default=2048,
                   help="most tokens decoded per step (default: 2048)")  # fmt: skip
    add_context_args(p)
    add_spec_args(p)
    p.add_argument("-n", "--n-predict", "--predict", dest="n_predict", type=int, default=-1,
                   help="default tokens to predict (default: -1, until EOG or full slot)")  # fmt: skip
    p.add_argument("--api-key", default=None,
                   help="API key(s), comma-separated; clients send 'Authorization: Bearer KEY'"
                   " or 'X-Api-Key: KEY' (/health stays public)")  # fmt: skip
    p.add_argument("--api-key-file", default=None, help="file with one API key per line")
    p.add_argument("--cors-origins", default=None,
                   help="comma-separated origins allowed cross-origin ('*' for any; "
                   "default: none)")  # fmt: skip
    p.add_argument("--allowed-hosts", default=None,
                   help="comma-separated Host header names answered ('*' for any; default: "
                   "localhost, 127.0.0.1 and ::1 on a loopback --host, else any)")  # fmt: skip
    p.add_argument("--timeout", type=float, default=600,
                   help="seconds a request may run (default: 600)")  # fmt: skip
    p.add_argument("--max-queue", type=int, default=64,
                   help="requests that may wait for a free slot; beyond: 429 (default: 64)")  # fmt: skip
    p.add_argument("--max-body", type=int, default=4 << 20,
                   help="largest request body in bytes; beyond: 413 (default: 4 MiB)")  # fmt: skip
    p.add_argument("--timeout-headers", type=float, default=10.0,
                   help="seconds a request line and headers may take to arrive; beyond: 408 "
                   "and the connection is closed (default: 10)")  # fmt: skip
    p.add_argument("--timeout-body", type=float, default=30.0,
                   help="seconds a request body may take to arrive; beyond: 408 (default: 30)")  # fmt: skip
    p.add_argument("--max-connections", type=int, default=100,
                   help="open connections; beyond: 503 and closed (default: 100)")  # fmt: skip
    p.add_argument("--shutdown-timeout", type=float, default=10.0,
                   help="seconds in-flight requests may finish after SIGTERM (default: 10)")  # fmt: skip
    p.add_argument("--drain-seconds", type=float, default=0.0,
                   help="after SIGTERM, answer /health and new requests 503 for this long "
                   "(a load balancer's health checks take the replica out) before stopping "
                   "(default: 0)")  # fmt: skip
    p.add_argument("--embedding", "--embeddings", action="store_true",
                   help="serve embeddings only (/v1/embeddings, /embedding)")  # fmt: skip
    p.add_argument("--pooling", default="unspecified",
                   choices=["unspecified", "none", "mean", "cls", "last", "rank"],
                   help="embedding pooling (default: the model's)")  # fmt: skip
    p.add_argument("--reranking", "--rerank", action="store_true",
                   help="serve a reranker (/rerank, /v1/rerank): --embedding --pooling rank")  # fmt: skip
    p.add_argument("--chat-template", default=None,
                   help="'chatml', a template name stored in the model, or a Jinja template")  # fmt: skip
    p.add_argument("--reasoning-format", default="deepseek",
                   choices=["none", "auto", "deepseek", "deepseek-legacy"],
                   help="chat replies' <think> blocks: 'none' leaves them in the content, the "
                   "others put them in reasoning_content (default: deepseek)")  # fmt: skip
    p.add_argument("--reasoning-budget", type=int, default=-1,
                   help="tokens a chat reply's <think> block may take, then its end is "
                   "forced (-1: no limit, 0: no thinking; default: -1)")  # fmt: skip
    p.add_argument("--reasoning-budget-message", default="",
                   help="text written before the forced end of a reasoning block")  # fmt: skip
    p.add_argument("--cache-reuse", type=non_negative_int, default=0, metavar="N",
                   help="reuse cached chunks of at least N tokens that a new prompt repeats "
                   "after its common prefix, moving them in the cache (requests' "
                   "n_cache_reuse; 0: off; needs a cache that holds every position)")  # fmt: skip
    p.add_argument("--spm-infill", action="store_true",
                   help="/infill: suffix before prefix (SPM order) instead of prefix first")  # fmt: skip
    p.add_argument(
        "--slot-save-path",
        default="",
        metavar="DIR",
        help="directory for POST /slots/{id}?action=save|restore (default: off)",
    )
    p.add_argument("--metrics", action="store_true",
                   help="serve Prometheus metrics on /metrics (default: off, 501)")  # fmt: skip
    p.add_argument("-v", "--verbose", action="store_true", help="log uvicorn's events too")
    p.add_argument("--log-disable", action="store_true",
                   help="no access log (default: one line per request on stderr: client, "
                   "method, path, status, duration, tokens)")  # fmt: skip
    add_sampling_args(p)
    add_warmup_arg(p)
    add_compat_args(p, warmup=False)
    p.set_defaults(func=_serve)


def _slot_dir(path: str) -> str:
    """``--slot-save-path``: an existing, writable directory (checked before the model loads)."""
    if not path:
        return ""
    d = os.path.abspath(path)
    if not os.path.isdir(d):
        raise UsageError(f"--slot-save-path {path!r} is not a directory")
    if not os.access(d, os.W_OK | os.X_OK):
        raise UsageError(f"--slot-save-path {path!r} is not writable")
    return d
