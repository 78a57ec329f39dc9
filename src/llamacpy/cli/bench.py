"""``llamacpy bench``: throughput tests with llama-bench's flags, semantics and output.

``-p 512 -n 128 -r 5`` runs a pp512 and a tg128 test, each warmed up once and repeated 5
times with the KV cache cleared, and prints mean ± standard deviation of tokens/s. Several
values may be given comma-separated (``-p 64,512 -t 1,2``). ``-d 4096`` runs each test
after 4096 tokens already in the cache (decoded once, untimed; llama-bench's ``pp512 @
d4096``). ``-o md|csv|json|jsonl`` selects the output format (markdown by default; ``-oe``
also prints one to stderr).
"""

from __future__ import annotations

import argparse
import sys

from ..errors import UsageError
from . import add_compat_args

FORMATS = ("md", "csv", "json", "jsonl", "none")


def _ints(text: str) -> list[int]:
    """``1,2,4`` or ``first-last`` or ``first-last+step`` (llama-bench's lists and ranges)."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        try:
            if "-" in part[1:]:
                a, rest = part[0] + part[1:].split("-", 1)[0], part[1:].split("-", 1)[1]
                step = 1
                if "+" in rest:
                    rest, s = rest.split("+", 1)
                    step = int(s)
                out.extend(range(int(a), int(rest) + 1, max(step, 1)))
            else:
                out.append(int(part))
        except ValueError:
            raise UsageError(f"invalid number list {text!r}") from None
    return out


_FA = {"on": 1, "enabled": 1, "true": 1, "1": 1, "off": 0, "disabled": 0, "false": 0, "0": 0,
       "auto": -1, "-1": -1}  # fmt: skip


def _fa(text: str) -> list[int]:
    """llama-bench's ``-fa on|off|auto`` list. Attention always runs ggml's flash-attention
    numerics here, so the value is reported, not acted on."""
    out = []
    for v in text.split(","):
        if v.strip() not in _FA:
            raise UsageError(f"-fa {text!r}: expected on, off or auto (comma-separated)")
        out.append(_FA[v.strip()])
    return out


def _pairs(text: str) -> tuple[int, int]:
    try:
        a, b = text.split(",")
        return int(a), int(b)
    except ValueError:
        raise UsageError(f"-pg {text!r}: expected PP,TG") from None


class _Printer:
    def __init__(self, fmt: str, out, tests) -> None:
        from ..eval import bench

        self.fmt, self.out, self.b = fmt, out, bench
        self.fields = bench.md_fields(tests)
        self.results = []

    def header(self) -> None:
        if self.fmt == "md":
            print(self.b.format_md_header(self.fields), file=self.out)
        elif self.fmt == "csv":
            print(self.b.format_csv_header(), file=self.out)

    def result(self, r) -> None:
        self.results.append(r)
        if self.fmt == "md":
            print(self.b.format_md_row(self.fields, r), file=self.out)
        elif self.fmt == "csv":
            print(self.b.format_csv(r), file=self.out)
        elif self.fmt == "jsonl":
            print(self.b.format_jsonl(r), file=self.out)
        self.out.flush()

    def footer(self) -> None:
        from .. import __version__

        if self.fmt == "md":
            print(f"\nbuild: llamacpy ({__version__})", file=self.out)
        elif self.fmt == "json":
            print(self.b.format_json(self.results), file=self.out)


def _bench(args: argparse.Namespace) -> int:
    from ..eval.bench import Bench, expand_tests
    from .run import output_begins, show_compile_progress

    for name in ("output", "output_err"):
        if getattr(args, name) not in FORMATS:
            raise UsageError(f"-o {getattr(args, name)}: choose one of {', '.join(FORMATS)}")
    if args.repetitions < 1:
        raise UsageError(f"-r {args.repetitions}: need at least one repetition")
    tests = expand_tests(
        _ints(args.n_prompt), _ints(args.n_gen), [_pairs(p) for p in args.pg],
        _ints(args.batch_size), _ints(args.ubatch_size), _ints(args.threads),
        args.cache_type_k.split(","), args.cache_type_v.split(","), _ints(args.n_depth),
        _fa(args.flash_attn),
    )  # fmt: skip
    if not tests:
        raise UsageError("no tests: give -p, -n or -pg with a positive count")
    if any(t.n_depth < 0 for t in tests):
        raise UsageError(f"-d {args.n_depth}: the depth must be >= 0")
    progress = (lambda m: print(f"llamacpy bench: {m}", file=sys.stderr)) if args.progress else None
    show_compile_progress("bench")
    bench = Bench(args.model, use_mmap=args.mmap, progress=progress)
    printers = [_Printer(args.output, sys.stdout, tests)]
    if args.output_err != "none":
        printers.append(_Printer(args.output_err, sys.stderr, tests))
    for p in printers:
        if p.fmt != "none":
            p.header()
    for t in tests:
        r = bench.run(t, reps=args.repetitions, warmup=not args.no_warmup)
        output_begins()
        for p in printers:
            p.result(r)
    for p in printers:
        p.footer()
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="measure prompt and generation speed (like llama-bench)",
        description="Benchmark prompt processing (pp) and text generation (tg) throughput.",
    )
    p.add_argument("-m", "--model", required=True, help="model path or registry name")
    p.add_argument("-p", "--n-prompt", default="512", help="prompt tokens (default: 512)")
    p.add_argument("-n", "--n-gen", default="128", help="generated tokens (default: 128)")
    p.add_argument("-pg", action="append", default=[], metavar="PP,TG",
                   help="a combined prompt + generation test")  # fmt: skip
    p.add_argument("-d", "--n-depth", default="0",
                   help="tokens already in the cache before each test (default: 0)")  # fmt: skip
    p.add_argument("-fa", "--flash-attn", default="auto",
                   help="on|off|auto, reported only: attention always uses flash-attention "
                   "numerics (default: auto)")  # fmt: skip
    p.add_argument("-r", "--repetitions", type=int, default=5, help="repetitions (default: 5)")
    p.add_argument("-t", "--threads", default="0", help="threads (default: physical cores)")
    p.add_argument("-b", "--batch-size", default="2048", help="logical batch size")
    p.add_argument("-ub", "--ubatch-size", default="512", help="physical batch size")
    p.add_argument("-ctk", "--cache-type-k", default="f16", help="KV cache type of K")
    p.add_argument("-ctv", "--cache-type-v", default="f16", help="KV cache type of V")
    p.add_argument("-o", "--output", default="md", help=f"stdout format: {'|'.join(FORMATS)}")
    p.add_argument("-oe", "--output-err", default="none", help="stderr format (default: none)")
    p.add_argument("--no-warmup", action="store_true", help="skip the warm-up runs")
    p.add_argument("--progress", action="store_true", help="print progress to stderr")
    p.add_argument("--no-mmap", dest="mmap", action="store_false", help="read, do not map")
    p.add_argument("-v", "--verbose", action="store_true", help="(accepted for compatibility)")
    add_compat_args(p, flash_attn=False, warmup=False)
    p.set_defaults(func=_bench)
