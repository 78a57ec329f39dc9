"""``llamacpy run``: complete a prompt, like ``llama-completion -no-cnv``.

The prompt (as its tokens' text, special tokens shown with ``--special``; not with
``--no-display-prompt``) and then the generated text go to stdout as they are produced, with
a newline at the end (nothing else goes there); at the end llama.cpp's timing lines (load,
prompt eval, eval: ms per token and tokens per second) go to stderr. ``-n -1`` generates
until an end-of-generation token or a full context; a full context ends the run unless
``--context-shift`` is given (then llama.cpp's shift keeps the first ``--keep`` prompt tokens
and drops half of the rest). The sampler flags are llama.cpp's; this module also defines
them for ``llamacpy chat``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from ..errors import LlamacpyError, UsageError
from . import add_compat_args, add_context_args, add_warmup_arg, context_params
from .spec import add_spec_args, check_spec_args

# flag -> (SamplingParams field, type, help)
_SAMPLING_FLAGS: list[tuple[tuple[str, ...], str, type, str]] = [
    (("-s", "--seed"), "seed", int, "RNG seed (default: -1, random)"),
    (("--temp", "--temperature"), "temp", float, "temperature (default: 0.8; <= 0: greedy)"),
    (("--top-k",), "top_k", int, "top-k sampling (default: 40, 0 = disabled)"),
    (("--top-p",), "top_p", float, "top-p sampling (default: 0.95, 1.0 = disabled)"),
    (("--min-p",), "min_p", float, "min-p sampling (default: 0.05, 0.0 = disabled)"),
    (("--typical", "--typical-p"), "typ_p", float, "locally typical sampling (default: 1.0)"),
    (("--top-nsigma", "--top-n-sigma"), "top_n_sigma", float, "top-n-sigma (default: -1)"),
    (("--xtc-probability",), "xtc_probability", float, "XTC probability (default: 0.0)"),
    (("--xtc-threshold",), "xtc_threshold", float, "XTC threshold (default: 0.1)"),
    (("--repeat-last-n",), "penalty_last_n", int, "tokens to penalize (default: 64, -1 = ctx)"),
    (("--repeat-penalty",), "penalty_repeat", float, "repeat penalty (default: 1.0)"),
    (("--presence-penalty",), "penalty_present", float, "presence penalty (default: 0.0)"),
    (("--frequency-penalty",), "penalty_freq", float, "frequency penalty (default: 0.0)"),
    (("--dry-multiplier",), "dry_multiplier", float, "DRY multiplier (default: 0.0)"),
    (("--dry-base",), "dry_base", float, "DRY base (default: 1.75)"),
    (("--dry-allowed-length",), "dry_allowed_length", int, "DRY allowed length (default: 2)"),
    (("--dry-penalty-last-n",), "dry_penalty_last_n", int, "DRY last n (-1 = context size)"),
    (("--dynatemp-range",), "dynatemp_range", float, "dynamic temperature range (default: 0)"),
    (("--dynatemp-exp",), "dynatemp_exponent", float, "dynamic temperature exponent"),
    (("--mirostat",), "mirostat", int, "mirostat: 0 off, 1 v1, 2 v2 (default: 0)"),
    (("--mirostat-lr",), "mirostat_eta", float, "mirostat learning rate eta (default: 0.1)"),
    (("--mirostat-ent",), "mirostat_tau", float, "mirostat target entropy tau (default: 5.0)"),
    (("--adaptive-target",), "adaptive_target", float, "adaptive-p target (default: -1)"),
    (("--adaptive-decay",), "adaptive_decay", float, "adaptive-p decay (default: 0.9)"),
    (("--min-keep",), "min_keep", int, "minimum candidates kept by samplers (default: 0)"),
]


def add_model_args(p: argparse.ArgumentParser, *, n_ctx: int = 0) -> None:
    """Model and context flags shared by run and chat."""
    p.add_argument("-m", "--model", required=True, help="model path or registry name")
    p.add_argument("-c", "--ctx-size", type=int, default=n_ctx,
                   help=f"context size (default: {n_ctx}, 0 = from the model)")  # fmt: skip
    p.add_argument("-b", "--batch-size", type=int, default=2048, help="logical batch size")
    add_context_args(p)
    p.add_argument("--no-mmap", dest="mmap", action="store_false", help="read, do not map")
    p.add_argument("--mlock", action="store_true", help="keep the model in RAM")
    p.add_argument("-v", "--verbose", action="store_true", help="print model/sampler info")


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    """llama.cpp's sampler flags (unset ones take the model's general.sampling.* or the
    llama.cpp defaults)."""
    g = p.add_argument_group("sampling")
    for flags, dest, typ, text in _SAMPLING_FLAGS:
        g.add_argument(*flags, dest=f"s_{dest}", type=typ, default=None, metavar="N", help=text)
    g.add_argument("--samplers", default=None, help="';'-separated sampler names, in order")
    g.add_argument("--sampler-seq", "--sampling-seq", default=None,
                   help="sampler order as characters, e.g. edskypmxt")  # fmt: skip
    g.add_argument("--dry-sequence-breaker", action="append", default=None,
                   help="DRY sequence breaker (repeatable; 'none' for none)")  # fmt: skip
    g.add_argument("-l", "--logit-bias", action="append", default=[],
                   metavar="TOKEN_ID(+/-)BIAS", help="e.g. 15043+1 or 15043-inf")  # fmt: skip
    g.add_argument("--ignore-eos", action="store_true", help="keep generating past EOS")


def add_grammar_args(p: argparse.ArgumentParser) -> None:
    """llama.cpp's grammar flags: output constrained by a GBNF grammar or a JSON schema."""
    g = p.add_argument_group("grammar")
    g.add_argument("--grammar", default=None, metavar="GRAMMAR",
                   help="BNF-like grammar (GBNF) to constrain generations")  # fmt: skip
    g.add_argument(
        "--grammar-file", default=None, metavar="FNAME", help="file to read the grammar from"
    )
    g.add_argument("-j", "--json-schema", default=None, metavar="SCHEMA",
                   help='JSON schema to constrain generations, e.g. \'{"type": "object"}\'')  # fmt: skip
    g.add_argument("-jf", "--json-schema-file", default=None, metavar="FILE",
                   help="file containing a JSON schema to constrain generations")  # fmt: skip


def _read_text(path: str, what: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise UsageError(f"could not open {what} '{path}' for reading: {e.strerror}") from e
    except UnicodeDecodeError as e:
        raise UsageError(f"{what} '{path}' is not UTF-8 text: {e}") from e


def _schema_grammar(schema: str) -> str:
    """The schema's grammar; a part it cannot express is a warning line on stderr."""
    import warnings

    from ..grammar import JsonSchemaWarning, json_schema_to_grammar

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", JsonSchemaWarning)
        text = json_schema_to_grammar(schema)
    for w in caught:
        print(f"llamacpy: warning: {w.message}", file=sys.stderr)
    return text


def grammar_text(args: argparse.Namespace) -> str | None:
    """The grammar the flags give (``--grammar``, ``--grammar-file``, ``-j`` or ``-jf``),
    or None; checked here, before any model loads (``<piece>`` token constraints are
    resolved later, against the model's vocabulary)."""
    given = [f for f, v in (("--grammar", args.grammar), ("--grammar-file", args.grammar_file),
                            ("--json-schema", args.json_schema),
                            ("--json-schema-file", args.json_schema_file)) if v is not None]  # fmt: skip
    if len(given) > 1:
        raise UsageError(f"give one of {', '.join(given)}, not several")
    text = args.grammar or None
    if args.grammar_file is not None:
        text = _read_text(args.grammar_file, "grammar file")
    elif args.json_schema is not None:
        text = _schema_grammar(args.json_schema)
    elif args.json_schema_file is not None:
        text = _schema_grammar(_read_text(args.json_schema_file, "JSON schema file"))
    if text:
        from ..grammar import parse_grammar

        parse_grammar(text, tokenize=lambda piece: [0])
    return text


def with_grammar(chain: Any, text: str | None, tokenizer: Any) -> Any:
    """The chain as llama.cpp's common sampler, constrained by the grammar ``text``."""
    if not text:
        return chain
    from ..grammar import GrammarMatcher, GrammarVocab, parse_grammar
    from ..sampling import CommonSampler

    grammar = parse_grammar(
        text, tokenize=lambda s: tokenizer.encode(s, add_special=False, parse_special=True)
    )
    return CommonSampler(chain, GrammarMatcher(grammar, GrammarVocab.from_tokenizer(tokenizer)))


def _logit_bias(spec: str) -> tuple[int, float]:
    for i in range(1, len(spec)):
        if spec[i] in "+-" and spec[:i].strip().lstrip("-").isdigit():
            try:
                bias = float(spec[i + 1 :])
            except ValueError:
                break
            return int(spec[:i]), -bias if spec[i] == "-" else bias
    raise UsageError(f"--logit-bias {spec!r}: expected TOKEN_ID(+/-)BIAS, e.g. 15043+1")


def sampling_params(args: argparse.Namespace, metadata: Any) -> Any:
    """SamplingParams from the flags the user gave, model defaults for the rest."""
    from ..sampling import SamplingParams, apply_model_defaults

    kw: dict[str, Any] = {}
    for _flags, dest, _typ, _text in _SAMPLING_FLAGS:
        if (v := getattr(args, f"s_{dest}")) is not None:
            kw[dest] = v
    if args.samplers is not None:
        kw["samplers"] = args.samplers
    if args.sampler_seq is not None:
        kw["samplers"] = args.sampler_seq
    if args.dry_sequence_breaker is not None:
        kw["dry_sequence_breakers"] = [b for b in args.dry_sequence_breaker if b != "none"]
    if args.logit_bias:
        kw["logit_bias"] = [_logit_bias(s) for s in args.logit_bias]
    if args.ignore_eos:
        kw["ignore_eos"] = True
    return apply_model_defaults(SamplingParams.create(**kw), metadata)


def sampler_chain(params: Any, tokenizer: Any, n_ctx: int) -> Any:
    from ..sampling import build_sampler_chain, dry_sequence_breakers

    breakers = None
    if params.dry_multiplier != 0.0 and params.dry_sequence_breakers:
        breakers = dry_sequence_breakers(
            params.dry_sequence_breakers,
            tokenizer.n_vocab,
            lambda t: tokenizer.token_to_piece(t, special=True),
            lambda b: tokenizer.encode(b, add_special=False, parse_special=False),
        )
    return build_sampler_chain(params, tokenizer.n_vocab, n_ctx=n_ctx,
                               dry_seq_breakers=breakers, eog_tokens=tokenizer.eog)  # fmt: skip


def show_compile_progress(command: str) -> None:
    """A progress line on stderr while kernels compile (a first run; see
    :mod:`llamacpy.kernel_progress`); the command calls :func:`output_begins` before its
    first output."""
    from ..kernel_progress import show_compile_progress as show

    show(command)


def output_begins() -> None:
    """The command's own output starts: the compile progress line gives way to it."""
    from ..kernel_progress import finish_compile_progress

    finish_compile_progress()


def reserve_weight_memory(model: str) -> None:
    """Have the weights' memory faulted in while the engine is imported (a model file
    already on disk: its size is about the repacked weights'; see ``_startup``)."""
    from .. import _startup
    from ..registry import ModelRegistry

    try:
        path = model
        if not os.path.isfile(path):
            registry = ModelRegistry.from_environment()
            path = registry.installed(model) if model in registry.models else None
        if path and os.path.isfile(path):
            _startup.reserve_memory(_startup.weight_bytes_estimate(path))
    except (LlamacpyError, OSError, ValueError):
        pass  # the load reports what is wrong with the model argument


def load(args: argparse.Namespace) -> Any:
    """The model and context the flags describe (:class:`llamacpy.api.LoadedModel`)."""
    reserve_weight_memory(args.model)
    show_compile_progress(args.command)
    from ..api.model import load_model

    params = context_params(args, use_mmap=args.mmap, use_mlock=args.mlock)
    model = load_model(args.model, params)
    if not getattr(args, "no_warmup", True):
        from ..api.generation import warm_up

        warm_up(model.ctx, model.tokenizer)
    if args.verbose:
        ctx = model.ctx
        print(f"llamacpy: {model.info.desc} from {model.info.path}: n_ctx = {ctx.n_ctx}, "
              f"n_batch = {ctx.n_batch}, n_ubatch = {ctx.n_ubatch}, n_threads = "
              f"{ctx.n_threads}/{ctx.n_threads_batch}", file=sys.stderr)  # fmt: skip
    return model


def _read_prompt(args: argparse.Namespace) -> bytes:
    from .tokenize import process_escapes

    if args.file is not None:
        try:
            data = Path(args.file).read_bytes()
        except OSError as e:
            raise UsageError(f"could not open file '{args.file}' for reading: {e.strerror}") from e
        data = data[:-1] if data.endswith(b"\n") else data
    else:
        data = os.fsencode(args.prompt or "")
    return process_escapes(data) if args.escape else data


def _run(args: argparse.Namespace) -> int:
    if args.file is None and args.prompt is None:
        raise UsageError("give a prompt with -p PROMPT or -f FILE")
    if args.n_predict < -2:
        raise UsageError(f"-n/--predict must be -1 (until end of generation), -2 (until the "
                         f"context is full) or >= 0, not {args.n_predict}")  # fmt: skip
    prompt = _read_prompt(args)
    grammar = grammar_text(args)
    check_spec_args(args)
    model = load(args)  # (first: the weights are copied while the rest is imported)
    from ..api.generation import ContextOverflowError, GenerationConfig, Session

    tok, ctx = model.tokenizer, model.ctx
    tokens = tok.encode(prompt, add_special=True, parse_special=True)
    if not tokens:
        if not tok.add_bos:
            raise UsageError("the prompt is empty")
        tokens = [tok.bos]
    if len(tokens) > ctx.n_ctx - 4:
        raise ContextOverflowError(
            f"the prompt is too long: {len(tokens)} tokens, but the context holds "
            f"n_ctx = {ctx.n_ctx} (at most {ctx.n_ctx - 4} prompt tokens); use a larger -c"
        )
    params = sampling_params(args, model.info.metadata)
    chain = with_grammar(sampler_chain(params, tok, ctx.n_ctx), grammar, tok)
    if args.verbose:
        print(f"llamacpy: sampler chain: {chain!r}", file=sys.stderr)
    n_keep = args.keep
    if n_keep < 0 or n_keep > len(tokens):
        n_keep = len(tokens)
    else:
        n_keep += int(tok.add_bos)  # always keep the BOS token
    session = Session(ctx, tok)
    session.timings.t_load = model.load_time
    from .spec import speculator

    config = GenerationConfig(
        speculator=speculator(args, model),
        max_tokens=args.n_predict if args.n_predict >= 0 else -1,
        stop=[s for s in args.reverse_prompt if s],
        stop_at_eog=not params.ignore_eos,
        accept_prompt=True,
        context_shift=args.context_shift and args.n_predict != -2,
        n_keep=n_keep,
        special=args.special,
    )
    out = sys.stdout
    # the prompt is shown once it has been read, as llama-completion does (a first run's
    # kernel compile progress then ends before it instead of breaking into it)
    pending = ""
    if args.display_prompt:
        shown = b"".join(tok.token_to_piece(t, special=args.special) for t in tokens)
        pending = shown.decode("utf-8", errors="replace")
    gen = session.generate(tokens, chain, config)
    code = 0
    try:
        for step in gen:
            if step.text or pending:
                output_begins()
                out.write(pending + step.text)
                out.flush()
                pending = ""
    except KeyboardInterrupt:
        gen.close()
        code = 130
    output_begins()
    out.write(pending + "\n")
    out.flush()
    if gen.stop_cause == "context" and args.n_predict != -2:
        print("\nllamacpy: context full, stopping (use --context-shift to continue)",
              file=sys.stderr)  # fmt: skip
    print(file=sys.stderr)
    print(session.timings.report(), file=sys.stderr)
    return code


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="complete a prompt (like llama-completion)",
        description="Generate text from a prompt; the text goes to stdout, timings to stderr.",
    )
    add_model_args(p)
    add_spec_args(p)
    p.add_argument("-p", "--prompt", help="prompt text")
    p.add_argument("-f", "--file", help="read the prompt from FILE")
    p.add_argument("-n", "--predict", "--n-predict", dest="n_predict", type=int, default=-1,
                   help="tokens to generate (default: -1 = until end of generation or full "
                   "context; -2 = until the context is full)")  # fmt: skip
    p.add_argument("--keep", type=int, default=0,
                   help="prompt tokens kept by a context shift (default: 0, -1 = all)")  # fmt: skip
    p.add_argument("--context-shift", dest="context_shift", action="store_true", default=False,
                   help="shift the context instead of stopping when it is full")  # fmt: skip
    p.add_argument("--no-context-shift", dest="context_shift", action="store_false")
    p.add_argument("-r", "--reverse-prompt", action="append", default=[],
                   help="stop when this text is generated (repeatable; not printed)")  # fmt: skip
    p.add_argument("-sp", "--special", action="store_true", help="print special tokens")
    p.add_argument("--display-prompt", dest="display_prompt", action="store_true", default=True,
                   help="print the prompt before the generated text (default)")  # fmt: skip
    p.add_argument("--no-display-prompt", dest="display_prompt", action="store_false",
                   help="print only the generated text")  # fmt: skip
    p.add_argument("-e", "--escape", dest="escape", action="store_true", default=True,
                   help="process escapes (\\n, \\t, ...) in the prompt (default)")  # fmt: skip
    p.add_argument("--no-escape", dest="escape", action="store_false")
    add_sampling_args(p)
    add_grammar_args(p)
    add_warmup_arg(p)
    add_compat_args(p, conversation=True, warmup=False)
    p.set_defaults(func=_run)
